"""QA005: a repeated module gets True but no loss was seen: safe only by graph order."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA005", "warning", "repeated module overwrites, safe only by backward order")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The module runs more than once per microbatch with fused wgrad accumulation and one call
    gets `is_first_microbatch=True` (an overwrite in backward), yet nothing was lost in this
    run: the overwriting backward happened to run first. Autograd's order among independent
    branches is not a contract: a change of model code, recompute or pipeline schedule can
    make it run last and lose the other calls' gradients (QA001).

    For a module that runs in high precision the overwrite comes from tracking a module with no
    weight cache: PR #7353 (`--policy module`) passes it None (QA003 is the same cause in a
    module run once per microbatch, where it is harmless).
    """
    for module, records in facts.records.items():
        row = facts.rows_by_name[module]
        if row.calls_per_microbatch < 2 or any(r.lossy for r in records):
            continue
        overwrites = [r for r in records if r.grad and r.decision == "overwrite"]
        if overwrites:
            first = overwrites[0]
            yield Hit(module=module,
                      message=(f"{module}: called {row.calls_per_microbatch}x per microbatch; call "
                               f"{first.call} overwrites main_grad but its backward ran first, so "
                               "nothing was lost in this run"),
                      file=facts.config.file, line=None, fix=_fix(row))


def _fix(row) -> str:
    fix = ("pass None to this module (disable_parameter_transpose_cache) or run it once per "
           "microbatch")
    if row.precision != "bf16":
        return fix
    # High precision: tracking it is the cause (QA003 names it for single-call modules).
    if row.tracked == "stale":
        return ("use Megatron-LM main (PR #6965, --megatron main: BF16 configs pass None), or "
                + fix)
    return "PR #7353 (--policy module) passes None to high-precision modules; or " + fix
