"""The command line: exit codes, formats, determinism, golden output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import run_in_process

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qaudit", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def test_deepseek_repeated_mtp_example_fails_with_qa001(monkeypatch, capsys):
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/deepseek-v3-mtp-fp8.yaml",
                                    "--format", "json")
    assert code == 1, err
    report = json.loads(out)
    failing = {m["name"] for m in report["modules"] if m["verdict"] == "QA001"}
    mtp = {m["name"] for m in report["modules"] if m["name"].startswith("mtp.")}
    assert failing == mtp and len(mtp) == 10  # eh_proj, 5 MLA projections, 4 expert linears
    assert "mtp.layers.0.mtp_model_layer.self_attention.linear_kv_down_proj" in mtp
    assert all(m["calls_per_microbatch"] == 2 for m in report["modules"] if m["name"] in mtp)
    assert len([m for m in report["modules"] if m["name"].endswith(".mlp.experts.linear_fc1")]) == 59
    assert report["findings"][0]["line"] == 19
    # the golden every other format of this example is rendered from (tests/test_formats.py)
    assert out == (GOLDEN / "deepseek-v3-mtp-fp8.json").read_text()


def test_deepseek_one_layer_per_depth_passes(monkeypatch, capsys):
    code, out, _ = run_in_process(monkeypatch, capsys, "check",
                                  "configs/deepseek-v3-mtp-fp8-per-depth.yaml")
    assert code == 0
    # identical MTP depths collapse into one row per module kind
    assert "mtp.layers.[0-1].mtp_model_layer.mlp.experts.linear_fc2" in out
    assert out.rstrip().endswith("0 error(s), 0 warning(s)   exit 0")
    assert out == (GOLDEN / "deepseek-v3-mtp-fp8-per-depth.txt").read_text()


@pytest.mark.parametrize("config", ["gpt-mtp-fp8-mtp-bf16", "gpt-small-bf16"])
def test_table_matches_golden_file(monkeypatch, capsys, config):
    code, out, _ = run_in_process(monkeypatch, capsys, "check", f"configs/{config}.yaml")
    expected = (GOLDEN / f"{config}.txt").read_text()
    assert out == expected
    assert code == (1 if "QA001" in expected else 0)


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_same_inputs_same_bytes():
    first = run_cli("check", "configs/gpt-mtp-bf16.yaml", "--policy", "legacy", "--format", "json")
    second = run_cli("check", "configs/gpt-mtp-bf16.yaml", "--policy", "legacy", "--format", "json")
    assert first.returncode == second.returncode == 1
    assert first.stdout == second.stdout and first.stdout


def test_runtime_te_without_te_exits_3_with_one_line(monkeypatch, capsys):
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--runtime", "te")
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and "--runtime te" in err and "Traceback" not in err


def test_bad_option_is_a_usage_error(monkeypatch, capsys):
    code, _, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                  "--policy", "newest")
    assert code == 2 and "newest" in err


def test_internal_error_exits_3_without_report(monkeypatch, capsys):
    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("qaudit.commands.check.audit_inputs", explode)
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml")
    assert code == 3 and out == ""
    assert "internal error: RuntimeError: boom" in err and "Traceback" not in err


def test_missing_config_exits_2(monkeypatch, capsys):
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/nope.yaml")
    assert (code, out) == (2, "")
    assert err == "error: configs/nope.yaml: file not found\n"


def test_the_distribution_name_is_ours_everywhere():
    """`qaudit` on the package index is an unrelated program: every doc and message names
    the distribution megatron-qaudit (the command stays qaudit)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "megatron-qaudit" and "qaudit" in project["scripts"]
    texts = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "qaudit").rglob("*.py")), *sorted((REPO / "scripts").iterdir()),
             *[p for p in (REPO / "action.yml", REPO / ".pre-commit-hooks.yaml") if p.exists()]]
    wrong = re.compile(r"pip install (-U |--upgrade )?[\"']?qaudit\b(?!-)")
    # Nor is megatron-qaudit published: one install story, from a clone (issue 39).
    unpublished = re.compile(r"pip install (-U |--upgrade )?[\"']?megatron-qaudit\b")
    for path in texts:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not wrong.search(text), path
            assert not unpublished.search(text), path


def test_setup_prints_no_deprecation_warning_from_our_packaging(tmp_path):
    """`project.license` is an SPDX string: setuptools warned three times on the table form."""
    import shutil
    import subprocess
    import sys

    source = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside it
    shutil.copytree(REPO / "qaudit", source / "qaudit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", str(source), "-w", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "deprecat" not in (done.stdout + done.stderr).lower()


@pytest.mark.slow  # 22 audits
def test_readme_says_which_examples_megatron_main_changes(monkeypatch, capsys):
    """The README's sentence, checked against the audit (issue 39: it named one of two)."""
    text = " ".join((REPO / "README.md").read_text().split())
    said = re.search(r"`--megatron main` changes the two BF16 repeated-MTP configs, "
                     r"`([^`]+)` and `([^`]+)`, to 0", text)
    assert said
    changed = []
    for config in sorted((REPO / "configs").glob("*.yaml")):
        codes = []
        for extra in ((), ("--megatron", "main")):
            code, _, _ = run_in_process(monkeypatch, capsys, "check", str(config), "--steps",
                                        "1", "--microbatches", "2", "--format", "json", *extra)
            codes.append(code)
        if codes[0] != codes[1]:
            assert codes[1] == 0
            changed.append(config.name)
    assert changed == sorted(said.groups())


def test_readme_example_table_lists_every_bundled_config_with_its_exit_code():
    """Each configs/*.yaml has one row in the README's table of examples, and its exit code is
    the one its golden report records (the audit that wrote the golden, for the Megatron the
    README's table is for)."""
    rows = re.findall(r"^\| `([^`]+\.yaml)` \| .* \| (\d) \|$", (REPO / "README.md").read_text(),
                      flags=re.MULTILINE)
    listed = dict(rows)
    assert len(listed) == len(rows)
    assert sorted(listed) == sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
    for name, code in listed.items():
        golden = json.loads((GOLDEN / name.replace(".yaml", ".json")).read_text())
        assert golden["exit_code"] == int(code), name
