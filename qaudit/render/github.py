"""GitHub Actions workflow commands: one `::error file=…,line=…,title=QA001::message` line per
finding group (as the table's verdict groups them: same rule, message, place and fix), with
the modules it names listed, so findings show on the changed lines of a pull request without
ten identical annotations for ten modules of one repeated layer. Paths are
repository-relative.

Info notes are harmless (a clean GPT-3 175B dump has 384), and GitHub lists every annotation
on the run's page, so they become ONE notice saying how many there are and how to see them;
`--show-info` annotates each, as it prints each in the table."""

from __future__ import annotations

from qaudit.render.common import (FindingGroup, finding_text, group_findings, repo_relative,
                                  summary_line)
from qaudit.judge.report import Finding, Report

COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(command: str, file: str | None, line: int | None, title: str, text: str) -> str:
    properties = []
    if file:
        properties.append(f"file={_escape_property(repo_relative(file))}")
        if line:
            properties.append(f"line={int(line)}")
    properties.append(f"title={_escape_property(title)}")
    return f"::{command} {','.join(properties)}::{_escape_data(text)}"


def annotation(finding: Finding) -> str:
    return _command(COMMANDS.get(finding.severity, "warning"), finding.file, finding.line,
                    finding.rule, finding_text(finding))


def group_annotation(group: FindingGroup) -> str:
    """One annotation for a group: the message once, then every module it names."""
    finding = group.first
    if len(group.modules) <= 1:
        return annotation(finding)
    text = (f"{len(group.modules)} modules: {group.text}\nmodules: {', '.join(group.modules)}")
    if finding.fix:
        text += f"\nfix: {finding.fix}"
    evidence = getattr(finding, "evidence", None)
    if evidence:
        text += f"\nevidence: {evidence}"
    return _command(COMMANDS.get(finding.severity, "warning"), finding.file, finding.line,
                    finding.rule, text)


def info_notice(report: Report) -> str | None:
    """One notice for every info note: how many, of which rules, and how to see them."""
    per_rule: dict[str, int] = {}
    for finding in report.findings:
        if finding.severity == "info":
            per_rule[finding.rule] = per_rule.get(finding.rule, 0) + 1
    if not per_rule:
        return None
    rules = ", ".join(f"{rule} x{count}" for rule, count in per_rule.items())
    count = sum(per_rule.values())
    return _command("notice", report.config, None, "qaudit info",
                    f"{count} info note(s) ({rules}), not annotated one by one: add "
                    "--show-info to annotate each, or run qaudit check on this config with "
                    "--show-info to print them")


def render_annotations(report: Report, show_info: bool = False) -> str:
    """Only the workflow commands (for stderr next to another format)."""
    shown = [f for f in report.findings if show_info or f.severity != "info"]
    lines = [group_annotation(group) for group in group_findings(shown)]
    if not show_info and (notice := info_notice(report)):
        lines.append(notice)
    return "".join(line + "\n" for line in lines)


def render_github(report: Report, exit_code: int, show_info: bool = False) -> str:
    return render_annotations(report, show_info) + f"qaudit: {summary_line(report, exit_code)}\n"
