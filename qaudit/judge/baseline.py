"""Baselines and in-file suppressions: report only what is new.

A finding's fingerprint is its rule, its module and a key, never a line number, so that
editing the YAML above a known problem does not make it "new":

- a finding about a module: the key is empty (rule + module name identify it);
- a finding about a recipe entry (matcher or config, no module): the key is the first quoted
  name in the message, e.g. `'attention'`;
- anything else: the message with its numbers masked.

`--write-baseline FILE` records today's findings; `--baseline FILE` moves the findings it
lists to `report.suppressed` (each as often as it was recorded), so the exit code and the
summary count only the new ones.

Keyed by config: the file holds one entry per config (its repository-relative path and its
model: the set of module names with layer indices masked, so that a changed layer count or
precision keeps the baseline and another model at the same path does not), and a finding is
accepted only by its own config's entry. A config whose path has no entry (a copy, a rename, a
run from another directory) takes the entry whose `identity` is its own: a digest of the
resolved model (every module's name, class, precision and recipe entry), what the config is
rather than where it lies; a config matching no entry is said so in one line (`unmatched`),
so a baseline never silently hides nothing. A run over several configs (or a directory) reads
and writes one file holding every config's entries; writing keeps the entries of configs the
run did not audit (a pre-commit run may audit fewer files). Files of schema
`qaudit-baseline/1` (one config, no model) are still read, for their config only. A `# qaudit: ignore[QA010]` (or `# qaudit: ignore` for every
rule) comment on the line a finding points at, or alone on the line above it, suppresses that
finding too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from qaudit.errors import InputError
from qaudit.load.jsonfile import read_qaudit_json
from qaudit.load.yamlio import read_text
from qaudit.files.outputs import check_output_path
from qaudit.files.paths import repo_relative, unreadable
from qaudit.judge.report import Finding, Report

BASELINE_SCHEMA = "qaudit-baseline/2"
V1_SCHEMA = "qaudit-baseline/1"
_LAYER_INDEX = re.compile(r"\.\d+(?=\.|$)")
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


def config_key(report: Report) -> str:
    """The config's identity across machines: its path relative to the repository."""
    return repo_relative(report.config)


def model_key(report: Report) -> str:
    """The model's identity: its module names with layer indices masked (`decoder.layers.#.
    mlp.linear_fc1`), so the same model with more layers or another precision keeps it."""
    shapes = sorted({_LAYER_INDEX.sub(".#", row.name) for row in report.modules})
    digest = hashlib.sha256("\n".join(shapes).encode("utf-8", "surrogatepass")).hexdigest()
    return "sha256:" + digest[:32]


def identity_key(report: Report) -> str:
    """What the config is: its resolved model, every module with its class, precision and
    recipe entry, whatever its path (a copy or a rename has the same identity)."""
    rows = sorted(f"{row.name}\x1f{row.type}\x1f{row.precision}\x1f{row.recipe}"
                  for row in report.modules)
    digest = hashlib.sha256("\n".join(rows).encode("utf-8", "surrogatepass")).hexdigest()
    return "sha256:" + digest[:32]


def _known(report: Report) -> list[Finding]:
    """Today's findings: reported and baselined, not those ignored by comments."""
    return list(report.findings) + [f for f in (report.suppressed or [])
                                    if getattr(f, "suppression", "baseline") == "baseline"]


@dataclass
class Baseline:
    """Accepted findings per config: entries of {config, model, recipe, findings}; a model of
    None (a qaudit-baseline/1 file) matches the config's path alone."""

    configs: list[dict[str, Any]]

    def entries_for(self, report: Report) -> list[dict[str, Any]]:
        """The config's entries: by path and model, else by identity (what it is)."""
        path, model = config_key(report), model_key(report)
        by_path = [entry for entry in self.configs
                   if entry["config"] == path and entry.get("model") in (model, None)]
        if by_path:
            return by_path
        identity = identity_key(report)
        return [entry for entry in self.configs if entry.get("identity") == identity][:1]

    def accepted(self, report: Report) -> Counter:
        accepted: Counter = Counter()
        for entry in self.entries_for(report):
            accepted.update(f["fingerprint"] for f in entry["findings"])
        return accepted


def baseline_text(reports: Report | list[Report], kept: Baseline | None = None) -> str:
    """One entry per report's config, plus `kept`'s entries for configs not among them;
    stable bytes (sorted, no timestamps)."""
    reports = [reports] if isinstance(reports, Report) else reports
    entries = {}
    for report in reports:
        entries[config_key(report)] = {
            "config": config_key(report), "model": model_key(report),
            "identity": identity_key(report), "recipe": report.recipe,
            "findings": baseline_entries([_plain(f) for f in _known(report)])}
    for entry in (kept.configs if kept else []):
        if entry["config"] is not None and entry["config"] not in entries \
                and entry.get("model") is not None:
            entries[entry["config"]] = entry
    data = {"schema": BASELINE_SCHEMA, "configs": [entries[key] for key in sorted(entries)]}
    return json.dumps(data, indent=2) + "\n"


def _plain(finding: Finding) -> Finding:
    if isinstance(finding, SuppressedFinding):
        fields = {k: v for k, v in asdict(finding).items() if k != "suppression"}
        return Finding(**fields)
    return finding


def _read(path: str, schema: str, schema_file: str) -> dict:
    return read_qaudit_json(path, kind="baseline", schema=schema, schema_file=schema_file,
                            max_bytes=_MAX_BASELINE_BYTES,
                            not_found="baseline file not found (write one with --write-baseline)")


def load_baseline(path: str) -> Baseline:
    """Every config's accepted fingerprints. Bad file: InputError (about the current schema
    unless the file names the old one)."""
    schema = BASELINE_SCHEMA
    try:
        data = _read(path, BASELINE_SCHEMA, "baseline-v2.schema.json")
    except InputError as exc:
        if exc.key != "schema" or "not a qaudit baseline" not in exc.message:
            raise
        try:
            data, schema = _read(path, V1_SCHEMA, "baseline-v1.schema.json"), V1_SCHEMA
        except InputError as old:
            raise (exc if old.key == "schema" and "not a qaudit baseline" in old.message
                   else old) from None
    if schema == V1_SCHEMA:  # shapes checked above
        config = data.get("config")
        return Baseline([{"config": repo_relative(config) if config else None, "model": None,
                          "recipe": data.get("recipe"), "findings": data["findings"]}])
    return Baseline(list(data["configs"]))


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
                try:  # the text this run read already (qaudit/load/run_files.py)
                    cache[finding.file] = read_text(Path(finding.file),
                                                    finding.file).splitlines()
                except InputError:
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
    """What `check` does with baselines: the accepted findings, where to write one, and the
    entries already there that a rewrite keeps."""

    accepted: Baseline | None = None
    write_path: str | None = None
    kept: Baseline | None = None
    path: str | None = None  # --baseline's file, for the line saying it has no entry
    unmatched: list[str] = field(default_factory=list)  # one line per config without entry

    def apply(self, report: Report) -> Report:
        report = apply_comments(report)
        if self.accepted is not None:
            if not self.accepted.entries_for(report):
                self.unmatched.append(
                    f"note: baseline {self.path} has no entry for {report.config} (not by its "
                    "path, not by its model): every finding of it is reported")
            report = apply_baseline(report, self.accepted.accepted(report))
        return report

    def files(self, *reports: Report) -> list[tuple[str, str]]:
        if not self.write_path:
            return []
        return [(self.write_path, baseline_text(list(reports), self.kept))]


def prepare_baseline(baseline: str | None, write_baseline: str | None) -> BaselinePlan:
    """Read `--baseline` and check `--write-baseline`'s folder before the audit runs; a
    baseline already at `--write-baseline` is read, to keep the configs this run leaves out."""
    accepted = load_baseline(baseline) if baseline else None
    kept = None
    if write_baseline:
        check_output_path(write_baseline, "--write-baseline")
        if unreadable(write_baseline) != "not found":
            kept = load_baseline(write_baseline)
    return BaselinePlan(accepted, write_baseline, kept, baseline)
