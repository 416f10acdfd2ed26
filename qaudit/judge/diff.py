"""`qaudit diff BASE HEAD`: audit two configs (or read two JSON reports) and show what changes.

Only modules whose precision, recipe, tracked, accumulation, calls or verdict differ are shown
(plus modules that appear or disappear), and the findings that appear or disappear (matched by
baseline fingerprint: rule, module, recipe entry; never line numbers). The exit code is 1 when
the head introduces a finding at or above `--fail-on` (default: error).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from qaudit.judge.baseline import fingerprint
from qaudit.judge.report import SEVERITIES, Finding, ModuleRow, Report

DIFF_SCHEMA = "qaudit-diff/1"
FIELDS = ("precision", "recipe", "tracked", "accumulation", "calls_per_microbatch",
          "nograd_calls_per_microbatch", "verdict")
LABELS = {"calls_per_microbatch": "calls", "nograd_calls_per_microbatch": "no-grad calls"}


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

    def exit_code(self, fail_on: str = "error") -> int:
        threshold = SEVERITIES.index(fail_on)
        return int(any(SEVERITIES.index(f.severity) <= threshold for f in self.new))

    def to_dict(self, exit_code: int) -> dict[str, Any]:
        def side(report: Report) -> dict[str, Any]:
            counts = report.counts()
            return {"config": report.config, "recipe": report.recipe, "runtime": report.runtime,
                    "policy": report.policy,
                    **({"megatron": report.megatron} if report.megatron else {}),
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
                         "fixed": [asdict(f) for f in self.fixed]},
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
                      fixed=_finding_delta(head.findings, base.findings))
