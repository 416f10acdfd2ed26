"""QA004: a quantized module gets None, so its weight is re-quantized on every call."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA004", "info", "quantized module untracked: weight re-quantized every call")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The module executes quantized but is passed `is_first_microbatch=None`, so TE keeps no
    quantized weight and quantizes it again on every call, every microbatch. Correct, but a
    cost: one weight quantization per call instead of one per step. Usually the result of
    `disable_parameter_transpose_cache: true`. Not for primary quantized weights
    (`fp8_param`), which are stored quantized and never re-quantized per call.
    """
    for module in facts.te_modules:
        row = facts.rows_by_name[module]
        primary = any(r.cache == "primary" for r in facts.records.get(module, []))
        if row.tracked == "no" and row.precision not in ("bf16", "-") and not primary:
            line = facts.config.line_of("disable_parameter_transpose_cache")
            yield Hit(module=module,
                      message=(f"{module}: executes {row.precision} with is_first_microbatch=None: "
                               "its weight is re-quantized on every call"),
                      file=facts.config.file, line=line,
                      fix="if this is not deliberate, leave disable_parameter_transpose_cache off")
