"""GitHub-flavoured Markdown, ready to paste in a pull request or a job summary.

A summary line, the findings, then the module table (folded in `<details>` when long).
"""

from __future__ import annotations

import re

from qaudit.render.common import (SHAPE_HEADERS, calls_text, collapse_names, cross_check_line,
                                  format_error, group_findings, group_rows, location,
                                  megatron_text, memory_line, observation_line, policy_text,
                                  te_inference_lines,
                                  severity_counts, shape_rows, shape_title, short_type,
                                  summary_counts, suppressed_findings, te_text)
from qaudit.errors import printable
from qaudit.judge.report import Report
from qaudit.plan.upstream.releases import policy_versions

FOLD_ROWS = 15  # more table rows than this go into a <details> block

_PROSE_SPECIAL = re.compile(r"([\\`*<>|\[\]])")  # `_` is safe inside words (GFM)


def escape(text: str) -> str:
    """Plain text as Markdown prose: no accidental emphasis, HTML, links or table breaks, and
    no newline from user input (a line starting `::` would be a GitHub Actions command)."""
    return _PROSE_SPECIAL.sub(r"\\\1", " ".join(text.splitlines()))


def code(text: str) -> str:
    """Text as an inline code span (safe in a table cell, one line: a newline in a name is
    written `\\n`)."""
    text = printable(text).replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _status(report: Report, exit_code: int) -> str:
    counts = severity_counts(report)
    if exit_code != 0 or counts["error"]:
        return "\u274c"  # red cross
    if counts["warning"]:
        return "\u26a0\ufe0f"  # warning sign
    return "\u2705"  # green check


def summary_line(report: Report, exit_code: int) -> str:
    return (f"{_status(report, exit_code)} **qaudit {code(report.config)}: "
            f"{summary_counts(report)}** (exit {exit_code})")


def _context(report: Report) -> str:
    bits = [f"runtime {code(report.runtime)}", f"policy {code(policy_text(report))}",
            f"{report.steps} step(s) x {report.microbatches} microbatch(es)"]
    if report.recipe:
        bits.insert(0, f"recipe {code(report.recipe)}")
    megatron = megatron_text(report)
    if megatron:
        bits.append(f"for {escape(megatron)}")
    te = te_text(report)
    if te:
        bits.append(f"with {escape(te)}")
    return " · ".join(bits)


def _findings(report: Report, expand: bool) -> list[str]:
    return ["#### Findings", ""] + finding_items(report.findings, expand)


def finding_items(findings: list, expand: bool = False) -> list[str]:
    """Findings as a Markdown list; those that differ only in their module are merged."""
    lines: list[str] = []
    for group in group_findings(findings, expand):
        f = group.first
        text = group.text
        if len(group.modules) > 1:
            text = f"{len(group.modules)} modules: {text}"
        lines.append(f"- **{f.rule}** {f.severity}: {escape(text)}")
        if len(group.modules) > 1:
            lines.append("  - modules: " + ", ".join(code(n) for n in collapse_names(group.modules)))
        where = location(f.file, f.line)
        if where:
            lines.append(f"  - at {code(where)}")
        if f.fix:
            lines.append(f"  - fix: {escape(f.fix)}")
        evidence = getattr(f, "evidence", None)
        if evidence:
            lines.append(f"  - evidence: {escape(evidence)}")
    return lines


def _table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    out.extend("| " + " | ".join(row) + " |" for row in rows)
    return out


def _modules(report: Report, expand: bool) -> list[str]:
    groups = group_rows(report.modules, expand)
    errors = [g.grad_rel_error() for g in groups]
    show_error = any(e is not None for e in errors)
    headers = ["module", "n", "type", "precision", "recipe", "tracked", "accumulation", "calls",
               "verdict"] + (["grad err"] if show_error else [])
    rows = []
    for group, error in zip(groups, errors):
        row = group.row
        verdict = code(row.verdict) if row.verdict == "ok" else f"**{code(row.verdict)}**"
        cells = [code(group.name), str(group.count), code(short_type(row.type)),
                 code(row.precision), code(row.recipe), row.tracked, row.accumulation,
                 escape(calls_text(row)), verdict]
        if show_error:
            cells.append(format_error(error))
        rows.append(cells)
    table = _table(headers, rows, right={1})
    total = len(report.modules)
    if len(groups) <= FOLD_ROWS:
        return ["#### Modules", ""] + table
    return ([f"<details><summary>Modules: {len(groups)} rows for {total} TE/linear modules "
             "(consecutive identical layers collapsed)</summary>", ""]
            + table + ["", "</details>"])


def _shapes(report: Report) -> list[str]:
    """Folded: the reviewer opens it when a recipe or TP size changes."""
    found = shape_rows(report)
    if found is None:
        return []
    split, rows = found
    cells = [[code(r[0])] + r[1:2] + [code(r[2])] + r[3:] for r in rows]
    return ([f"<details><summary>{escape(shape_title(split, len(rows)))}</summary>", ""]
            + _table(SHAPE_HEADERS, cells, right={1, 3, 4, 5}) + ["", "</details>"])


def _policies(policies) -> list[str]:
    lines = ["#### Verdict under each tracking policy", ""]
    if not isinstance(policies, dict):
        return lines + [escape(str(policies))]
    names: list[str] = []
    for verdicts in policies.values():
        for name in (verdicts if isinstance(verdicts, dict) else {}):
            if name not in names:
                names.append(name)
    rows = [[code(str(group))] + [code(str(v.get(n, "-"))) if isinstance(v, dict)
                                  else escape(str(v)) for n in names]
            for group, v in policies.items()]
    return lines + _table(["module group"] + [f"{code(n)} ({escape(policy_versions(n))})"
                                              for n in names], rows)


def _suggestions(suggestions) -> list[str]:
    lines = ["#### Suggested remedies (each re-audited; those that pass first)", ""]
    failing_said = False
    for item in suggestions if isinstance(suggestions, list) else [suggestions]:
        if not isinstance(item, dict):
            lines.append(f"- {escape(str(item))}")
            continue
        if not item.get("passes") and not failing_said:
            lines.extend(["Remedies that do not pass here:", ""])
            failing_said = True
        status = "passes" if item.get("passes") else (
            f"does not pass: {item.get('remaining_errors', '?')} error(s) remain")
        lines.append(f"- **{escape(str(item.get('remedy', '?')))}**: {status}")
        if item.get("cost"):
            lines.append(f"  - cost: {escape(str(item['cost']))}")
        if item.get("yaml"):
            lines.extend(["", "  ```yaml"] + ["  " + line for line in
                                              str(item["yaml"]).rstrip().splitlines()]
                         + ["  ```", ""])
    return lines


def render_markdown(report: Report, exit_code: int, *, expand: bool = False) -> str:
    lines = [summary_line(report, exit_code), "", _context(report), ""]
    cross_check = cross_check_line(report)
    if cross_check:
        lines.extend([escape(cross_check), ""])
    memory = memory_line(report)
    if memory:
        lines.extend([escape(memory), ""])
    observation = observation_line(report)
    if observation:
        lines.extend([escape(observation), ""])
    inference = te_inference_lines(report)
    if inference:
        items = [f"- {escape(line.strip())}" for line in inference[1:]]
        lines.extend([escape(inference[0]), ""] + items + ([""] if items else []))
    if report.findings:
        lines.extend(_findings(report, expand) + [""])
    suppressed = suppressed_findings(report)
    if suppressed:
        lines.extend([f"{len(suppressed)} finding(s) suppressed by a baseline or a "
                      "`qaudit: ignore` comment.", ""])
    suggestions = getattr(report, "suggestions", None)
    if suggestions:
        lines.extend(_suggestions(suggestions) + [""])
    policies = getattr(report, "policies", None)
    if policies:
        lines.extend(_policies(policies) + [""])
    lines.extend(_modules(report, expand))
    shapes = _shapes(report)
    if shapes:
        lines.extend([""] + shapes)
    return "\n".join(lines) + "\n"
