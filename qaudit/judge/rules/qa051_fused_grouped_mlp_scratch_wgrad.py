"""QA051: TE's fused grouped-MLP backward under Megatron-FSDP, on a TE that computes a single
grouped weight's gradient into a scratch buffer instead of main_grad (TE PR #2936)."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.rules._upstream_threads import megatron_in, setting_on
from qaudit.plan.upstream.te import NEWEST_TE, te_behaviour

# transformer_engine/pytorch/ops/fused/backward_grouped_mlp.py, _compute_grad_params: the line
# that wraps main_grad for the GEMM only when accumulating (affected), and the line that wraps
# it unconditionally (fixed); read from each wheel (tests/test_rule_qa051.py).
GUARDED_LINE = {"2.14": 98, "2.14.1": 98}
UNGUARDED_LINE = {"2.15": 182}
# megatron-core releases that run it: single grouped expert weights came in 0.18.0; from
# 0.19.0 the training arguments refuse them under Megatron-FSDP.
MEGATRON_ACCEPTS = ((0, 18), (0, 19))


@rule("QA051", "warning", "fused grouped MLP drops its gradient under Megatron-FSDP (TE #2936)")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The config runs grouped-GEMM experts with one grouped weight parameter each
    (`moe_single_grouped_weight`) through TE's op fuser (`use_transformer_engine_op_fuser`)
    under Megatron-FSDP (`use_megatron_fsdp`, which marks every parameter
    `overwrite_main_grad`), with MXFP8 and SwiGLU experts, on Transformer Engine 2.14 or
    2.14.1. There the op fuser can replace the experts' backward with its fused grouped-MLP
    backward (transformer_engine/pytorch/ops/fused/backward_grouped_mlp.py, the CuTe DSL
    kernel: `NVTE_CUTEDSL_FUSED_GROUPED_MLP=1` on an SM100 GPU, which qaudit cannot see), and
    its `_compute_grad_params` wraps the parameter's `main_grad` as the GEMM's output only
    when it accumulates: with `overwrite_main_grad` the gradient goes to a freshly allocated
    scratch buffer, `main_grad` is never written, and FSDP reduces whatever the bucket held.
    TE PR #2936 (the review finding of PR #2769) wraps `main_grad` in both cases, so the
    overwrite lands in it; the fixed code is in the 2.15 wheel already.

    The Megatron is the one the verdict is for: megatron-core 0.18.0 to 0.18.2 run this
    (single grouped expert weights came in 0.18.0); from 0.19.0 `validate_args` refuses
    `moe_single_grouped_weight` under Megatron-FSDP, so the rule is silent there. A warning,
    not an error: the fused kernel is opt-in and needs the GPU it was written for; the guard
    (`qaudit guard`) sees the write that never happens. The finding's evidence names TE's
    code on both sides.

    Fix: use Transformer Engine 2.15 or later; or leave `NVTE_CUTEDSL_FUSED_GROUPED_MLP` unset
    (TE's unfused op-fuser backward); or drop `moe_single_grouped_weight`.
    """
    config = facts.config
    version = facts.te_version or NEWEST_TE
    if te_behaviour(version).fused_grouped_mlp_overwrites_main_grad:
        return
    if not (config.moe_grouped_gemm and config.use_megatron_fsdp and config.gated_linear_unit
            and config.gradient_accumulation_fusion and config.fp8
            and config.fp8_recipe == "mxfp8"):
        return
    on, file, line = setting_on(config, "moe_single_grouped_weight")
    fused, _, _ = setting_on(config, "use_transformer_engine_op_fuser")
    if not (on and fused) or not megatron_in(facts.megatron, *MEGATRON_ACCEPTS):
        return
    experts = [row.name for row in facts.rows if row.type.endswith("GroupedLinear")]
    where = f":{GUARDED_LINE[version]}" if version in GUARDED_LINE else ""
    for name in experts:
        yield Hit(module=name, file=file, line=line,
                  message=(f"{name}: under Megatron-FSDP (overwrite_main_grad) Transformer "
                           f"Engine {version}'s fused grouped-MLP backward computes this "
                           "single grouped weight's gradient into a scratch buffer and never "
                           "writes main_grad, so FSDP reduces what the bucket held before "
                           "(when NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 on an SM100 GPU; TE PR "
                           "#2936, fixed in 2.15)"),
                  fix=("use Transformer Engine 2.15 or later; or leave "
                       "NVTE_CUTEDSL_FUSED_GROUPED_MLP unset; or moe_single_grouped_weight: "
                       "false"),
                  evidence=(f"Transformer Engine {version}, transformer_engine/pytorch/ops/"
                            f"fused/backward_grouped_mlp.py{where}, _compute_grad_params: "
                            "`if accumulate_into_main_grad:` guards wrapping main_grad as the "
                            "GEMM output, so with overwrite_main_grad the output is a new "
                            "buffer (so 2.14 and 2.14.1); in 2.15 (line "
                            f"{UNGUARDED_LINE['2.15']}) main_grad is wrapped whatever "
                            "overwrite_main_grad says, and only the GEMM's accumulate flag "
                            "follows it (TE PR #2936)"))
