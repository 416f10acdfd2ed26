"""`qaudit diff BASE HEAD`: only what changes; exit 1 when the head introduces an error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from qaudit.judge.diff import diff_reports
from qaudit.render.diff import render_diff
from qaudit.render.load import report_from_dict
from cli_helpers import run_in_process

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


def golden(example: str):
    return report_from_dict(json.loads((GOLDEN / f"{example}.json").read_text()))


def test_repeated_mtp_layer_diff_shows_only_mtp_and_new_errors():
    base, head = golden("deepseek-v3-mtp-fp8-per-depth"), golden("deepseek-v3-mtp-fp8")
    result = diff_reports(base, head)
    changed = {m.name for m in result.modules if m.status == "changed"}
    removed = {m.name for m in result.modules if m.status == "removed"}
    assert changed == {n for n in (m.name for m in head.modules) if n.startswith("mtp.layers.0.")}
    assert removed == {m.name for m in base.modules if m.name.startswith("mtp.layers.1.")}
    assert not any(m.name.startswith("decoder.") for m in result.modules)
    eh = next(m for m in result.modules if m.name == "mtp.layers.0.eh_proj")
    assert eh.changes == {"calls_per_microbatch": (1, 2), "verdict": ("ok", "QA001")}
    assert len(result.new) == len(changed) and result.fixed == []
    assert {f.module for f in result.new} == changed and result.exit_code() == 1
    reverse = diff_reports(head, base)
    assert len(reverse.fixed) == len(changed) and reverse.new == [] and reverse.exit_code() == 0


def test_identical_reports_have_no_changes():
    report = golden("moe-mxfp8")
    result = diff_reports(report, report)
    assert result.modules == [] and result.new == [] and result.exit_code() == 0
    assert "no module changes" in render_diff(result, 0, "table")


@pytest.mark.parametrize("fmt,suffix", [("table", ".txt"), ("markdown", ".md"),
                                        ("json", ".json")])
def test_diff_of_json_reports_matches_golden(monkeypatch, capsys, fmt, suffix):
    code, out, err = run_in_process(monkeypatch, capsys, "diff",
                                    "tests/golden/deepseek-v3-mtp-fp8-per-depth.json",
                                    "tests/golden/deepseek-v3-mtp-fp8.json", "--format", fmt)
    assert code == 1, err
    assert out == (GOLDEN / f"diff-deepseek-per-depth-to-repeated{suffix}").read_text()


def test_diff_table_fits_80_columns():
    text = (GOLDEN / "diff-deepseek-per-depth-to-repeated.txt").read_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "mtp.layers.1.mtp_model_layer.mlp.experts.linear_fc1" in text
    assert re.search(r"^new findings \(\d+\):$", text, re.M)


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_diff_of_two_configs_end_to_end():
    """Audits both YAML files: BF16 repeated MTP passes; forcing FP8 + BF16 MTP introduces errors."""
    result = subprocess.run([sys.executable, "-m", "qaudit", "diff", "configs/gpt-mtp-bf16.yaml",
                             "configs/gpt-mtp-fp8-mtp-bf16.yaml", "--format", "json",
                             "--megatron", "main"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["schema"] == "qaudit-diff/1" and data["exit_code"] == 1
    names = {m["name"] for m in data["modules"]}
    assert "mtp.layers.0.eh_proj" in names and "output_layer" not in names
    decoder = next(m for m in data["modules"] if m["name"].startswith("decoder."))
    assert decoder["changes"]["precision"] == {"base": "bf16", "head": "fp8/tensorwise"}
    assert {f["rule"] for f in data["findings"]["new"]} == {"QA001"}


def test_diff_bad_input_exits_2(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "something-else"}')
    code, out, err = run_in_process(monkeypatch, capsys, "diff", str(bad), str(bad))
    assert (code, out) == (2, "") and "not a qaudit JSON report" in err
    code, out, err = run_in_process(monkeypatch, capsys, "diff", "configs/nope.yaml",
                                    "configs/gpt-small-bf16.yaml")
    assert (code, out) == (2, "") and "configs/nope.yaml" in err


def test_a_scope_change_of_an_existing_finding_is_reported_and_fails():
    """QA001 from "first step only" to "every step" was "0 new errors", exit 0 (issue 39)."""
    base, head = golden("gpt-mtp-bf16"), golden("gpt-mtp-fp8-mtp-bf16")
    result = diff_reports(base, head)
    assert result.new == [] or all(f.rule != "QA001" for f in result.new)
    qa001 = [c for c in result.changed if c.head.rule == "QA001"]
    assert len(qa001) == 5 and result.exit_code() == 1
    assert qa001[0].changes == {"scope": ("on microbatch 0 of the first step only",
                                          "on microbatch 0 of every step")}
    text = render_diff(result, 1, "table")
    assert "changed findings (5):" in text and "first step only -> on microbatch 0 of" in text
    assert "changed: 5;" in text.splitlines()[-1]
    assert "5 changed" in render_diff(result, 1, "markdown").splitlines()[0]
    data = json.loads(render_diff(result, 1, "json"))
    assert data["findings"]["changed"][0]["changes"]["scope"]["head"] \
        == "on microbatch 0 of every step"


def test_a_severity_change_is_reported_and_fails_at_its_level():
    from dataclasses import replace

    base = golden("gpt-mtp-bf16")
    warned = replace(base, findings=[replace(f, severity="warning") for f in base.findings
                                     if f.rule == "QA001"])
    erred = replace(base, findings=[f for f in base.findings if f.rule == "QA001"])
    result = diff_reports(warned, erred)
    assert result.new == [] and result.fixed == []
    assert [c.changes for c in result.changed] == [{"severity": ("warning", "error")}] * 5
    assert result.exit_code("error") == 1
    calmer = diff_reports(erred, warned)
    # Milder is an improvement, whatever --fail-on says (issue 45).
    assert calmer.exit_code("error") == 0 and calmer.exit_code("warning") == 0
    assert [c.changes for c in calmer.changed] == [{"severity": ("error", "warning")}] * 5


def test_a_narrowed_scope_is_an_improvement_and_exits_0():
    """Every step -> the first step only was exit 1 like a regression (issue 45)."""
    result = diff_reports(golden("gpt-mtp-fp8-mtp-bf16"), golden("gpt-mtp-bf16"))
    qa001 = [c for c in result.changed if c.head.rule == "QA001"]
    assert len(qa001) == 5 and all(not c.worse for c in qa001)
    assert [f for f in result.new if f.severity == "error"] == []
    assert result.exit_code() == 0
    text = render_diff(result, 0, "table")
    assert "changed findings (5):" in text  # still shown


@pytest.mark.parametrize("base,head,wider", [
    ("on microbatch 0 of the first step only", "on microbatch 0 of every step", True),
    ("on microbatch 0 of every step", "on microbatch 0 of the first step only", False),
    ("on microbatch 0 of step(s) 0", "on microbatch 0, 1 of step(s) 0", True),
    ("on microbatch 0, 1 of step(s) 0", "on microbatch 0 of step(s) 0", False),
    ("on microbatch 0 of step(s) 0, 1", "on microbatch 0 of every step", True),
    (None, "on microbatch 0 of every step", True),
    ("on microbatch 0 of every step", None, False)])
def test_scope_widening(base, head, wider):
    from qaudit.judge.diff import widened

    assert widened(base, head) is wider


def test_header_shows_both_sides_where_they_differ():
    from dataclasses import replace

    base = golden("gpt-mtp-bf16")
    head = replace(base, policy="config", runtime="te (CPU stand-in)",
                   megatron=dict(base.megatron, label="Megatron-LM main", version="main",
                                 source="named", note=None, policy="config"))
    text = render_diff(diff_reports(base, head), 0, "table")
    lines = text.splitlines()
    assert "runtime (base): reference (CPU)" in lines
    assert "runtime (head): te (CPU stand-in)" in lines
    assert "policy (base): legacy" in lines and "policy (head): config" in lines
    assert any(line.startswith("megatron (base): megatron-core 0.19.2") for line in lines)
    assert any(line.startswith("megatron (head): Megatron-LM main") for line in lines)
    assert any(line.startswith("te: Transformer Engine 2.20.2") for line in lines)  # agrees
    data = json.loads(render_diff(diff_reports(base, head), 0, "json"))
    assert data["base"]["policy"] == "legacy" and data["head"]["policy"] == "config"
    assert data["base"]["te"] == data["head"]["te"] == base.te
    markdown = render_diff(diff_reports(base, head), 0, "markdown")
    assert "- policy (base): legacy" in markdown and "- policy (head): config" in markdown


def test_diff_collapses_module_rows_as_check_does():
    """Layers of one kind that change alike are one row (the table's `decoder.layers.[...]`),
    even when other layers sit between them (a hybrid pattern)."""
    base, head = golden("gpt-mtp-bf16"), golden("gpt-mtp-fp8-mtp-bf16")
    text = render_diff(diff_reports(base, head), 1, "table")
    assert "decoder.layers.[0-3].mlp.linear_fc1  (x4)" in text
    hybrid = golden("bridge-lightning-mtp-bf16")
    fp8 = replace_precision(hybrid, "fp8/mxfp8")
    rows = [line for line in render_diff(diff_reports(hybrid, fp8), 0, "table").splitlines()
            if line.startswith("decoder.")]
    assert len(rows) == len({re.sub(r"\[[^\]]*\]", "#", r) for r in rows})  # one per kind
    assert any("[0,2,5,7]" in row for row in rows)


def replace_precision(report, precision):
    from dataclasses import replace

    return replace(report, modules=[replace(row, precision=precision) for row in report.modules])


def test_a_guards_observed_scope_agrees_with_the_prediction_it_confirms():
    """The guard says which watched steps lost gradient; a prediction agrees when it names
    exactly those among the watched ones."""
    from qaudit.judge.diff import scopes_agree

    first, every = "on microbatch 0 of the first step only", "on microbatch 0 of every step"
    assert scopes_agree(first, "on microbatch 0 of watched step(s) 1 of 1")
    assert scopes_agree(every, "on microbatch 0 of watched step(s) 1 of 1")
    assert scopes_agree("on microbatch 0 of watched step(s) 1, 2 of 2", every)
    assert not scopes_agree(first, "on microbatch 0 of watched step(s) 1, 2 of 2")
    assert not scopes_agree(every, "on microbatch 0 of watched step(s) 1 of 2")
    assert not scopes_agree(every, "on microbatch 1 of watched step(s) 1 of 1")
    assert not scopes_agree(first, every)
