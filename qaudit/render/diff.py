"""`qaudit diff` as text: a table, Markdown or JSON of what changes between two reports."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from qaudit.judge.diff import LABELS, FindingChange, ModuleChange, ReportDiff
from qaudit.judge.report import Report
from qaudit.render.common import calls_text, collapse_rows, compress_names

ARROW = "\u2192"  # Markdown only; the table keeps ASCII "->"


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


def changed_groups(changes: list[FindingChange]) -> list[tuple[str, list[str]]]:
    """Changed findings grouped as the verdict groups findings: one line per rule, severity
    and change, with its modules' names collapsed (`mtp.layers.0.[...]`)."""
    groups: dict[tuple, list[str]] = {}
    for change in changes:
        what = "; ".join(f"{name} {b or '-'} -> {h or '-'}"
                         for name, (b, h) in change.changes.items())
        head = change.head
        key = (head.rule, head.severity, what)
        groups.setdefault(key, []).append(head.module or head.message.split(":")[0])
    return [(f"{rule} {severity}  {what}", compress_names(names))
            for (rule, severity, what), names in groups.items()]


def header_fields(diff: ReportDiff) -> list[tuple[str, str]]:
    """The header lines (runtime, policy, steps, megatron, te): once where both sides agree,
    each side's where they differ, so that a diff across Megatrons or policies says so."""
    from qaudit.render.common import megatron_text, policy_text, te_text

    def fields(report: Report) -> list[tuple[str, str | None]]:
        return [("runtime", str(report.runtime)), ("policy", policy_text(report)),
                ("steps", f"{report.steps} x {report.microbatches} microbatches"),
                ("megatron", megatron_text(report)), ("te", te_text(report))]

    out = []
    for (name, base), (_, head) in zip(fields(diff.base), fields(diff.head)):
        if base == head:
            if head is not None:
                out.append((name, head))
        else:
            out.append((f"{name} (base)", base or "not named"))
            out.append((f"{name} (head)", head or "not named"))
    return out


def _summary(diff: ReportDiff, exit_code: int) -> str:
    counts = Counter(f.severity for f in diff.new)
    fixed = Counter(f.severity for f in diff.fixed)
    return (f"{len(diff.modules)} module(s) changed; new: {counts.get('error', 0)} error(s), "
            f"{counts.get('warning', 0)} warning(s), {counts.get('info', 0)} info; "
            + (f"changed: {len(diff.changed)}; " if diff.changed else "")
            + f"fixed: {sum(fixed.values())}   exit {exit_code}")


def render_diff_table(diff: ReportDiff, exit_code: int, *, width: int = 80,
                      expand: bool = False) -> str:
    import textwrap

    from qaudit.render.common import group_findings
    from qaudit.render.table import finding_lines

    def wrap(text: str, first: str = "", rest: str = "      ") -> list[str]:
        return textwrap.wrap(text, width=min(width, 100), initial_indent=first,
                             subsequent_indent=rest, break_long_words=False,
                             break_on_hyphens=False) or [first]

    base, head = diff.base, diff.head
    lines = [f"base: {base.config}" + (f"   recipe: {base.recipe}" if base.recipe else ""),
             f"head: {head.config}" + (f"   recipe: {head.recipe}" if head.recipe else "")]
    fields = header_fields(diff)
    if [name for name, _ in fields[:3]] == ["runtime", "policy", "steps"]:  # both sides agree
        lines.append("   ".join(f"{name}: {text}" for name, text in fields[:3]))
        fields = fields[3:]
    for name, text in fields:
        lines.extend(wrap(f"{name}: {text}", "", "  "))
    lines.append("")
    if not diff.modules:
        lines.append("no module changes")
    else:
        lines.append("module changes:")
        for group in collapse_rows(diff.modules, expand, signature=_signature):
            count = f"  (x{group.count})" if group.count > 1 else ""
            lines.append(group.name + count)
            lines.extend(wrap(change_text(group.row), "  ", "    "))
    if diff.changed:
        lines += ["", f"changed findings ({len(diff.changed)}):"]
        for what, names in changed_groups(diff.changed):
            lines.extend(wrap(what))
            lines.extend(wrap(", ".join(names), "      modules: ", " " * 15))
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
    from qaudit.render.markdown import code, escape, finding_items

    status = "\u274c" if exit_code else "\u2705"
    new = Counter(f.severity for f in diff.new)
    lines = [f"{status} **qaudit diff {code(diff.base.config)} \u2192 {code(diff.head.config)}: "
             f"{new.get('error', 0)} new error(s), {new.get('warning', 0)} new warning(s), "
             f"{len(diff.changed)} changed, {len(diff.fixed)} fixed** (exit {exit_code})", ""]
    lines += [f"- {escape(name)}: {escape(text)}" for name, text in header_fields(diff)] + [""]
    if diff.modules:
        lines += ["| module | n | change |", "| --- | ---: | --- |"]
        for group in collapse_rows(diff.modules, expand, signature=_signature):
            lines.append(f"| {code(group.name)} | {group.count} | "
                         f"{escape(change_text(group.row, arrow=ARROW))} |")
    else:
        lines.append("No module changes.")
    if diff.changed:
        lines += ["", "#### Changed findings", ""]
        lines += [f"- **{escape(what.replace(' -> ', f' {ARROW} '))}**: "
                  + ", ".join(code(name) for name in names)
                  for what, names in changed_groups(diff.changed)]
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
