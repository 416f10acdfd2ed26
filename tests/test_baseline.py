"""Baselines (--write-baseline / --baseline) and `# qaudit: ignore[RULE]` comments."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cli_helpers import run_in_process as run_cli_in_process
from qaudit.judge.baseline import (apply_baseline, apply_comments, baseline_text, finding_key,
                             fingerprint, load_baseline)
from qaudit.errors import InputError
from qaudit.render.load import report_from_dict
from qaudit.judge.report import Finding

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
FAILING = "gpt-mtp-fp8-mtp-bf16"


def golden(example: str = FAILING):
    return report_from_dict(json.loads((GOLDEN / f"{example}.json").read_text()))


def run_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    return run_cli_in_process(monkeypatch, capsys, *args, cwd=None)  # the test sets the cwd


def test_fingerprint_ignores_lines_and_files_but_not_rule_module_or_entry():
    f = Finding(rule="QA001", severity="error", module="mtp.layers.0.eh_proj",
                message="mtp.layers.0.eh_proj: x", file="a.yaml", line=8)
    assert fingerprint(f) == fingerprint(replace(f, line=30, file="b.yaml", message="changed"))
    assert fingerprint(f) != fingerprint(replace(f, module="mtp.layers.1.eh_proj"))
    assert fingerprint(f) != fingerprint(replace(f, rule="QA003"))
    m = Finding(rule="QA010", severity="warning", module=None,
                message="matcher 'attention' has no 'enabled: true'", file="r.yaml", line=7)
    assert finding_key(m) == "'attention'"
    assert fingerprint(m) == fingerprint(replace(m, line=9))
    assert fingerprint(m) != fingerprint(replace(m, message="matcher 'mlp' has no 'enabled'"))
    n = Finding(rule="QA090", severity="warning", module=None,
                message="recompute at line 12 is not modelled", file="c.yaml", line=12)
    assert fingerprint(n) == fingerprint(replace(n, message="recompute at line 14 is not modelled"))


def test_baseline_round_trip_reports_only_new_findings(tmp_path):
    report = golden()
    path = tmp_path / "baseline.json"
    path.write_text(baseline_text(report))
    data = json.loads(path.read_text())
    assert data["schema"] == "qaudit-baseline/2" and len(data["configs"]) == 1
    entry = data["configs"][0]
    assert entry["config"] == f"configs/{FAILING}.yaml" and entry["model"].startswith("sha256:")
    assert len(entry["findings"]) == 5
    assert all("line" not in finding for finding in entry["findings"])
    accepted = load_baseline(str(path)).accepted(report)
    filtered = apply_baseline(report, accepted)
    assert filtered.findings == [] and len(filtered.suppressed) == 5
    assert filtered.exit_code() == 0
    assert {f.suppression for f in filtered.suppressed} == {"baseline"}
    # a new finding is reported, and only it counts
    extra = Finding(rule="QA001", severity="error", module="output_layer",
                    message="output_layer: x", file="c.yaml", line=3)
    grown = replace(report, findings=report.findings + [extra])
    filtered = apply_baseline(grown, accepted)
    assert filtered.findings == [extra] and filtered.exit_code() == 1
    # rewriting the baseline from a filtered report keeps the accepted ones
    again = json.loads(baseline_text(filtered))
    assert len(again["configs"][0]["findings"]) == 6


def test_a_baseline_accepts_only_its_own_configs_findings(tmp_path):
    """A gpt-mtp-bf16 baseline used to hide 2 DeepSeek-V3 findings (issue 39)."""
    mtp, deepseek = golden("gpt-mtp-bf16"), golden("deepseek-v3-mtp-fp8")
    shared = {fingerprint(f) for f in mtp.findings} & {fingerprint(f) for f in deepseek.findings}
    assert shared  # the same rule on the same module names: fingerprints alone would match
    path = tmp_path / "b.json"
    path.write_text(baseline_text(mtp))
    baseline = load_baseline(str(path))
    assert apply_baseline(deepseek, baseline.accepted(deepseek)).findings == deepseek.findings
    assert apply_baseline(mtp, baseline.accepted(mtp)).findings == []
    # Another model at the same path is another config.
    moved = replace(deepseek, config=mtp.config)
    assert not baseline.accepted(moved)
    # The same model with more layers (or another precision) keeps its baseline.
    grown = replace(mtp, modules=mtp.modules + [replace(mtp.modules[0], name=mtp.modules[0].name
                                                        .replace(".0.", ".7.", 1))])
    assert baseline.accepted(grown) == baseline.accepted(mtp)


def test_one_baseline_file_holds_every_config_and_a_rewrite_keeps_the_others(tmp_path):
    mtp, deepseek = golden("gpt-mtp-bf16"), golden("deepseek-v3-mtp-fp8")
    path = tmp_path / "b.json"
    path.write_text(baseline_text([mtp, deepseek]))
    baseline = load_baseline(str(path))
    assert [e["config"] for e in baseline.configs] == sorted([mtp.config, deepseek.config])
    # A run over one of them rewrites its entry and keeps the other's.
    fixed = replace(mtp, findings=[])
    rewritten = json.loads(baseline_text(fixed, kept=baseline))
    entries = {e["config"]: e for e in rewritten["configs"]}
    assert entries[mtp.config]["findings"] == []
    assert len(entries[deepseek.config]["findings"]) == len(deepseek.findings)


def test_an_old_single_config_baseline_applies_to_its_config_only(tmp_path):
    mtp, deepseek = golden("gpt-mtp-bf16"), golden("deepseek-v3-mtp-fp8")
    entry = json.loads(baseline_text(mtp))["configs"][0]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema": "qaudit-baseline/1", "config": mtp.config,
                                "recipe": None, "findings": entry["findings"]}))
    baseline = load_baseline(str(path))
    assert sum(baseline.accepted(mtp).values()) == len(mtp.findings)
    assert not baseline.accepted(deepseek)


@pytest.mark.parametrize("text,message", [
    ("{", "invalid JSON"),
    ('{"schema": "other"}', "not a qaudit baseline"),
    ('{"schema": "qaudit-baseline/1", "findings": [{}]}', "fingerprint"),
])
def test_bad_baseline_file_is_an_input_error(tmp_path, text, message):
    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_baseline(str(path))
    with pytest.raises(InputError, match="not found"):
        load_baseline(str(tmp_path / "missing.json"))


def test_ignore_comment_on_the_line_or_above(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("matchers:\n"
                      "  a: {pattern: x}  # qaudit: ignore[QA010]\n"
                      "  # qaudit: ignore\n"
                      "  b: {pattern: y}\n"
                      "  c: {pattern: z}  # qaudit: ignore[QA011]\n")

    def warning(rule, message, file, line):
        return Finding(rule=rule, severity="warning", module=None, message=message, file=file,
                       line=line)

    findings = [warning("QA010", "matcher 'a'", str(recipe), 2),
                warning("QA011", "matcher 'b'", str(recipe), 4),
                warning("QA010", "matcher 'c'", str(recipe), 5),
                warning("QA010", "no file", None, None)]
    report = replace(golden(), findings=findings)
    kept = apply_comments(report)
    assert [f.message for f in kept.findings] == ["matcher 'c'", "no file"]
    assert [f.suppression for f in kept.suppressed] == ["comment", "comment"]


def test_cli_baseline_with_shifted_lines(tmp_path, monkeypatch, capsys):
    """End to end: record today's findings, move every line down, only new findings count."""
    config = tmp_path / "model.yaml"
    source = (REPO / "configs" / f"{FAILING}.yaml").read_text()
    recipe = REPO / "configs" / "recipes" / "mtp-bf16.yaml"
    config.write_text(source.replace("quant_recipe: recipes/mtp-bf16.yaml",
                                     f"quant_recipe: {recipe}"))
    monkeypatch.chdir(tmp_path)
    baseline = tmp_path / "qaudit-baseline.json"
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "model.yaml",
                                  "--write-baseline", str(baseline), "--format", "json")
    assert code == 1 and len(json.loads(baseline.read_text())["configs"][0]["findings"]) == 5

    config.write_text("# a comment that moves every line\n\n" + config.read_text())
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "model.yaml",
                                  "--baseline", str(baseline), "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["findings"] == [] and len(data["suppressed"]) == 5
    assert data["summary"] == {"error": 0, "warning": 0, "info": 0} and data["exit_code"] == 0

    code, out, _ = run_in_process(monkeypatch, capsys, "check", "model.yaml",
                                  "--baseline", str(baseline))
    assert code == 0 and "5 finding(s) suppressed" in out
    assert out.rstrip().endswith("0 error(s), 0 warning(s), 5 suppressed   exit 0")


def test_cli_bad_baseline_exits_2_before_auditing(tmp_path, monkeypatch, capsys):
    def never(*args, **kwargs):
        raise AssertionError("audited despite a bad baseline")

    monkeypatch.setattr("qaudit.commands.check.audit_inputs", never)
    monkeypatch.chdir(REPO)
    (tmp_path / "b.json").write_text("[]")
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--baseline", str(tmp_path / "b.json"))
    assert (code, out) == (2, "") and "not a qaudit baseline" in err
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--write-baseline", str(tmp_path / "no" / "b.json"))
    assert (code, out) == (2, "") and "does not exist" in err


def test_suppressed_findings_appear_in_sarif_as_suppressed():
    from qaudit.render import render

    report = golden()
    path_free = apply_baseline(report, __import__("collections").Counter(
        {fingerprint(report.findings[0]): 1}))
    sarif = json.loads(render(path_free, path_free.exit_code(), "sarif"))
    results = sarif["runs"][0]["results"]
    assert len(results) == 5
    suppressed = [r for r in results if "suppressions" in r]
    assert len(suppressed) == 1 and suppressed[0]["suppressions"][0]["kind"] == "external"


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_write_baseline_subprocess_is_stable(tmp_path):
    """Same inputs, same baseline bytes (no timestamps, sorted)."""
    args = [sys.executable, "-m", "qaudit", "check", "configs/gpt-mtp-bf16.yaml", "--policy",
            "legacy", "--format", "json"]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for target in (first, second):
        result = subprocess.run(args + ["--write-baseline", str(target)], cwd=REPO,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 1, result.stderr
    assert first.read_bytes() == second.read_bytes()
    assert str(tmp_path) not in first.read_text()


def test_a_copy_a_rename_or_another_directory_matches_by_what_the_config_is(tmp_path):
    """A baseline silently matched nothing for a renamed or copied config (issue 45)."""
    mtp, deepseek = golden("gpt-mtp-bf16"), golden("deepseek-v3-mtp-fp8")
    path = tmp_path / "b.json"
    path.write_text(baseline_text(mtp))
    assert json.loads(path.read_text())["configs"][0]["identity"].startswith("sha256:")
    baseline = load_baseline(str(path))
    for where in ("configs/renamed.yaml", "/elsewhere/copy.yaml", "../other/gpt-mtp-bf16.yaml"):
        moved = replace(mtp, config=where)
        assert apply_baseline(moved, baseline.accepted(moved)).findings == [], where
    # What it is decides: another model under the copy's name is not matched.
    other = replace(deepseek, config="configs/renamed.yaml")
    assert baseline.entries_for(other) == [] and not baseline.accepted(other)


def test_cli_says_in_one_line_when_a_baseline_has_no_entry_for_the_config(tmp_path,
                                                                           monkeypatch, capsys):
    shutil_copy = (REPO / "configs" / "gpt-mtp-bf16.yaml").read_text()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.yaml").write_text(shutil_copy)
    baseline = tmp_path / "baseline.json"
    monkeypatch.chdir(tmp_path / "a")
    code, _, _ = run_in_process(monkeypatch, capsys, "check", "model.yaml",
                                "--write-baseline", str(baseline))
    assert code == 1
    # Renamed, and run from another working directory: still its baseline.
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "renamed.yaml").write_text(shutil_copy)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(monkeypatch, capsys, "check", "b/renamed.yaml",
                                    "--baseline", str(baseline))
    assert code == 0 and "suppressed" in out and "no entry" not in err
    # Another config: one line says the baseline has no entry for it.
    code, out, err = run_in_process(monkeypatch, capsys, "check",
                                    str(REPO / "configs" / "deepseek-v3-mtp-fp8.yaml"),
                                    "--baseline", str(baseline))
    lines = [line for line in err.splitlines() if "no entry" in line]
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith(f"note: baseline {baseline} has no entry for ")
