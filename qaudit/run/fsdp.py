"""What Megatron-FSDP does to `main_grad`, by sharding strategy (docs/semantics.md §1.5).

Read from megatron-core 0.19.2 (`core/distributed/fsdp/src/megatron_fsdp/`):
- every parameter gets `__fsdp_param__` when the model is wrapped, whatever the strategy
  (`megatron_fsdp.py`); Megatron's own linears with fused accumulation then fetch the buffer
  with `get_main_grad()` and write their wgrad GEMM's output into it, never adding
  (`core/tensor_parallel/layers.py`: `te_general_gemm(..., out=main_grad)` with
  `accumulate=False`, or `torch.matmul(..., out=main_grad)`);
- a strategy other than `no_shard` sets `overwrite_main_grad` on the parameters it unshards
  for forward and backward (`all_gather_and_wait_parameters_ready`), so TE's fused GEMMs
  overwrite too;
- `optim_grads` and `optim_grads_params` reduce-scatter the buffer after every backward (and
  hand out a fresh bucket); `no_shard` and `optim` keep one persistent buffer that is reduced
  after the last microbatch (`is_delay_grad_reduce`), so an overwrite there discards the
  earlier microbatches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FsdpGrads:
    fsdp_params: bool  # `__fsdp_param__` on every parameter
    overwrite_main_grad: bool  # TE's fused GEMMs overwrite on every backward
    drained_each_backward: bool  # the buffer is consumed after every microbatch's backward

    @classmethod
    def of(cls, use_megatron_fsdp: object, strategy: object) -> FsdpGrads:
        if not use_megatron_fsdp:
            return NO_FSDP
        return cls(fsdp_params=True, overwrite_main_grad=strategy != "no_shard",
                   drained_each_backward=strategy in ("optim_grads", "optim_grads_params"))


NO_FSDP = FsdpGrads(False, False, False)
