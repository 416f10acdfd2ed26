"""`qaudit diff BASE HEAD`: audit two configs (or read two JSON reports) and show what changes.

Only modules whose precision, recipe, tracked, accumulation, calls or verdict differ are shown
(plus modules that appear or disappear), the findings that appear or disappear (matched by
baseline fingerprint: rule, module, recipe entry; never line numbers), and the findings on both
sides whose severity or scope changed (QA001 lost "on microbatch 0 of the first step only" and
now "of every step"): for a reviewer, the most important thing a diff can say. The exit code is
1 when the head introduces a finding, or makes one worse (more severe, or its loss wider: more
steps or microbatches), at or above `--fail-on` (default: error). A fixed finding, a milder
one or a narrower scope (every step -> the first step only) is an improvement: exit 0.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from qaudit.judge.baseline import fingerprint
from qaudit.judge.report import SEVERITIES, Finding, ModuleRow, Report

DIFF_SCHEMA = "qaudit-diff/1"
FIELDS = ("precision", "recipe", "tracked", "accumulation", "calls_per_microbatch",
          "nograd_calls_per_microbatch", "verdict")
LABELS = {"calls_per_microbatch": "calls", "nograd_calls_per_microbatch": "no-grad calls"}
# When a finding's loss happens (QA001/QA005/QA007 messages, qaudit/judge/rules/qa001_*.py
# `_when`): which microbatches of which steps.
_SCOPE = re.compile(r"on microbatch [\d, ]+ of (?:the first step only|every step|"
                    r"(?:watched )?step\(s\) [\d, ]+(?: of \d+)?)")


def scope_of(finding: Finding) -> str | None:
    match = _SCOPE.search(finding.message)
    return match.group(0).rstrip(", ") if match else None


def scopes_agree(base: str | None, head: str | None) -> bool:
    """Two scopes say the same loss. A guard's report says which of the steps it watched lost
    gradient ("watched step(s) 1 of 1"); against a prediction, that agrees when the predicted
    steps are exactly those among the watched ones ("the first step only" watched for one
    step agrees with "every step" too)."""
    if base == head:
        return True
    if base is None or head is None:
        return False
    observed = [side for side in (base, head) if "watched step(s)" in side]
    if len(observed) != 1:
        return False
    seen = observed[0]
    predicted = head if seen is base else base
    if _microbatches(seen) != _microbatches(predicted):
        return False
    steps_text, _, total = seen.partition("watched step(s) ")[2].partition(" of ")
    steps = {int(step) for step in steps_text.replace(",", " ").split()}
    watched = int(total) if total.strip().isdigit() else max(steps, default=0)
    if predicted.endswith("the first step only"):
        return steps == {1}
    if predicted.endswith("every step"):
        return steps == set(range(1, watched + 1))
    return False


def _microbatches(scope: str) -> str:
    return scope.partition(" of ")[0]


def _breadth(scope: str) -> tuple[float, int]:
    """How much of a run a scope loses: (steps, microbatches per step). "Every step" is all of
    them; "the first step only" one (per start or resume)."""
    microbatches = len(_microbatches(scope).removeprefix("on microbatch ").split(","))
    if scope.endswith("every step"):
        return float("inf"), microbatches
    if scope.endswith("the first step only"):
        return 1.0, microbatches
    steps = scope.partition("step(s) ")[2].partition(" of ")[0]
    return float(len(steps.split(","))), microbatches


def widened(base: str | None, head: str | None) -> bool:
    """The head's loss covers more than the base's: more steps, or more microbatches of as
    many steps. A scope that appears (none before) counts as wider; one that goes, narrower."""
    if base == head or head is None:
        return False
    if base is None:
        return True
    (base_steps, base_mbs), (head_steps, head_mbs) = _breadth(base), _breadth(head)
    return head_steps > base_steps or (head_steps == base_steps and head_mbs > base_mbs)


@dataclass(kw_only=True)
class FindingChange:
    """The same finding (same fingerprint) on both sides, with another severity or scope."""

    base: Finding
    head: Finding
    changes: dict[str, tuple[Any, Any]]  # "severity" / "scope" -> (base, head)

    @property
    def worse(self) -> bool:
        """More severe, or a wider loss; otherwise the change is an improvement."""
        if "severity" in self.changes:
            base, head = self.changes["severity"]
            if SEVERITIES.index(head) < SEVERITIES.index(base):
                return True
        if "scope" in self.changes:
            return widened(*self.changes["scope"])
        return False


@dataclass(kw_only=True)
class ModuleChange:
    name: str
    status: str  # "changed", "added" or "removed"
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    base: ModuleRow | None = None
    head: ModuleRow | None = None


@dataclass(kw_only=True)
class ReportDiff:
    base: Report
    head: Report
    modules: list[ModuleChange]
    new: list[Finding]
    fixed: list[Finding]
    changed: list[FindingChange] = field(default_factory=list)

    def exit_code(self, fail_on: str = "error") -> int:
        """1 when a new finding, or one made worse (its head side), is at or above `fail_on`;
        a narrower scope, a milder severity or a fixed finding is not a regression."""
        threshold = SEVERITIES.index(fail_on)
        heads = self.new + [change.head for change in self.changed if change.worse]
        return int(any(SEVERITIES.index(f.severity) <= threshold for f in heads))

    def to_dict(self, exit_code: int) -> dict[str, Any]:
        def side(report: Report) -> dict[str, Any]:
            counts = report.counts()
            return {"config": report.config, "recipe": report.recipe, "runtime": report.runtime,
                    "policy": report.policy,
                    **({"megatron": report.megatron} if report.megatron else {}),
                    **({"te": report.te} if report.te else {}),
                    "steps": report.steps,
                    "microbatches": report.microbatches,
                    "summary": {s: counts.get(s, 0) for s in SEVERITIES}}

        return {
            "schema": DIFF_SCHEMA,
            "base": side(self.base),
            "head": side(self.head),
            "modules": [{"name": m.name, "status": m.status,
                         "changes": {k: {"base": b, "head": h} for k, (b, h) in m.changes.items()}}
                        for m in self.modules],
            "findings": {"new": [asdict(f) for f in self.new],
                         "fixed": [asdict(f) for f in self.fixed],
                         "changed": [{"base": asdict(c.base), "head": asdict(c.head),
                                      "changes": {k: {"base": b, "head": h}
                                                  for k, (b, h) in c.changes.items()}}
                                     for c in self.changed]},
            "exit_code": exit_code,
        }


def _finding_delta(before: list[Finding], after: list[Finding]) -> list[Finding]:
    """Findings of `after` not matched (by fingerprint, with multiplicity) in `before`."""
    left = Counter(fingerprint(f) for f in before)
    out = []
    for finding in after:
        key = fingerprint(finding)
        if left[key] > 0:
            left[key] -= 1
        else:
            out.append(finding)
    return out


def _finding_changes(base: list[Finding], head: list[Finding]) -> list[FindingChange]:
    """Findings on both sides (paired by fingerprint, in order) whose severity or scope
    differ."""
    waiting: dict[str, list[Finding]] = {}
    for finding in base:
        waiting.setdefault(fingerprint(finding), []).append(finding)
    out = []
    for finding in head:
        matches = waiting.get(fingerprint(finding))
        if not matches:
            continue
        old = matches.pop(0)
        changes = {}
        if old.severity != finding.severity:
            changes["severity"] = (old.severity, finding.severity)
        if not scopes_agree(scope_of(old), scope_of(finding)):
            changes["scope"] = (scope_of(old), scope_of(finding))
        if changes:
            out.append(FindingChange(base=old, head=finding, changes=changes))
    return out


def diff_reports(base: Report, head: Report) -> ReportDiff:
    base_rows = {row.name: row for row in base.modules}
    head_rows = {row.name: row for row in head.modules}
    modules: list[ModuleChange] = []
    for row in head.modules:
        old = base_rows.get(row.name)
        if old is None:
            modules.append(ModuleChange(name=row.name, status="added",
                                        changes={f: (None, getattr(row, f, None)) for f in FIELDS},
                                        base=None, head=row))
            continue
        changes = {f: (getattr(old, f, None), getattr(row, f, None)) for f in FIELDS
                   if getattr(old, f, None) != getattr(row, f, None)}
        if changes:
            modules.append(ModuleChange(name=row.name, status="changed", changes=changes, base=old,
                                        head=row))
    for row in base.modules:
        if row.name not in head_rows:
            modules.append(ModuleChange(name=row.name, status="removed",
                                        changes={f: (getattr(row, f, None), None) for f in FIELDS},
                                        base=row, head=None))
    return ReportDiff(base=base, head=head, modules=modules,
                      new=_finding_delta(base.findings, head.findings),
                      fixed=_finding_delta(head.findings, base.findings),
                      changed=_finding_changes(base.findings, head.findings))
