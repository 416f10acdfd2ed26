"""QA008: grouped experts in a quantized CUDA graph, on a TE whose GroupedLinear drops TE's
skip-weight-update flag at capture (TE issue #3051)."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.plan.graphs import has_skip_flag
from qaudit.plan.upstream.te import NEWEST_TE, te_behaviour

_GRAPH_KEYS = ("cuda_graph_impl", "enable_cuda_graph", "external_cuda_graph")


@rule("QA008", "error", "grouped experts graphed without TE's skip flag (TE #3051)")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The config runs grouped-GEMM experts (`moe_grouped_gemm`: TE's `GroupedLinear`) inside
    a per-layer CUDA graph with fp8 or fp4 set, on a Transformer Engine from 2.10 to 2.16.1.
    While such a graph is captured, TE's other linears take the skip-weight-update tensor the
    capture creates, pass `is_first_microbatch=False` and record their weight quantization
    behind that switch, so each replay re-quantizes the weight on a step's first microbatch
    only. In these releases `GroupedLinear.forward` (transformer_engine/pytorch/module/
    grouped_linear.py) passes None in the switch's place and never looks at the capture
    state (the call was rewritten by TE PR #2377, in 2.10): the experts' graph records the
    weight cast without the switch and with whatever flag Megatron passed at capture. TE
    issue #3051 measured the result on Nemotron-3-Nano: expert and router gradients much
    smaller than in an otherwise identical run without graph replay. TE PRs #3052 and #3065
    restored the capture handling in 2.17; 2.9 and earlier had it.

    The Transformer Engine is the one the verdict is for: the importable one's version, or
    `--te`, or the newest release qaudit knows (unaffected). Applies to the grouped expert
    modules the graphs capture: `cuda_graph_impl` local or transformer_engine (or the
    deprecated `enable_cuda_graph` / `external_cuda_graph`) with `cuda_graph_modules` empty
    or including `moe`. Full-iteration graphs do not go through TE's capture helper and have
    no skip flag in any module; without fp8/fp4 no module gets one. The finding's evidence
    names TE's code on both sides.

    Fix: use Transformer Engine 2.17 or later; or keep the experts out of the graphs
    (`cuda_graph_modules` without `moe`).
    """
    config = facts.config
    version = facts.te_version or NEWEST_TE
    if not has_skip_flag(config) or te_behaviour(version).grouped_linear_graph_skip_flag:
        return
    rows = facts.rows_by_name
    graphed = [name for name, records in facts.records.items()
               if name in rows and rows[name].type.endswith("GroupedLinear")
               and any(record.graph and record.training for record in records)]
    if not graphed:
        return
    precision = "fp8" if config.fp8 else "fp4"
    # The switch that turned the graphs on (the deprecated ones win, as upstream translates).
    key = next((key for key in _GRAPH_KEYS[1:] if getattr(config, key)), _GRAPH_KEYS[0])
    file, line = config.where(key)
    for name in graphed:
        yield Hit(module=name, file=file or config.file, line=line,
                  message=(f"{name}: grouped experts replayed from a CUDA graph captured under "
                           f"{precision} with Transformer Engine {version}, whose GroupedLinear "
                           "does not pass TE's skip-weight-update flag on at capture: the graph "
                           "records the expert weights' quantization without the per-step "
                           "switch and with the is_first_microbatch passed at capture, not "
                           "False; upstream measured much smaller expert and router gradients "
                           "(TE issue #3051, fixed in 2.17)"),
                  fix=("use Transformer Engine 2.17 or later (TE PRs #3052, #3065), or keep the "
                       "experts out of the graphs (cuda_graph_modules without moe)"),
                  evidence=(f"Transformer Engine {version}, transformer_engine/pytorch/module/"
                            "grouped_linear.py, GroupedLinear.forward: hands _GroupedLinear a "
                            "literal None for skip_fp8_weight_update and never checks "
                            "FP8GlobalStateManager.fp8_graph_capturing() (so since 2.10, TE PR "
                            "#2377); in 2.17 the same function reads the capture's skip tensor, "
                            "passes it on and sets is_first_microbatch=False, as Linear.forward "
                            "does"))
