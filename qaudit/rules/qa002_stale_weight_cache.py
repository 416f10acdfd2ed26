"""QA002: a quantized module keeps using a weight quantized before the last optimizer step."""

from __future__ import annotations

from typing import Iterable

from qaudit.precision import precision_label
from qaudit.report import Finding
from qaudit.rules import AuditFacts, rule


@rule("QA002", "error", "quantized weight cache never refreshed (stale weights)")
def check(facts: AuditFacts) -> Iterable[Finding]:
    """A module executes quantized and caches its quantized weight, but its
    `is_first_microbatch` flag is never re-armed: after the first step every call passes
    False, and TE reuses the cached quantized weight as is. The optimizer updates the
    high-precision weight, the forward keeps using the old one: training silently stops
    learning in that module (Megatron-LM issue #5641, fixed by PR #5642 for recipe-only
    configs).

    Detected when, in a step after an optimizer update, the module's first quantized call
    gets False. `--verify` measures the output difference against a fresh quantization.

    Fix: make sure Megatron re-arms the flags (`set_is_first_microbatch`) for this config:
    upstream does when fp8, fp4, kitchen or a quant_recipe is set (PR #5642).
    """
    if facts.evaluation:
        return
    for module, records in facts.records.items():
        stale_steps = []
        for step in sorted({r.step for r in records if r.step > 0}):
            quantized = [r for r in records if r.step == step and r.quant is not None]
            if quantized and quantized[0].flag is False:
                stale_steps.append(step)
        if not stale_steps:
            continue
        precision = precision_label(next(r.quant for r in records if r.quant is not None))
        first = stale_steps[0] + 1
        yield Finding(
            "QA002", "error", module,
            f"{module}: executes {precision} but its flag is never re-armed: from step {first} "
            "on every call passes is_first_microbatch=False and reuses the weight quantized "
            "before the optimizer update",
            facts.config.file, facts.config.line_of("quant_recipe"),
            "use a Megatron-LM with PR #5642 (re-arms the flags when quant_recipe is set), or "
            "set disable_parameter_transpose_cache: true (re-quantize every call)")
