"""The command-line conventions people bring (issue 23): -h, --version, completion, switches
shown as switches, a one-screen `check -h`, several configs in one run, trailing overrides."""

from __future__ import annotations

import json
import re
import os
import shutil
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qaudit.cli import app
from qaudit.commands.targets import expand_targets, split_targets

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
FAST = ["--steps", "1", "--microbatches", "2"]


def invoke(*args: str, columns: int = 80):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})


def test_h_and_version_and_completion():
    assert invoke("-h").exit_code == 0 and "[OPTIONS] COMMAND" in invoke("-h").stdout
    assert invoke("check", "-h").stdout == invoke("check", "--help").stdout
    from qaudit import __version__

    result = invoke("--version")
    assert (result.exit_code, result.stdout) == (0, f"{__version__}\n")
    assert "--install-completion" in invoke("-h").stdout
    import subprocess
    import sys

    # The console script, as a shell would run it (completion is keyed on the program name).
    script = Path(sys.executable).parent / "qaudit"
    # Typer detects the running shell (shellingham) unless told not to; a job without a shell
    # among its parents (a detached CI step) detects none, so the shell is named instead.
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    shown = subprocess.run([str(script), "--show-completion", "bash"], capture_output=True,
                           text=True, timeout=600, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _qaudit_completion qaudit" in shown.stdout


def test_check_help_fits_a_screen_and_shows_switches_as_switches():
    text = invoke("check", "-h").stdout
    lines = text.splitlines()
    assert len(lines) <= 50, len(lines)
    assert all(len(line) <= 80 for line in lines)
    assert "<bool>" not in text and "│" not in text  # no boxes, no value after a switch
    for switch in ("--verify", "--expand", "--show-info", "--cross-check", "--help"):
        line = next(line for line in lines if switch in line)
        after = line.split(switch, 1)[1]
        assert after.startswith("  "), line  # the help text follows, not a value
    assert "docs/usage.md" in text


def test_split_targets_tells_paths_from_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a=b.yaml").write_text("x")
    paths, overrides = split_targets(["dump.yaml", "model.mtp_num_layers=2", "a=b.yaml",
                                      "+model.x=1", "~model.y", "dir/"])
    assert paths == ["dump.yaml", "a=b.yaml", "dir/"]
    assert overrides == ["model.mtp_num_layers=2", "+model.x=1", "~model.y"]


def test_overrides_take_one_config():
    result = invoke("check", str(CONFIGS / "gpt-small-bf16.yaml"),
                    str(CONFIGS / "moe-mxfp8.yaml"), "model.mtp_num_layers=2")
    assert result.exit_code == 2
    assert "overrides apply to one Megatron-Bridge config, got 2 paths" in result.stderr
    result = invoke("check", str(CONFIGS), "model.mtp_num_layers=2")
    assert result.exit_code == 2 and "not a directory" in result.stderr


def test_a_directory_is_its_configs_not_its_subfolders(tmp_path):
    for name in ("b.yaml", "a.sh", "c.yml", "notes.txt", ".hidden.yaml"):
        (tmp_path / name).write_text("x")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text("x")
    files, several = expand_targets([str(tmp_path)])
    assert [Path(f).name for f in files] == ["a.sh", "b.yaml", "c.yml"] and several
    assert expand_targets(["one.yaml"]) == (["one.yaml"], False)
    empty = tmp_path / "recipes" / "empty"
    empty.mkdir()
    result = invoke("check", str(empty))
    assert result.exit_code == 2 and "is a directory with no configs" in result.stderr


@pytest.fixture
def three(tmp_path):
    """A passing config, a failing one, and a broken one."""
    shutil.copy(CONFIGS / "gpt-small-bf16.yaml", tmp_path / "a-pass.yaml")
    shutil.copy(CONFIGS / "gpt-mtp-fp8-mtp-bf16.yaml", tmp_path / "b-fail.yaml")
    recipe = CONFIGS / "recipes"
    if (tmp_path / "b-fail.yaml").read_text().find("quant_recipe") >= 0:
        shutil.copytree(recipe, tmp_path / "recipes")
    (tmp_path / "c-broken.yaml").write_text("num_layers: [\n")
    return tmp_path


def test_several_configs_one_line_each_and_the_worst_exit(three):
    result = invoke("check", str(three / "a-pass.yaml"), str(three / "b-fail.yaml"), *FAST)
    lines = result.stdout.splitlines()
    assert result.exit_code == 1
    assert lines[0].startswith("exit 0  ") and lines[0].endswith("a-pass.yaml: 0 error(s), "
                                                                 "0 warning(s), 16 info")
    assert lines[1].startswith("exit 1  ") and "b-fail.yaml: 5 error(s)" in lines[1]
    assert lines[2].startswith("2 files, worst exit 1")
    assert len(lines) == 3
    everything = invoke("check", str(three), *FAST)
    assert everything.exit_code == 2  # the broken file is the worst
    assert [line.split()[1] for line in everything.stdout.splitlines()[:3]] == ["0", "1", "2"]
    assert "c-broken.yaml" in everything.stderr


def test_json_and_sarif_carry_every_file(three, tmp_path):
    import jsonschema

    result = invoke("check", str(three), *FAST, "-f", "json", "-o",
                    f"sarif={tmp_path / 'all.sarif'}")
    data = json.loads(result.stdout)
    schema = json.loads(resources.files("qaudit").joinpath("schemas/files-v1.schema.json")
                        .read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)
    report_schema = json.loads(resources.files("qaudit").joinpath(
        "schemas/report-v1.schema.json").read_text())
    assert [Path(f["path"]).name for f in data["files"]] == ["a-pass.yaml", "b-fail.yaml",
                                                             "c-broken.yaml"]
    assert [f["exit_code"] for f in data["files"]] == [0, 1, 2] and data["exit_code"] == 2
    for entry in data["files"][:2]:
        jsonschema.validate(entry["report"], report_schema, cls=jsonschema.Draft202012Validator)
    assert "error" in data["files"][2]
    sarif = json.loads((tmp_path / "all.sarif").read_text())
    run, = sarif["runs"]
    assert {r["ruleId"] for r in run["results"]} >= {"QA001", "QA003"}
    rules = [d["id"] for d in run["tool"]["driver"]["rules"]]
    assert all(rules[r["ruleIndex"]] == r["ruleId"] for r in run["results"])
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert len(notes) == 1 and "c-broken.yaml" in notes[0]["message"]["text"]
    from test_formats import official_sarif_schema

    validator = jsonschema.Draft4Validator(official_sarif_schema())
    assert not list(validator.iter_errors(sarif))


def test_one_config_output_is_unchanged_by_the_multi_file_path():
    one = invoke("check", str(CONFIGS / "gpt-small-bf16.yaml"), *FAST)
    assert one.exit_code == 0 and one.stdout.startswith("runtime: ")
    assert "files, worst exit" not in one.stdout


def test_one_config_formats_refused_with_several(three, tmp_path):
    result = invoke("check", str(three / "a-pass.yaml"), str(three / "b-fail.yaml"), *FAST,
                    "-o", f"svg={tmp_path / 'x.svg'}")
    assert result.exit_code == 2 and "--output svg is of one config" in result.stderr
    # A baseline is of several configs (one entry each): read, and refused only when bad.
    result = invoke("check", str(three / "a-pass.yaml"), str(three / "b-fail.yaml"), *FAST,
                    "--baseline", str(tmp_path / "b.json"))
    assert result.exit_code == 2 and "baseline file not found" in result.stderr


def test_several_configs_write_and_read_one_baseline(three, tmp_path):
    baseline = tmp_path / "b.json"
    files = [str(three / "a-pass.yaml"), str(three / "b-fail.yaml")]
    written = invoke("check", *files, *FAST, "--write-baseline", str(baseline))
    assert written.exit_code == 1
    entries = json.loads(baseline.read_text())["configs"]
    assert len(entries) == 2 and any(e["findings"] for e in entries)
    again = invoke("check", *files, *FAST, "--baseline", str(baseline))
    assert again.exit_code == 0 and "suppressed" in again.stdout


def test_several_files_name_each_files_rules_and_first_module(three):
    result = invoke("check", str(three / "a-pass.yaml"), str(three / "b-fail.yaml"), *FAST)
    failing = next(line for line in result.stdout.splitlines() if "b-fail.yaml" in line)
    assert re.search(r" -- QA\d{3} on \S+", failing), failing
    passing = next(line for line in result.stdout.splitlines() if "a-pass.yaml" in line)
    assert " -- " not in passing
