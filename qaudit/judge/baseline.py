"""Baselines and in-file suppressions: report only what is new.

A finding's fingerprint is its rule, its module and a key, never a line number, so that
editing the YAML above a known problem does not make it "new":

- a finding about a module: the key is empty (rule + module name identify it);
- a finding about a recipe entry (matcher or config, no module): the key is the first quoted
  name in the message, e.g. `'attention'`;
- anything else: the message with its numbers masked.

`--write-baseline FILE` records today's findings; `--baseline FILE` moves the findings it
lists to `report.suppressed` (each as often as it was recorded), so the exit code and the
summary count only the new ones. A `# qaudit: ignore[QA010]` (or `# qaudit: ignore` for every
rule) comment on the line a finding points at, or alone on the line above it, suppresses that
finding too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from qaudit.load.jsonfile import read_qaudit_json
from qaudit.files.outputs import check_output_path
from qaudit.judge.report import Finding, Report

BASELINE_SCHEMA = "qaudit-baseline/1"
_QUOTED = re.compile(r"'([^']+)'")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_IGNORE = re.compile(r"#\s*qaudit:\s*ignore(?:\[(?P<rules>[A-Za-z0-9_,\s]+)\])?")
_MAX_BASELINE_BYTES = 16 * 1024 * 1024


@dataclass(kw_only=True)
class SuppressedFinding(Finding):
    """A finding that was found but is not reported: `baseline` or `comment`."""

    suppression: str = "baseline"


def finding_key(finding: Finding) -> str:
    if finding.module:
        return ""
    quoted = _QUOTED.search(finding.message)
    if quoted:
        return f"'{quoted.group(1)}'"
    return _NUMBER.sub("#", " ".join(finding.message.split()))


def fingerprint(finding: Finding) -> str:
    text = "\x1f".join((finding.rule, finding.module or "", finding_key(finding)))
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def baseline_entries(findings: list[Finding]) -> list[dict[str, Any]]:
    entries = [{"fingerprint": fingerprint(f), "rule": f.rule, "module": f.module,
                "key": finding_key(f), "severity": f.severity, "message": f.message}
               for f in findings]
    return sorted(entries, key=lambda e: (e["rule"], e["module"] or "", e["key"], e["fingerprint"]))


def baseline_text(report: Report) -> str:
    """Today's findings (reported and baselined, not those ignored by comments), stable bytes."""
    known = list(report.findings) + [f for f in (report.suppressed or [])
                                      if getattr(f, "suppression", "baseline") == "baseline"]
    data = {"schema": BASELINE_SCHEMA, "config": report.config, "recipe": report.recipe,
            "findings": baseline_entries([_plain(f) for f in known])}
    return json.dumps(data, indent=2) + "\n"


def _plain(finding: Finding) -> Finding:
    if isinstance(finding, SuppressedFinding):
        fields = {k: v for k, v in asdict(finding).items() if k != "suppression"}
        return Finding(**fields)
    return finding


def load_baseline(path: str) -> Counter:
    """Fingerprint -> how many findings with it the baseline accepts. Bad file: InputError."""
    data = read_qaudit_json(path, kind="baseline", schema=BASELINE_SCHEMA,
                            schema_file="baseline-v1.schema.json", max_bytes=_MAX_BASELINE_BYTES,
                            not_found="baseline file not found (write one with --write-baseline)")
    return Counter(entry["fingerprint"] for entry in data["findings"])  # shapes checked above


def apply_baseline(report: Report, accepted: Counter) -> Report:
    """Move the findings the baseline accepts to `suppressed`; the rest stay (they are new)."""
    left = Counter(accepted)
    new, suppressed = [], list(report.suppressed or [])
    for finding in report.findings:
        key = fingerprint(finding)
        if left[key] > 0:
            left[key] -= 1
            suppressed.append(SuppressedFinding(**asdict(finding), suppression="baseline"))
        else:
            new.append(finding)
    return replace(report, findings=new, suppressed=suppressed)


def _ignored_rules(lines: list[str], line: int) -> set[str] | None:
    """Rules a `qaudit: ignore` comment on `line` (or alone just above it) names; {"*"}: all."""
    candidates = []
    if 1 <= line <= len(lines):
        candidates.append(lines[line - 1])
    if 2 <= line <= len(lines) + 1 and lines[line - 2].lstrip().startswith("#"):
        candidates.append(lines[line - 2])
    found: set[str] = set()
    for text in candidates:
        for match in _IGNORE.finditer(text):
            rules = match.group("rules")
            if rules is None:
                found.add("*")
            else:
                found.update(r.strip().upper() for r in rules.split(",") if r.strip())
    return found or None


def apply_comments(report: Report) -> Report:
    """Suppress findings whose YAML line carries `# qaudit: ignore[RULE]`."""
    cache: dict[str, list[str] | None] = {}
    kept, suppressed = [], list(report.suppressed or [])
    for finding in report.findings:
        rules = None
        if finding.file and finding.line:
            if finding.file not in cache:
                try:
                    cache[finding.file] = Path(finding.file).read_text(encoding="utf-8").splitlines()
                except (OSError, UnicodeDecodeError):
                    cache[finding.file] = None
            lines = cache[finding.file]
            if lines is not None:
                rules = _ignored_rules(lines, finding.line)
        if rules and ("*" in rules or finding.rule.upper() in rules):
            suppressed.append(SuppressedFinding(**asdict(finding), suppression="comment"))
        else:
            kept.append(finding)
    if len(kept) == len(report.findings):
        return report
    return replace(report, findings=kept, suppressed=suppressed)


@dataclass
class BaselinePlan:
    """What `check` does with baselines: the accepted fingerprints and where to write one."""

    accepted: Counter | None = None
    write_path: str | None = None

    def apply(self, report: Report) -> Report:
        report = apply_comments(report)
        if self.accepted is not None:
            report = apply_baseline(report, self.accepted)
        return report

    def files(self, report: Report) -> list[tuple[str, str]]:
        return [(self.write_path, baseline_text(report))] if self.write_path else []


def prepare_baseline(baseline: str | None, write_baseline: str | None) -> BaselinePlan:
    """Read `--baseline` and check `--write-baseline`'s folder before the audit runs."""
    accepted = load_baseline(baseline) if baseline else None
    if write_baseline:
        check_output_path(write_baseline, "--write-baseline")
    return BaselinePlan(accepted, write_baseline)
