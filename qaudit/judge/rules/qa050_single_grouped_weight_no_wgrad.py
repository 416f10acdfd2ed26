"""QA050: grouped experts with one grouped weight parameter through TE's GroupedLinear module,
on a TE whose module path gives that parameter no weight gradient (TE #3234)."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.rules._upstream_threads import megatron_in, setting_on
from qaudit.plan.upstream.te import NEWEST_TE, te_behaviour

# Where GroupedLinear._get_weight_tensors (transformer_engine/pytorch/module/grouped_linear.py)
# hands over the grouped weight's members, per affected release, and where the fixed releases
# hand over the parameter itself; read from each release's wheel (tests/test_rule_qa050.py).
MEMBERS_LINE = {"2.14": 1168, "2.14.1": 1168, "2.15": 1270, "2.16": 1297, "2.16.1": 1297,
                "2.17": 1884, "2.17.1": 1884, "2.18": 2017}
PARAMETER_LINE = {"2.19": 2776, "2.20.2": 2411}
# megatron-core releases that build it: the setting came in 0.18.0; from 0.19.0
# TransformerConfig.__post_init__ refuses it without use_transformer_engine_op_fuser.
MEGATRON_ACCEPTS = ((0, 18), (0, 19))


@rule("QA050", "error", "single grouped expert weight gets no gradient (TE #3234)")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The config stores each layer's grouped-GEMM experts as one grouped weight parameter
    (`moe_single_grouped_weight` with `moe_grouped_gemm`) and runs them through TE's
    `GroupedLinear` module (no `use_transformer_engine_op_fuser`), on a Transformer Engine
    from 2.14 to 2.18. In these releases `GroupedLinear._get_weight_tensors`
    (transformer_engine/pytorch/module/grouped_linear.py) gives the GEMMs the grouped
    tensor's member views (`grouped_weight.quantized_tensors`), which carry no autograd link
    to the registered parameter: the backward sees weights that need no gradient, computes no
    weight gradient and writes neither `.grad` nor `main_grad`. The experts never learn,
    silently. TE issue #3234 reported it on 2.17.0 (the op-fuser path did produce the
    gradient); TE PR #3224 hands the parameter itself to the GEMMs from 2.19, with PR #3225's
    other single-grouped-weight fixes.

    The Megatron is the one the verdict is for: megatron-core 0.18.0 to 0.18.2 build this
    (the setting came in 0.18.0); from 0.19.0 `TransformerConfig` refuses
    `moe_single_grouped_weight` without the op fuser, naming this very split, so the rule is
    silent there. From TE 2.15 the setting also needs `NVTE_GROUPED_LINEAR_SINGLE_PARAM=1` in
    the environment (without it TE turns it off and warns), which qaudit cannot see. The
    finding's evidence names TE's code on both sides. In a run, the guard sees the missing
    gradient itself and stops the job with QA009 (shown on TE 2.17.0's own code on CPU).

    Fix: use Transformer Engine 2.19 or later; or turn on `use_transformer_engine_op_fuser`
    (TE's op-fuser GroupedLinear keeps the parameter); or drop `moe_single_grouped_weight`.
    """
    config = facts.config
    version = facts.te_version or NEWEST_TE
    if te_behaviour(version).single_grouped_weight_wgrad or not config.moe_grouped_gemm:
        return
    on, file, line = setting_on(config, "moe_single_grouped_weight")
    fused, _, _ = setting_on(config, "use_transformer_engine_op_fuser")
    if not on or fused or not megatron_in(facts.megatron, *MEGATRON_ACCEPTS):
        return
    experts = [row.name for row in facts.rows if row.type.endswith("GroupedLinear")]
    where = f":{MEMBERS_LINE[version]}" if version in MEMBERS_LINE else ""
    for name in experts:
        yield Hit(module=name, file=file, line=line,
                  message=(f"{name}: moe_single_grouped_weight stores the experts as one "
                           f"grouped parameter, and Transformer Engine {version}'s "
                           "GroupedLinear module hands its GEMMs the parameter's member "
                           "views, which have no autograd link to it: no weight gradient is "
                           "computed, main_grad is never written, the experts do not train "
                           "(TE issue #3234, fixed in 2.19; from TE 2.15 only with "
                           "NVTE_GROUPED_LINEAR_SINGLE_PARAM=1, without which TE turns the "
                           "setting off)"),
                  fix=("use Transformer Engine 2.19 or later (TE PRs #3224, #3225); or "
                       "use_transformer_engine_op_fuser: true; or moe_single_grouped_weight: "
                       "false"),
                  evidence=(f"Transformer Engine {version}, transformer_engine/pytorch/module/"
                            f"grouped_linear.py{where}, GroupedLinear._get_weight_tensors: "
                            "weight_tensors = grouped_weight.quantized_tensors (the members, "
                            "not the parameter; so 2.14 to 2.18); in 2.19 (line "
                            f"{PARAMETER_LINE['2.19']}) and 2.20.2 (line "
                            f"{PARAMETER_LINE['2.20.2']}) the same function returns "
                            "[grouped_weight], the registered parameter (TE PR #3224)"))
