"""QA003: a high-precision module is tracked, so it takes TE's overwrite path for nothing."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA003", "info", "tracked module runs in high precision")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The module executes in high precision (no weight cache to refresh), yet Megatron passes
    it `is_first_microbatch=True` after each re-arm, so its first wgrad overwrites
    `main_grad`. The module runs once per microbatch, so the overwrite lands on a freshly
    zeroed buffer and is harmless: a note that the flag is tracked for nothing.

    A module run several times per microbatch is not reported here: there the same overwrite
    discards the other calls' gradients (QA001, whose fix names PR #7353 for a high-precision
    module) or only by luck of backward order does not (QA005).

    Fix: Megatron-LM PR #7353 (`--policy module`) passes None to modules that will not execute
    quantized.
    """
    for module in facts.te_modules:
        row = facts.rows_by_name[module]
        if row.tracked not in ("yes", "stale") or row.precision != "bf16":
            continue
        if row.accumulation not in ("overwrite-first",):
            continue
        if row.calls_per_microbatch > 1:
            continue  # the same overwrite is a gradient loss there: QA001 / QA005 report it
        fix = ("Megatron-LM main (PR #6965, --megatron main) passes None when the config "
               "quantizes nothing" if row.tracked == "stale" else
               "PR #7353 (--policy module) passes None to high-precision modules")
        yield Hit(module=module,
                  message=(f"{module}: runs bf16 but is tracked: its first call overwrites "
                           "main_grad for nothing (harmless here: the overwrite lands on a "
                           "freshly zeroed buffer)"),
                  file=facts.config.file, line=None, fix=fix)
