"""QA003: a high-precision module is tracked, so it takes TE's overwrite path for nothing."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.report import Finding
from qaudit.judge.rules import AuditFacts, rule


@rule("QA003", "info", "tracked module runs in high precision")
def check(facts: AuditFacts) -> Iterable[Finding]:
    """The module executes in high precision (no weight cache to refresh), yet Megatron passes
    it `is_first_microbatch=True` after each re-arm, so its first wgrad overwrites
    `main_grad`. For a module run once per microbatch that lands on a freshly zeroed buffer
    and is harmless (info). For a module run several times per microbatch it is the #7353 trap
    (error): the overwrite discards the other calls' gradients.

    Fix: Megatron-LM PR #7353 (`--policy module`) passes None to modules that will not execute
    quantized.
    """
    for module in facts.te_modules:
        row = facts.rows_by_name[module]
        if row.tracked not in ("yes", "stale") or row.precision != "bf16":
            continue
        if row.accumulation not in ("overwrite-first",):
            continue
        repeated = row.calls_per_microbatch > 1
        where = (f"called {row.calls_per_microbatch}x per microbatch, so the overwrite discards "
                 "other calls' gradients" if repeated else
                 "harmless here: the overwrite lands on a freshly zeroed buffer")
        fix = ("Megatron-LM main (PR #6965, --megatron main) passes None when the config "
               "quantizes nothing" if row.tracked == "stale" else
               "PR #7353 (--policy module) passes None to high-precision modules")
        yield Finding("QA003", "error" if repeated else "info", module,
                      f"{module}: runs bf16 but is tracked: its first call overwrites main_grad "
                      f"for nothing ({where})", facts.config.file, None, fix)
