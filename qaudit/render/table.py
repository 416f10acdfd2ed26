"""Terminal table: header, the verdict (one entry per finding group, errors first), modules
(modules that behave alike collapsed over their layer, expert, stage and chunk numbers), the
findings in full, summary. Info notes are counted in the verdict and printed with `show_info`.

Fits `width` columns (80 unless the terminal is wider): when a module's row does not fit on one
line, its name and type go on one line and its behaviour on the next. Colour (ANSI) only when
asked for (`color=True`: a TTY without NO_COLOR, decided by the caller).
"""

from __future__ import annotations

import re
import textwrap
from typing import Callable

from qaudit.errors import printable
from qaudit.judge.report import SEVERITIES
from qaudit.render.common import (SHAPE_HEADERS, FindingGroup, RowGroup, calls_text,
                                  collapse_rows, compress_names, cross_check_line, format_error,
                                  group_findings, location, megatron_text, memory_line,
                                  observation_line, policy_text, shape_rows, shape_title,
                                  short_type, source_lines, summary_line, suppressed_findings,
                                  te_inference_lines, te_text)
from qaudit.judge.report import Report
from qaudit.plan.upstream.releases import policy_versions

DEFAULT_WIDTH = 80
GAP = "  "
INDENT = "  "
MIN_RECIPE = 8
MAX_TEXT_WIDTH = 100  # findings' prose wraps here even on wide terminals
VERDICT_NAMES = 3  # at most this many module names in a verdict entry, then "+N more"

_RESET = "\033[0m"
_STYLES = {"bad": "\033[1;31m", "ok": "\033[32m", "warning": "\033[33m", "info": "\033[36m",
           "dim": "\033[2m", "bold": "\033[1m"}
COLOR_SEQUENCES = (_RESET, *_STYLES.values())  # the only control sequences the table prints


def _painter(color: bool) -> Callable[[str, str], str]:
    def paint(text: str, style: str) -> str:
        if not color or not text or style not in _STYLES:
            return text
        return f"{_STYLES[style]}{text}{_RESET}"
    return paint


def _verdict_style(verdict: str) -> str:
    return "ok" if verdict == "ok" else "bad"


def _severity_style(severity: str) -> str:
    return {"error": "bad", "warning": "warning"}.get(severity, "info")


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:max(1, limit - 1)] + "~"


def _header(report: Report, width: int) -> list[str]:
    lines = [f"runtime: {report.runtime}   policy: {policy_text(report)}   "
             f"steps: {report.steps} x {report.microbatches} microbatches"]
    megatron = megatron_text(report)
    if megatron:
        lines.extend(_wrap(f"megatron: {megatron}", width, "", "  "))
    te = te_text(report)
    if te:
        lines.extend(_wrap(f"te: {te}", width, "", "  "))
    memory = memory_line(report)
    if memory:
        lines.extend(_wrap(memory, width, "", "  "))
    observation = observation_line(report)
    if observation:
        lines.extend(_wrap(observation, width, "", "  "))
    for line in te_inference_lines(report):
        lines.extend(_wrap(line, width, "", "    "))
    config = f"config: {printable(report.config)}"
    recipe = f"recipe: {report.recipe}" if report.recipe else ""
    if recipe and len(config) + 3 + len(recipe) <= width:
        lines.append(f"{config}   {recipe}")
    else:
        lines.append(config)
        if recipe:
            lines.append(recipe)
    for text in source_lines(report):
        lines.extend(_wrap(f"source: {text}", width, "", "  "))
    return lines


def _pad(cells: list[str], widths: list[int], right: set[int] = frozenset()) -> list[str]:
    return [cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths))]


def _join(cells: list[str], styled: list[str] | None = None) -> str:
    return GAP.join(styled or cells).rstrip()


def _styled(cell: str, style: str, paint) -> str:
    """Colour a padded cell's text, not its padding."""
    text = cell.rstrip()
    return paint(text, style) + cell[len(text):]


def split_name(name: str, width: int, indent: str = "    ") -> list[str]:
    """A module name too long for `width`, broken only after the commas of its index lists
    (`[0,2,4,...]`), never inside the name itself, so that it can be searched and copied; a
    piece still too long stays whole. Continuation lines indented."""
    if len(name) <= width:
        return [name]
    lines, current = [], ""
    for part in re.findall(r"[^,]+,?", name):  # commas appear only in index lists
        limit = width - (len(indent) if lines else 0)
        if current and len(current) + len(part) > limit:
            lines.append(current)
            current = ""
        current += part
    lines.append(current)
    return [lines[0]] + [indent + line for line in lines[1:]]


def _module_lines(groups: list[RowGroup], width: int, paint) -> list[str]:
    if not groups:
        return ["(no TE or linear modules)"]
    name_col = [g.name for g in groups]
    count_col = [str(g.count) for g in groups]
    type_col = [short_type(g.row.type) for g in groups]
    behaviour = [[g.row.precision, g.row.recipe, g.row.tracked, g.row.accumulation,
                  calls_text(g.row), g.row.verdict] for g in groups]
    errors = [g.grad_rel_error() for g in groups]
    show_error = any(e is not None for e in errors)
    head_behaviour = ["precision", "recipe", "tracked", "accumulation", "calls", "verdict"]

    def widths_of(columns: list[list[str]], heads: list[str]) -> list[int]:
        return [max([len(h)] + [len(c) for c in col]) for col, h in zip(columns, heads)]

    # One line per module when everything fits.
    heads = ["module", "n", "type"] + head_behaviour + (["grad err"] if show_error else [])
    columns = [name_col, count_col, type_col] + [list(c) for c in zip(*behaviour)] \
        + ([[format_error(e) for e in errors]] if show_error else [])
    widths = widths_of(columns, heads)
    if sum(widths) + len(GAP) * (len(widths) - 1) <= width:
        right = {1}
        lines = [_join(_pad(heads, widths, right)), "-" * (sum(widths) + len(GAP) * (len(widths) - 1))]
        for r in range(len(groups)):
            cells = _pad([col[r] for col in columns], widths, right)
            styled = list(cells)
            styled[8] = _styled(cells[8], _verdict_style(groups[r].row.verdict), paint)
            lines.append(_join(cells, styled))
        return lines

    # Two lines per module: `name  type  n`, then the behaviour, indented.
    behaviour_columns = [list(c) for c in zip(*behaviour)]
    b_widths = widths_of(behaviour_columns, head_behaviour)
    spare = width - len(INDENT) - sum(b_widths) - len(GAP) * (len(b_widths) - 1)
    if spare < 0:  # shorten the recipe names (the only free-form column) to fit
        b_widths[1] = max(MIN_RECIPE, b_widths[1] + spare)
        behaviour_columns[1] = [_truncate(c, b_widths[1]) for c in behaviour_columns[1]]
    t_width = max([len("type")] + [len(t) for t in type_col])
    n_width = max([len("n")] + [len(c) for c in count_col])
    name_width = max([len("module")] + [len(n) for n in name_col])
    name_width = min(name_width, width - len(GAP) * 2 - t_width - n_width)
    rule_width = min(width, max(name_width + len(GAP) * 2 + t_width + n_width,
                                len(INDENT) + sum(b_widths) + len(GAP) * (len(b_widths) - 1)))
    lines = [_join(_pad(["module", "type", "n"], [name_width, t_width, n_width], {2})),
             INDENT + _join(_pad(head_behaviour, b_widths)),
             "-" * rule_width]
    for r, group in enumerate(groups):
        pieces = split_name(group.name, name_width)
        if len(pieces[-1]) > name_width:  # whole on its own line; the columns on the next
            lines.extend(pieces)
            last = ""
        else:
            *head, last = pieces
            lines.extend(head)
        first = _pad([last, type_col[r], count_col[r]], [name_width, t_width, n_width], {2})
        first_line = _join(first)
        if errors[r] is not None:
            first_line += f"{GAP}grad err {format_error(errors[r])}"
        lines.append(first_line)
        cells = _pad([col[r] for col in behaviour_columns], b_widths)
        styled = list(cells)
        styled[5] = _styled(cells[5], _verdict_style(group.row.verdict), paint)
        lines.append(INDENT + _join(cells, styled))
    return lines


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def finding_lines(group: FindingGroup, width: int, paint=None,
                  fix_shown_above: bool = False) -> list[str]:
    """`fix_shown_above`: the finding just above has the same rule and fix text (QA090's
    advice for many settings): it is pointed to, not repeated."""
    paint = paint or _painter(False)
    f = group.first
    lead = f"{f.rule} {f.severity}  "
    body = group.text
    if len(group.modules) > 1:
        body = f"{len(group.modules)} modules: {body}"
    lines = _wrap(lead + body, width, "", " " * 6)
    lines[0] = lines[0].replace(lead, f"{f.rule} {paint(f.severity, _severity_style(f.severity))}  ", 1)
    if len(group.modules) > 1:
        names = compress_names(group.modules)
        pad = " " * 15
        for i, name in enumerate(names):
            parts = split_name(name, width - len(pad), "    ")
            if len(parts[0]) <= width - len(pad):
                lines.append(("      modules: " if i == 0 else pad) + parts[0])
                lines.extend(pad + part for part in parts[1:])
                continue
            # Never broken inside the name (MTP names reach 70 characters): on its own
            # line, less indented.
            if i == 0:
                lines.append("      modules:")
            lines.extend(" " * 8 + part for part in parts)
    where = location(f.file, f.line)
    if where:
        lines.append(f"      at {where}")
    if f.fix and fix_shown_above:
        lines.append("      fix: as above")
    elif f.fix:
        lines.extend(_wrap(f"fix: {f.fix}", width, " " * 6, " " * 11))
    evidence = getattr(f, "evidence", None)
    if evidence:
        lines.extend(_wrap(f"evidence: {evidence}", width, " " * 6, " " * 16))
    return lines


def _by_severity(groups: list[FindingGroup]) -> list[FindingGroup]:
    """Errors first, then warnings, then info; the report's order within each."""
    return sorted(groups, key=lambda g: SEVERITIES.index(g.first.severity)
                  if g.first.severity in SEVERITIES else len(SEVERITIES))


def _entry_lines(prefix: str, names: list[str], width: int) -> list[str]:
    """`prefix` and as many of the first names (at most VERDICT_NAMES) as fit on one line, then
    how many more; a first name too long for the line is wrapped, never cut."""
    for shown in range(min(VERDICT_NAMES, len(names)), 0, -1):
        rest = len(names) - shown
        line = prefix + ", ".join(names[:shown]) + (f", +{rest} more" if rest else "")
        if len(line) <= width or shown == 1:
            break
    if len(line) <= width:
        return [line]
    return _wrap(line, width, "", " " * 8)


def _verdict_entries(groups: list[FindingGroup]) -> list[tuple[FindingGroup, str, list[str]]]:
    """(group, what, names) per verdict entry: a group of modules as one entry, and the
    module-less findings of one rule with the same fix (QA090's settings) merged into one."""
    entries: list[tuple[FindingGroup, str, list[str]]] = []
    merged: dict[tuple, tuple[FindingGroup, str, list[str]]] = {}
    for group in _by_severity(groups):
        f = group.first
        if group.modules:
            count = len(group.modules)
            entries.append((group, f"{count} module{'s' if count != 1 else ''}: ",
                            compress_names(group.modules)))
            continue
        key = (f.rule, f.severity, f.fix)
        subject = group.text.split(": ", 1)[0] if ": " in group.text else group.text
        if key in merged and len(subject) <= 60:
            merged[key][2].append(subject)
            continue
        entry = (group, "", [subject if len(subject) <= 60 else group.text.splitlines()[0]])
        if len(subject) <= 60:
            merged[key] = entry
        entries.append(entry)
    return entries


def verdict_lines(groups: list[FindingGroup], summary: str, width: int, show_info: bool,
                  paint=None) -> list[str]:
    """The verdict before the table: the summary, then per finding group one line (rule,
    severity, how many modules, the first names) and its fix; info notes counted."""
    paint = paint or _painter(False)
    lines = [f"verdict: {summary}"]
    info = [g for g in groups if g.first.severity == "info"]
    for group, what, names in _verdict_entries(groups):
        f = group.first
        if f.severity == "info" and not show_info:
            continue
        lead = f"  {f.rule} {f.severity}  "
        if not what and len(names) > 1:
            what = f"{len(names)} settings: "
        elif not what:
            names = [group.text.splitlines()[0] if group.text else ""]
        if what or len(lead + names[0]) <= width:
            entry = _entry_lines(lead + what, names, width)
        else:
            # Wrapped, never cut: the reason is what the reader acts on.
            entry = _wrap(lead.lstrip() + names[0], width, "  ", " " * 8)
        entry[0] = entry[0].replace(lead, f"  {f.rule} {paint(f.severity, _severity_style(f.severity))}  ", 1)
        lines.extend(entry)
        if f.fix:
            lines.extend(_wrap(f"fix: {f.fix}", width, " " * 8, " " * 13))
    if info and not show_info:
        notes = sum(g.findings_count for g in info)
        per_rule: dict[str, int] = {}
        for g in info:
            per_rule[g.first.rule] = per_rule.get(g.first.rule, 0) + g.findings_count
        rules = ", ".join(f"{rule} x{n}" for rule, n in per_rule.items())
        lines.extend(_wrap(f"{notes} info note(s) ({rules}): --show-info prints them", width,
                           "  ", "    "))
    return lines


def _shape_lines(report: Report, width: int) -> list[str]:
    """-v: each quantized module group's GEMM on one rank at real width; the long module
    pattern goes last so the numbers stay aligned in a narrow terminal."""
    found = shape_rows(report)
    if found is None:
        return []
    split, rows = found
    lines = [""] + _wrap(shape_title(split, len(rows)), width, "", "  ")
    order = [1, 2, 3, 4, 5, 0]
    heads = [SHAPE_HEADERS[i] for i in order]
    cells = [[r[i] for i in order] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines.append(_join(_pad(heads, widths, right={0, 2, 3, 4})))
    lines.extend(_join(_pad(c, widths, right={0, 2, 3, 4})) for c in cells)
    return lines


def _policy_lines(policies) -> list[str]:
    """The verdict of each module group under each tracking policy (--compare-policies)."""
    lines = ["", "verdict under each tracking policy (and the Megatron versions that have it):"]
    if not isinstance(policies, dict):
        return lines + [f"  {policies}"]
    names: list[str] = []
    for verdicts in policies.values():
        for name in (verdicts if isinstance(verdicts, dict) else {}):
            if name not in names:
                names.append(name)
    rows = [[str(group)] + [str(v.get(n, "-")) if isinstance(v, dict) else str(v) for n in names]
            for group, v in policies.items()]
    heads = ["module group"] + names
    versions = [""] + [policy_versions(name) for name in names]
    widths = [max([len(h), len(v)] + [len(r[i]) for r in rows])
              for i, (h, v) in enumerate(zip(heads, versions))]
    lines.append(INDENT + _join(_pad(heads, widths)))
    lines.append(INDENT + _join(_pad(versions, widths)))
    lines.extend(INDENT + _join(_pad(r, widths)) for r in rows)
    return lines


def _suggestion_lines(suggestions, width: int) -> list[str]:
    """Remedies re-audited by --suggest: whether each passes, its cost and the change in the
    input's own syntax."""
    lines = ["", "suggested remedies (each re-audited; those that pass first):"]
    failing_said = False
    for item in suggestions if isinstance(suggestions, list) else [suggestions]:
        if not isinstance(item, dict):
            lines.extend(_wrap(f"- {item}", width, "  ", "    "))
            continue
        if not item.get("passes") and not failing_said:
            lines.append("  remedies that do not pass here:")
            failing_said = True
        status = "passes" if item.get("passes") else (
            f"does not pass: {item.get('remaining_errors', '?')} error(s) remain")
        lines.extend(_wrap(f"- {item.get('remedy', '?')} [{status}]", width, "  ", "    "))
        if item.get("cost"):
            lines.extend(_wrap(f"cost: {item['cost']}", width, "    ", "          "))
        if item.get("yaml"):
            lines.append("    change:")
            lines.extend("      " + line for line in str(item["yaml"]).rstrip().splitlines())
    return lines


def render_table(report: Report, exit_code: int, *, width: int = DEFAULT_WIDTH,
                 color: bool = False, expand: bool = False, show_info: bool = False) -> str:
    paint = _painter(color)
    text_width = min(width, MAX_TEXT_WIDTH)
    groups = group_findings(report.findings, expand)
    lines = _header(report, width)
    lines.append("")
    lines.extend(verdict_lines(groups, summary_line(report, exit_code), text_width, show_info,
                               paint))
    lines.append("")
    lines.extend(_module_lines(collapse_rows(report.modules, expand), width, paint))
    policies = getattr(report, "policies", None)
    if policies:
        lines.extend(_policy_lines(policies))
    detailed = [g for g in _by_severity(groups) if show_info or g.first.severity != "info"]
    if detailed:
        lines.append("")
    above = None
    for group in detailed:
        same = above is not None and (above.rule, above.fix) == (group.first.rule,
                                                                  group.first.fix)
        lines.extend(finding_lines(group, text_width, paint, fix_shown_above=same))
        above = group.first
    suggestions = getattr(report, "suggestions", None)
    if suggestions:
        lines.extend(_suggestion_lines(suggestions, text_width))
    if show_info:
        lines.extend(_shape_lines(report, text_width))
    suppressed = suppressed_findings(report)
    if suppressed:
        lines.append("")
        lines.append(f"{len(suppressed)} finding(s) suppressed (baseline or `qaudit: ignore`); "
                     "--format json lists them")
    cross_check = cross_check_line(report)
    if cross_check:
        lines.extend(_wrap(cross_check, text_width, "", "  "))
    code_style = "ok" if exit_code == 0 else "bad"
    summary = summary_line(report, exit_code)
    lines.append(summary[:summary.rindex("exit")] + paint(f"exit {exit_code}", code_style))
    return "\n".join(lines) + "\n"
