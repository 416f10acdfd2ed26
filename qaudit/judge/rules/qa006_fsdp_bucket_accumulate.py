"""QA006: a module adds its weight gradient into Megatron-FSDP's uninitialised gradient bucket."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA006", "error", "module adds its gradient into Megatron-FSDP's uninitialised bucket")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Megatron-FSDP with sharded gradients (`data_parallel_sharding_strategy` `optim_grads`
    or `optim_grads_params`) gives each parameter a `main_grad` that is a communication bucket
    allocated without initialising it (`fetch_bucket` / `allocate_bucket_storage`,
    megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py), and marks
    every parameter `overwrite_main_grad` (megatron_fsdp.py) so that TE's fused weight-gradient
    GEMM writes the bucket instead of adding to it. A TE module whose backward adds anyway adds
    its gradient to whatever that memory held: the reduced gradient is corrupt, silently, in
    every microbatch where the module's `is_first_microbatch` is not True.

    TE 2.9 to 2.14.1 do this for `LayerNormLinear` and `GroupedLinear` under an FP8 or FP4
    recipe whose weight is not stored quantized: their backward reads `overwrite_main_grad`
    from the weight saved for the GEMM, the quantized copy, which does not carry it; TE 2.15
    reads it from the parameter (qaudit/plan/upstream/te.py, docs/te-runtime.md). Detected
    when a backward of a module with `overwrite_main_grad` accumulates (the te runtime: the
    accumulate argument of TE's own GEMM).

    Fix: TE 2.15 or later; or primary quantized weights (`fp8_param`), where the GEMM's
    weight is the parameter; or `gradient_accumulation_fusion: false` (Megatron-FSDP then
    copies the module's gradient into the bucket); or keep the module in BF16 with a recipe
    matcher.
    """
    te_modules = set(facts.te_modules)
    for module, records in facts.records.items():
        # Megatron's own linears (the output layer) write the bucket under Megatron-FSDP
        # (`te_general_gemm(..., out=main_grad)`, tensor_parallel/layers.py): TE's are the case.
        if module not in te_modules or not facts.overwrite_main_grad.get(module, False):
            continue
        adding = [r for r in records if r.grad and r.decision == "accumulate"]
        if not adding:
            continue
        first = adding[0]
        microbatches = sorted({(r.step, r.microbatch) for r in adding})
        message = (f"{module}: Megatron-FSDP set overwrite_main_grad, but its backward adds "
                   f"into main_grad (first in step {first.step + 1}, microbatch "
                   f"{first.microbatch + 1}, call {first.call}: is_first_microbatch="
                   f"{first.flag}); under sharded gradients main_grad is an uninitialised "
                   f"bucket, so the gradient of {len(microbatches)} of the audited "
                   "microbatches is corrupt (data_parallel_sharding_strategy)")
        yield Hit(module=module, message=message, file=facts.config.file,
                  line=facts.config.line_of("data_parallel_sharding_strategy"),
                  fix="use TE 2.15 or later; or fp8_param: true (primary quantized weights); "
                      "or gradient_accumulation_fusion: false; or keep the module in BF16 "
                      "with a recipe matcher")
