"""Terminal table: header, one row per module, findings, summary."""

from __future__ import annotations

import textwrap

from tabulate import tabulate

from qaudit.report import Report

HEADERS = ("module", "type", "precision", "recipe", "tracked", "accumulation", "calls/mb", "verdict")


def _location(file: str | None, line: int | None) -> str:
    if not file:
        return ""
    return f"{file}:{line}" if line else file


def summary_line(report: Report, exit_code: int) -> str:
    counts = report.counts()
    parts = [f"{counts.get('error', 0)} error(s)", f"{counts.get('warning', 0)} warning(s)"]
    if counts.get("info"):
        parts.append(f"{counts['info']} info")
    return ", ".join(parts) + f"   exit {exit_code}"


def render_table(report: Report, exit_code: int) -> str:
    lines = [f"runtime: {report.runtime}   policy: {report.policy}   "
             f"steps: {report.steps} x {report.microbatches} microbatches",
             f"config: {report.config}" + (f"   recipe: {report.recipe}" if report.recipe else "")]
    rows = []
    for row in report.modules:
        calls = str(row.calls_per_microbatch)
        if row.nograd_calls_per_microbatch:
            calls += f" (+{row.nograd_calls_per_microbatch} no-grad)"
        rows.append((row.name, row.type, row.precision, row.recipe, row.tracked, row.accumulation,
                     calls, row.verdict))
    lines.append(tabulate(rows, headers=HEADERS, tablefmt="simple", disable_numparse=True))
    if report.findings:
        lines.append("")
    for finding in report.findings:
        lines.append(f"{finding.rule} {finding.severity}  {finding.message}")
        location = _location(finding.file, finding.line)
        if location:
            lines.append(f"      at {location}")
        if finding.fix:
            lines.extend(textwrap.wrap(f"fix: {finding.fix}", width=100,
                                       initial_indent="      ", subsequent_indent="           "))
    lines.append(summary_line(report, exit_code))
    return "\n".join(lines) + "\n"
