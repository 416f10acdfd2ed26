"""SARIF 2.1.0 for code scanning (GitHub, GitLab, IDEs): one result per finding, at the YAML
file and line that causes it; rule metadata from the rule registry.

Paths are repository-relative (git root of the current directory, else the current
directory), never absolute; there are no timestamps, so the same inputs give the same bytes.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from qaudit import __version__
from qaudit.render.common import finding_text, repo_relative
from qaudit.judge.report import Finding, Report

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def _rules() -> dict[str, Any]:
    from qaudit.judge.rules import load_rules

    return load_rules()


def _rule_descriptor(rule_id: str, registry: dict[str, Any], severity: str) -> dict[str, Any]:
    rule = registry.get(rule_id)
    title = getattr(rule, "title", "") or rule_id
    doc = inspect.cleandoc(getattr(rule, "doc", "") or "") or title
    level = LEVELS.get(getattr(rule, "severity", severity), "warning")
    return {
        "id": rule_id,
        "shortDescription": {"text": title},
        "fullDescription": {"text": doc},
        "help": {"text": doc},
        "defaultConfiguration": {"level": level},
    }


def _location(finding: Finding, report: Report) -> dict[str, Any]:
    file = finding.file or (report.config if report.config and not report.config.startswith("<")
                            else None)
    location: dict[str, Any] = {}
    if file:
        physical: dict[str, Any] = {"artifactLocation": {"uri": repo_relative(file),
                                                         "uriBaseId": "%SRCROOT%"}}
        if finding.file and finding.line:
            physical["region"] = {"startLine": int(finding.line)}
        location["physicalLocation"] = physical
    if finding.module:
        location["logicalLocations"] = [{"fullyQualifiedName": finding.module, "kind": "module"}]
    return location


def _result(finding: Finding, report: Report, index: dict[str, int]) -> dict[str, Any]:
    from qaudit.judge.baseline import fingerprint

    text = finding_text(finding, "Fix", "Evidence")
    result: dict[str, Any] = {
        "ruleId": finding.rule,
        "ruleIndex": index[finding.rule],
        "level": LEVELS.get(finding.severity, "warning"),
        "message": {"text": text},
        "partialFingerprints": {"qauditFingerprint/v1": fingerprint(finding)},
    }
    location = _location(finding, report)
    if location:
        result["locations"] = [location]
    suppression = getattr(finding, "suppression", None)
    if suppression:
        result["suppressions"] = [{
            "kind": "inSource" if suppression == "comment" else "external",
            "justification": ("`qaudit: ignore` comment" if suppression == "comment"
                              else "listed in the --baseline file"),
        }]
    properties = {}
    if finding.module:
        properties["module"] = finding.module
    if getattr(finding, "evidence", None):
        properties["evidence"] = finding.evidence
    if properties:
        result["properties"] = properties
    return result


def sarif_dict(report: Report, exit_code: int) -> dict[str, Any]:
    registry = _rules()
    suppressed = list(getattr(report, "suppressed", None) or [])
    findings = list(report.findings) + suppressed
    used = sorted({f.rule for f in findings})  # only the rules this run refers to
    severity_of = {f.rule: f.severity for f in findings}
    descriptors = [_rule_descriptor(r, registry, severity_of.get(r, "warning")) for r in used]
    index = {r: i for i, r in enumerate(used)}
    run: dict[str, Any] = {
        "tool": {"driver": {"name": "qaudit", "version": __version__, "rules": descriptors}},
        "results": [_result(f, report, index) for f in findings],
        "columnKind": "unicodeCodePoints",
        "invocations": [{"executionSuccessful": True, "exitCode": exit_code}],
        "properties": {"runtime": report.runtime, "policy": report.policy,
                       **({"megatron": report.megatron} if getattr(report, "megatron", None)
                          else {}),
                       **({"te": report.te} if getattr(report, "te", None) else {}),
                       "config": repo_relative(report.config)
                       if not report.config.startswith("<") else report.config,
                       "recipe": repo_relative(report.recipe) if report.recipe else None,
                       "steps": report.steps, "microbatches": report.microbatches},
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def render_sarif(report: Report, exit_code: int) -> str:
    return json.dumps(sarif_dict(report, exit_code), indent=2) + "\n"
