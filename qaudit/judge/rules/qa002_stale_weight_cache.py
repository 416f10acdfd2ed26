"""QA002: a quantized module keeps using a weight quantized before the last optimizer step."""

from __future__ import annotations

from typing import Iterable

from qaudit.load.precision import precision_label
from qaudit.judge.rules import AuditFacts, Hit, rule


def _reuses_cache(record) -> bool:
    return record.cache == "reuse" if record.cache is not None else record.flag is False


@rule("QA002", "error", "quantized weight cache never refreshed (stale weights)")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """A module executes quantized and caches its quantized weight, but its
    `is_first_microbatch` flag is never re-armed: after the first step every call passes
    False, and TE reuses the cached quantized weight as is. The optimizer updates the
    high-precision weight, the forward keeps using the old one: training silently stops
    learning in that module (Megatron-LM issue #5641, fixed by PR #5642 for recipe-only
    configs).

    Detected when, in a step after an optimizer update, the module's first quantized call
    reuses the cached weight: it gets False, or it replays a CUDA graph captured without TE's
    skip flag. Not for primary quantized weights (`fp8_param`: the optimizer updates the
    quantized parameter itself, no cache) nor frozen weights (`--freeze-all-layers`: nothing
    is updated). `--verify` measures the output difference against a fresh quantization.

    Fix: make sure Megatron re-arms the flags (`set_is_first_microbatch`) for this config:
    upstream does when fp8, fp4, kitchen or a quant_recipe is set (PR #5642).
    """
    if facts.evaluation or facts.config.freeze_all_layers:
        return
    for module, records in facts.records.items():
        stale_steps = []
        for step in sorted({r.step for r in records if r.step > 0}):
            quantized = [r for r in records if r.step == step and r.quant is not None]
            if quantized and _reuses_cache(quantized[0]):
                stale_steps.append(step)
        if not stale_steps:
            continue
        precision = precision_label(next(r.quant for r in records if r.quant is not None))
        first = stale_steps[0] + 1
        yield Hit(module=module, message=_message(module, precision, first, records),
                  file=facts.config.file, line=facts.config.line_of("quant_recipe"),
                  fix=_fix(records))


def _message(module: str, precision: str, first: int, records) -> str:
    if any(r.graph for r in records):
        return (f"{module}: executes {precision} inside a CUDA graph captured without TE's "
                f"skip flag (no fp8/fp4 in the config) with is_first_microbatch=False: from "
                f"step {first} on every replay reuses the weight quantized at capture, before "
                "the optimizer updates (inference: capture after warm-up, TE 2.14+)")
    return (f"{module}: executes {precision} but its flag is never re-armed: from step {first} "
            "on every call passes is_first_microbatch=False and reuses the weight quantized "
            "before the optimizer update")


def _fix(records) -> str:
    if any(r.graph for r in records):
        return ("set fp8/fp4 in the config (the graphs then get TE's skip flag and refresh the "
                "weight each step), use primary quantized weights (fp8_param in the recipe), "
                "or keep this module out of cuda_graph_modules")
    return ("use a Megatron-LM with PR #5642 (re-arms the flags when quant_recipe is set), or "
            "set disable_parameter_transpose_cache: true (re-quantize every call)")
