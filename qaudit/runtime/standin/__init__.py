"""What stands in for upstream's CUDA-only pieces on a CPU: one room, three users.

The cross-check's worker (qaudit/crosscheck/), the te runtime on a CPU (`--runtime te`,
qaudit/runtime/te.py) and `qaudit guard --cpu` (qaudit/guard/cpu.py) all run the user's
Transformer Engine or Megatron code in a process without a GPU; what that code needs and
cannot get from a CPU build of torch lives here, and only here (docs/design.md):

- te_python.py: TE's own Python booted on the kernel stand-in (kernels.py, storage.py,
  optimizer_kernels.py: `transformer_engine_torch` in PyTorch; host.py: torch posing as a
  CUDA build);
- te_package.py: qaudit's own stand-in `transformer_engine` package, where no TE is
  importable (gemm.py: its GEMM and APEX's fused wgrad kernel);
- mamba.py: `mamba_ssm` and `causal_conv1d` in PyTorch;
- side.py: which TE a process runs the user's Megatron on (`decide`);
- boot.py: the one boot entry, `enter`, that every user calls (TE alone for the te
  runtime; with `megatron`, what Megatron needs before and inside its own modules);
- environ_vars.py: environment switches set around one upstream call.

Nothing here imports the cross-check, the guard or the commands (tests/test_architecture.py).
"""
