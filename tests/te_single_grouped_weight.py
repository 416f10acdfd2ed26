"""TE's own GroupedLinear on qaudit's CPU kernel stand-in, without the guard: does a single
grouped weight parameter get a weight gradient? (TE issue #3234, rule QA050.)

Run as a script in a process whose sys.path holds one TE release's Python:
`python tests/te_single_grouped_weight.py OUT.json`. For grouped experts with fused wgrad
accumulation it runs one forward and backward with per-expert weights (the control) and
with one grouped weight (`single_grouped_weight=True`), and writes, per layout, whether
main_grad was written, whether .grad was set, whether the input got its gradient, and
whether what main_grad holds is the weight gradient computed here by hand. Releases whose
GroupedLinear has `use_grouped_tensor` (2.19+) run their grouped-tensor path (the only one
that takes a single grouped weight): BF16, split sizes posed on the device, and the stand-in's
grouped-tensor GEMM (QAUDIT_TE_CPU_GROUPED_GEMM=1). tests/test_te_single_grouped_weight.py
runs it per fetched release.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# TE 2.15+ turn single_grouped_weight off without it (utils.resolve_grouped_linear_single_param_flags).
os.environ["NVTE_GROUPED_LINEAR_SINGLE_PARAM"] = "1"
os.environ["QAUDIT_TE_CPU_GROUPED_GEMM"] = "1"

import torch  # noqa: E402

from qaudit.runtime import select_runtime  # noqa: E402

EXPERTS, WIDTH, ROWS = 2, 16, 8


def run(runtime, single: bool) -> dict:
    import inspect

    from qaudit.runtime.standin.host import on_posed_device

    import transformer_engine.pytorch as te  # booted on the stand-in by select_runtime

    cls = te.GroupedLinear  # TE's own class, called as Megatron's TEGroupedLinear calls it
    grouped_tensor = "use_grouped_tensor" in inspect.signature(cls.__init__).parameters
    # The grouped-tensor path takes BF16/FP16 only (cuBLASLt's grouped GEMM has no FP32).
    dtype = torch.bfloat16 if grouped_tensor else torch.float32
    extra = {"use_grouped_tensor": True} if grouped_tensor else {}
    module = cls(EXPERTS, WIDTH, WIDTH, fuse_wgrad_accumulation=True, bias=False,
                 params_dtype=dtype, device=runtime.device, single_grouped_weight=single,
                 **extra)
    weights = [p for name, p in module.named_parameters() if name.startswith("weight")]
    for weight in weights:
        weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32)
        weight.grad_added_to_main_grad = False
    x = torch.randn(ROWS, WIDTH, dtype=dtype, requires_grad=True)
    splits = [ROWS // EXPERTS] * EXPERTS
    if grouped_tensor:
        splits = on_posed_device(torch.tensor(splits, dtype=torch.int64))
    module(x, splits, is_first_microbatch=None).float().sum().backward()
    # d(sum)/dW_e = ones^T x_e: every row of expert e's gradient is its rows' column sums.
    rows = x.detach().float().view(EXPERTS, ROWS // EXPERTS, WIDTH).sum(1)
    expected = rows[:, None, :].expand(EXPERTS, WIDTH, WIDTH)
    written = torch.stack([g for w in weights for g in w.main_grad.view(-1, WIDTH, WIDTH)])
    return {"parameters": len(weights),
            "main_grad_written": all(bool(w.main_grad.abs().sum() > 0) for w in weights),
            "main_grad_is_the_gradient": bool(torch.allclose(written, expected, rtol=2e-2,
                                                             atol=2e-2)),
            "grad_set": all(w.grad is not None for w in weights),
            "input_grad": x.grad is not None}


def main(argv: list[str]) -> int:
    runtime = select_runtime("te", "cpu")
    result = {"te": runtime.api.version, "per_expert": run(runtime, False),
              "single_grouped_weight": run(runtime, True)}
    Path(argv[0]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
