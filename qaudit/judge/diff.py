"""`qaudit diff BASE HEAD`: audit two configs (or read two JSON reports) and show what changes.

Only modules whose precision, recipe, tracked, accumulation, calls or verdict differ are shown
(plus modules that appear or disappear), and the findings that appear or disappear (matched by
baseline fingerprint: rule, module, recipe entry; never line numbers). The exit code is 1 when
the head introduces a finding at or above `--fail-on` (default: error).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from qaudit.judge.baseline import fingerprint
from qaudit.render.common import calls_text, group_rows
from qaudit.judge.report import SEVERITIES, Finding, ModuleRow, Report

DIFF_SCHEMA = "qaudit-diff/1"
ARROW = "\u2192"  # Markdown only; the table keeps ASCII "->"
FIELDS = ("precision", "recipe", "tracked", "accumulation", "calls_per_microbatch",
          "nograd_calls_per_microbatch", "verdict")
LABELS = {"calls_per_microbatch": "calls", "nograd_calls_per_microbatch": "no-grad calls"}


@dataclass
class ModuleChange:
    name: str
    status: str  # "changed", "added" or "removed"
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    base: ModuleRow | None = None
    head: ModuleRow | None = None


@dataclass
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
            modules.append(ModuleChange(row.name, "added",
                                        {f: (None, getattr(row, f, None)) for f in FIELDS},
                                        None, row))
            continue
        changes = {f: (getattr(old, f, None), getattr(row, f, None)) for f in FIELDS
                   if getattr(old, f, None) != getattr(row, f, None)}
        if changes:
            modules.append(ModuleChange(row.name, "changed", changes, old, row))
    for row in base.modules:
        if row.name not in head_rows:
            modules.append(ModuleChange(row.name, "removed",
                                        {f: (getattr(row, f, None), None) for f in FIELDS},
                                        row, None))
    return ReportDiff(base, head, modules, _finding_delta(base.findings, head.findings),
                      _finding_delta(head.findings, base.findings))


# --- rendering --------------------------------------------------------------------------------

def _signature(change: ModuleChange) -> tuple:
    return (change.status, tuple(sorted((k, repr(v)) for k, v in change.changes.items())))


def _value(field_name: str, value: Any) -> str:
    return "-" if value is None else str(value)


def change_text(change: ModuleChange, arrow: str = "->") -> str:
    if change.status == "added":
        row = change.head
        return (f"added: {row.precision}, recipe {row.recipe}, tracked {row.tracked}, "
                f"{row.accumulation}, calls {calls_text(row)}, verdict {row.verdict}")
    if change.status == "removed":
        row = change.base
        return f"removed (was {row.precision}, verdict {row.verdict})"
    return "; ".join(f"{LABELS.get(k, k)} {_value(k, b)} {arrow} {_value(k, h)}"
                     for k, (b, h) in change.changes.items())


def _summary(diff: ReportDiff, exit_code: int) -> str:
    counts = Counter(f.severity for f in diff.new)
    fixed = Counter(f.severity for f in diff.fixed)
    return (f"{len(diff.modules)} module(s) changed; new: {counts.get('error', 0)} error(s), "
            f"{counts.get('warning', 0)} warning(s), {counts.get('info', 0)} info; "
            f"fixed: {sum(fixed.values())}   exit {exit_code}")


def render_diff_table(diff: ReportDiff, exit_code: int, *, width: int = 80,
                      expand: bool = False) -> str:
    import textwrap

    from qaudit.render.common import group_findings, megatron_text, policy_text
    from qaudit.render.table import finding_lines

    def wrap(text: str, first: str = "", rest: str = "      ") -> list[str]:
        return textwrap.wrap(text, width=min(width, 100), initial_indent=first,
                             subsequent_indent=rest, break_long_words=False,
                             break_on_hyphens=False) or [first]

    base, head = diff.base, diff.head
    lines = [f"base: {base.config}" + (f"   recipe: {base.recipe}" if base.recipe else ""),
             f"head: {head.config}" + (f"   recipe: {head.recipe}" if head.recipe else ""),
             f"runtime: {head.runtime}   policy: {policy_text(head)}   "
             f"steps: {head.steps} x {head.microbatches} microbatches"]
    megatron = megatron_text(head)
    if megatron:
        lines.extend(wrap(f"megatron: {megatron}", "", "  "))
    lines.append("")
    if not diff.modules:
        lines.append("no module changes")
    else:
        lines.append("module changes:")
        for group in group_rows(diff.modules, expand, signature=_signature):
            count = f"  (x{group.count})" if group.count > 1 else ""
            lines.append(group.name + count)
            lines.extend(wrap(change_text(group.row), "  ", "    "))
    for title, findings in (("new findings", diff.new), ("fixed findings", diff.fixed)):
        if findings:
            lines.append("")
            lines.append(f"{title} ({len(findings)}):")
            for group in group_findings(findings, expand):
                lines.extend(finding_lines(group, min(width, 100)))
    lines.append("")
    lines.append(_summary(diff, exit_code))
    return "\n".join(lines) + "\n"


def render_diff_markdown(diff: ReportDiff, exit_code: int, *, expand: bool = False) -> str:
    from qaudit.render.common import megatron_text
    from qaudit.render.markdown import code, escape, finding_items

    status = "\u274c" if exit_code else "\u2705"
    new = Counter(f.severity for f in diff.new)
    lines = [f"{status} **qaudit diff {code(diff.base.config)} \u2192 {code(diff.head.config)}: "
             f"{new.get('error', 0)} new error(s), {new.get('warning', 0)} new warning(s), "
             f"{len(diff.fixed)} fixed** (exit {exit_code})", ""]
    megatron = megatron_text(diff.head)
    if megatron:
        lines += [f"For {escape(megatron)}.", ""]
    if diff.modules:
        lines += ["| module | n | change |", "| --- | ---: | --- |"]
        for group in group_rows(diff.modules, expand, signature=_signature):
            lines.append(f"| {code(group.name)} | {group.count} | "
                         f"{escape(change_text(group.row, arrow=ARROW))} |")
    else:
        lines.append("No module changes.")
    for title, findings in (("New findings", diff.new), ("Fixed findings", diff.fixed)):
        if findings:
            lines += ["", f"#### {title}", ""] + finding_items(findings, expand)
    return "\n".join(lines) + "\n"


def render_diff(diff: ReportDiff, exit_code: int, fmt: str, *, width: int = 80,
                expand: bool = False) -> str:
    from qaudit.render.defuse import defuse

    return defuse(_render_diff(diff, exit_code, fmt, width=width, expand=expand))


def _render_diff(diff: ReportDiff, exit_code: int, fmt: str, *, width: int,
                 expand: bool) -> str:
    if fmt == "json":
        return json.dumps(diff.to_dict(exit_code), indent=2) + "\n"
    if fmt == "markdown":
        return render_diff_markdown(diff, exit_code, expand=expand)
    if fmt == "table":
        return render_diff_table(diff, exit_code, width=width, expand=expand)
    raise ValueError(f"unknown diff format {fmt!r}")


def load_side(path: str, recipe: str | None, options) -> Report:
    """A side of the diff: a JSON report (`*.json`) as written by `check --format json`, or a
    config audited now."""
    from qaudit.judge.baseline import apply_comments
    from qaudit.render.load import is_report_file, load_report

    if is_report_file(path):
        if recipe:
            from qaudit.errors import InputError
            raise InputError("a recipe option does not apply to a JSON report", file=path)
        return load_report(path)
    from qaudit.run.audit import audit_files

    return apply_comments(audit_files(path, recipe, options))


def emit_diff(diff: ReportDiff, exit_code: int, fmt: str, outputs: list[tuple[str, str]],
              *, expand: bool = False) -> None:
    """Like render.emit: everything rendered first; GitHub Actions extras for new findings."""
    import os
    import sys

    from qaudit.render import Emission, deliver, terminal_width
    from qaudit.render.github import annotation

    emission = Emission(render_diff(diff, exit_code, fmt, width=terminal_width(sys.stdout),
                                    expand=expand),
                        [(path, render_diff(diff, exit_code, f, expand=expand))
                         for f, path in outputs])
    if os.environ.get("GITHUB_ACTIONS") == "true":
        emission.stderr = "".join(annotation(f) + "\n" for f in diff.new)
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            emission.step_summary = (os.environ["GITHUB_STEP_SUMMARY"],
                                     render_diff(diff, exit_code, "markdown", expand=expand))
    deliver(emission)

