"""The guard inside the cross-check: what the guard's observer saw of the upstream training run
(Megatron's model on TE's own Python), judged by the guard's rules, next to what qaudit's own
audit predicts for the same rules (docs/guard.md, "Inside --cross-check").

A difference is a QA030 like any other: the guard, run on upstream's code, would not give the
verdict `qaudit check` gives."""

from __future__ import annotations

from typing import Any

from qaudit.crosscheck.compare import Difference
from qaudit.judge.report import Finding
from qaudit.judge.rules import judge
from qaudit.run.evidence import AuditFacts
from qaudit.run.observe import Observation
from qaudit.run.observed import GUARD_RULES, facts_of

NONE = "(none)"


def _keyed(findings: list[Finding]) -> dict[tuple[str, str], str]:
    """(rule, module) -> severity; a rule about no module is keyed "-"."""
    return {(finding.rule, finding.module or "-"): finding.severity for finding in findings}


def compare_with_guard(facts: AuditFacts) -> None:
    """Where the cross-check's upstream run was watched by the guard: its summary in
    `cross_check.guard`, and each verdict that differs a difference of the cross-check."""
    result = facts.cross_check
    if result is None or result.observed is None:
        return
    result.guard, differences = guard_comparison(result.observed, facts)
    result.differences.extend(differences)


def guard_comparison(observed: Observation, facts: AuditFacts
                     ) -> tuple[dict[str, Any], list[Difference]]:
    """The guard's summary for the report and where its verdict differs from the audit's."""
    # The same config and the same Megatron's tracking policy as the audit: only what was
    # observed differs. Two or more steps watched say themselves whether the flag re-arms.
    theirs = judge(facts_of(observed, facts.config, rearms=None, policy=facts.policy),
                   only=GUARD_RULES)
    ours = judge(facts, only=GUARD_RULES)
    mine, guard = _keyed(ours), _keyed(theirs)
    # A module the audit runs inside a CUDA graph is observed on CPU without one (the
    # cross-check compares it as built, docs/cross-check.md): its verdicts are not compared.
    graphed = {row.name for row in facts.rows if row.tracked == "graph"}
    differences = [Difference(module, f"guard {rule}", mine.get((rule, module), NONE),
                              guard.get((rule, module), NONE))
                   for rule, module in sorted(set(mine) | set(guard))
                   if module not in graphed
                   and mine.get((rule, module)) != guard.get((rule, module))]
    counts: dict[str, int] = {}
    for finding in theirs:
        counts[finding.severity] = counts.get(finding.severity, 0) + 1
    summary = {"steps_watched": observed.steps, "modules_observed": len(observed.classes),
               "calls_observed": len(observed.calls),
               "findings": {severity: counts.get(severity, 0)
                            for severity in ("error", "warning", "info")},
               "rules": sorted({finding.rule for finding in theirs}),
               "graphed_not_compared": len(graphed), "differences": len(differences)}
    return summary, differences
