"""Outputs of one `qaudit check` run over several configs: one summary line per file (table),
every file's report (markdown, github), or one document carrying them all (json, sarif)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qaudit.errors import printable
from qaudit.judge.report import SEVERITIES, Report
from qaudit.render.common import repo_relative, summary_counts

MANY_SCHEMA = "qaudit/files-1"
ONE_FILE_FORMATS = ("svg",)  # a precision map is of one model


@dataclass
class Audited:
    """One config of the run: its report and exit code, or the error that refused it."""

    path: str
    code: int
    report: Report | None = None
    error: str | None = None


def worst_code(items: list[Audited]) -> int:
    return max((item.code for item in items), default=0)


def _rules_text(report: Report) -> str:
    """Each rule with errors or warnings, most severe first: how many findings and the first
    module (or setting) it names, so the line says what to look at."""
    firsts: dict[str, tuple[int, str, int]] = {}
    for finding in report.findings:
        if finding.severity == "info":
            continue
        rank = SEVERITIES.index(finding.severity)
        where = finding.module or finding.message.split(":", 1)[0]
        rank_, first, count = firsts.get(finding.rule, (rank, where, 0))
        firsts[finding.rule] = (min(rank, rank_), first, count + 1)
    parts = [f"{rule} on {first}" + (f" (+{count - 1} more)" if count > 1 else "")
             for rule, (_, first, count) in sorted(firsts.items(),
                                                    key=lambda item: (item[1][0], item[0]))]
    return "; ".join(parts)


def _line(item: Audited) -> str:
    """One file's summary line: one line whatever the file is named (a newline in a name
    would otherwise start a line of its own, in `github` a workflow command)."""
    if item.report is None:
        return f"exit {item.code}  {_name(item.path)}: {printable(item.error or '')}"
    rules = printable(_rules_text(item.report))
    return (f"exit {item.code}  {_name(item.path)}: {summary_counts(item.report)}"
            + (f" -- {rules}" if rules else ""))


def _name(path: str) -> str:
    """A file name on one of this module's own lines: every control character escaped (so
    no newline starts a line with it) and the legacy `##[` command form broken."""
    return printable(path).replace("##[", "#\\#[")


def render_many(items: list[Audited], fmt: str, show_info: bool = False) -> str:
    """Every format goes through `defuse`, as one report's does (render/defuse.py)."""
    from qaudit.render.defuse import defuse

    return defuse(_render_many(items, fmt, show_info), commands=fmt != "github")


def _render_many(items: list[Audited], fmt: str, show_info: bool) -> str:
    worst = worst_code(items)
    if fmt == "table":
        lines = [_line(item) for item in items]
        lines.append(f"{len(items)} files, worst exit {worst}; `qaudit check FILE` shows one "
                     "file's report")
        return "\n".join(lines) + "\n"
    if fmt == "json":
        return json.dumps(_json(items), indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(_sarif(items), indent=2) + "\n"
    from qaudit.render import render

    if fmt == "markdown":
        parts = [render(item.report, item.code, "markdown") if item.report is not None
                 else f"**{_name(item.path)}**: {printable(item.error or '')} (exit {item.code})\n"
                 for item in items]
        return "\n---\n\n".join(parts)
    if fmt == "github":
        out = []
        for item in items:
            if item.report is not None:
                from qaudit.render.github import render_annotations

                out.append(render_annotations(item.report, show_info))
            out.append(f"qaudit: {_line(item)}\n")
        return "".join(out)
    raise ValueError(f"format {fmt!r} takes one config")


def _json(items: list[Audited]) -> dict[str, Any]:
    files = []
    for item in items:
        entry: dict[str, Any] = {"path": item.path, "exit_code": item.code}
        if item.report is not None:
            report = item.report.to_dict()
            report["exit_code"] = item.code
            entry["report"] = report
        else:
            entry["error"] = item.error
        files.append(entry)
    return {"schema": MANY_SCHEMA, "exit_code": worst_code(items), "files": files}


def _sarif(items: list[Audited]) -> dict[str, Any]:
    """One run with every file's results (code scanning takes one run per tool and category);
    a refused file is a tool notification."""
    from qaudit.render.sarif import sarif_dict

    runs = [sarif_dict(item.report, item.code)["runs"][0] for item in items
            if item.report is not None]
    descriptors: dict[str, Any] = {}
    for run in runs:
        for descriptor in run["tool"]["driver"]["rules"]:
            descriptors.setdefault(descriptor["id"], descriptor)
    order = sorted(descriptors)
    index = {rule: i for i, rule in enumerate(order)}
    results = []
    for run in runs:
        for result in run["results"]:
            results.append({**result, "ruleIndex": index[result["ruleId"]]})
    from qaudit.render.sarif import SARIF_SCHEMA
    from qaudit import __version__

    notifications = [{"level": "error", "message": {"text": f"{item.path}: {item.error}"}}
                     for item in items if item.report is None]
    invocation: dict[str, Any] = {"executionSuccessful": True, "exitCode": worst_code(items)}
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    run = {
        "tool": {"driver": {"name": "qaudit", "version": __version__,
                            "rules": [descriptors[rule] for rule in order]}},
        "results": results,
        "columnKind": "unicodeCodePoints",
        "invocations": [invocation],
        "properties": {"configs": [repo_relative(item.path) for item in items]},
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
