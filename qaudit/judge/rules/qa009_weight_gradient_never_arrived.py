"""QA009: a fused module's backward ran, yet its weights' main_grad never got a write."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA009", "error", "weight gradient never reached main_grad")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Observed in a run (the guard, qaudit/guard/): a linear module with fused wgrad
    accumulation (TE's with `fuse_wgrad_accumulation`, Megatron's own with
    `gradient_accumulation_fusion`) ran forward with gradients enabled, its output's gradient arrived and its backward ran,
    its weights need a gradient, and yet by the end of the step nothing had written their
    `main_grad`: no wgrad GEMM wrote it, the buffer is unchanged (its version counter did not
    move and, where it was zeroed at the step's start, it is still zero), and no `.grad` was
    left for Megatron's DDP to add. The optimizer would step those weights with whatever the
    buffer held before: they do not learn, silently.

    Not reported for frozen weights (they need no gradient), for a module whose output got
    no gradient (its backward never ran), for Megatron's own non-fused path (the gradient
    goes to `.grad`), or for a module that delays its wgrad to `backward_dw` (TE's
    `delay_wgrad_compute`: the write may come after the watched step's end), or for a call
    with no rows (an expert routed no tokens: its gradient is zero). Where another
    call's write moved the same buffer, a missing write is not told apart from it (a miss can
    hide; no false alarm).

    A known cause: TE's `GroupedLinear(single_grouped_weight=True)` on TE 2.14 to 2.18 gives
    its GEMMs the grouped parameter's member views, which carry no autograd link to it, so
    no weight gradient is computed (TE issue #3234; `qaudit check` reports that config as
    QA050). The guard stops that run on TE 2.17.0's own code with this rule, and lets TE
    2.19.0's pass (tests/test_guard_single_grouped_weight.py).

    Fix: for a grouped linear with one grouped weight, use Transformer Engine 2.19 or later
    (TE PR #3224), or per-expert weights; otherwise find why the module's backward computed
    no weight gradient (a weight replaced by a tensor without autograd link to the
    parameter) and report it.
    """
    seen: dict[str, object] = {}
    for missing in facts.missing_writes:
        seen.setdefault(missing.module, missing)
    for module, first in seen.items():
        known = getattr(first, "single_grouped_weight", False)
        yield Hit(module=module, file=facts.config.file, line=None,
                  fix=_GROUPED_FIX if known else _FIX,
                  message=(f"{module}: call {first.call} of microbatch {first.microbatch} "
                           f"(step {first.step + 1}) ran its backward, yet no weight gradient "
                           "reached main_grad (no write, no .grad): the weights would be "
                           "updated without this gradient"
                           + (" (one grouped weight parameter: TE issue #3234, fixed in TE "
                              "2.19; qaudit explain QA050)" if known else "")))


_FIX = ("find why the module's backward computed no weight gradient and report it; qaudit "
        "does not model this cause")
_GROUPED_FIX = ("use Transformer Engine 2.19 or later (TE PR #3224), or per-expert weights "
                "(moe_single_grouped_weight: false)")
