"""GitHub Actions workflow commands: one `::error file=…,line=…,title=QA001::message` line per
finding (`::warning` / `::notice` for lower severities), so findings show on the changed
lines of a pull request. Paths are repository-relative."""

from __future__ import annotations

from qaudit.render.common import finding_text, repo_relative, summary_line
from qaudit.judge.report import Finding, Report

COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(finding: Finding) -> str:
    properties = []
    if finding.file:
        properties.append(f"file={_escape_property(repo_relative(finding.file))}")
        if finding.line:
            properties.append(f"line={int(finding.line)}")
    properties.append(f"title={_escape_property(finding.rule)}")
    command = COMMANDS.get(finding.severity, "warning")
    return f"::{command} {','.join(properties)}::{_escape_data(finding_text(finding))}"


def render_annotations(report: Report) -> str:
    """Only the workflow commands (for stderr next to another format)."""
    return "".join(annotation(f) + "\n" for f in report.findings)


def render_github(report: Report, exit_code: int) -> str:
    return render_annotations(report) + f"qaudit: {summary_line(report, exit_code)}\n"
