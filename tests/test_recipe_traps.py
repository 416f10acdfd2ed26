"""Recipes Megatron accepts but reads differently from how they look (QA018, QA019): accepted
and audited as Megatron reads them (`megatron/core/quantization/quant_config.py`, PyYAML's
safe loader), each trap a warning at its line; what Megatron rejects stays exit 2."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cli_helpers import run_in_process
from qaudit.run.options import AuditOptions
from qaudit.commands.check import audit_files
from qaudit.errors import InputError
from qaudit.load.recipe import load_recipe

FAST = AuditOptions(steps=1, microbatches=2)
CONFIG = """\
num_layers: 2
hidden_size: 64
num_attention_heads: 4
fp8: e4m3
fp8_recipe: tensorwise
"""
HEAD = """\
configs:
  hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
matchers:
"""


@pytest.fixture
def write(tmp_path: Path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return str(path)
    return write


def audit(write, matchers: str, extra: str = ""):
    recipe = write("r.yaml", HEAD + textwrap.indent(textwrap.dedent(matchers), "  ") + extra)
    return audit_files(write("c.yaml", CONFIG), recipe, FAST), recipe


def precision(report, name: str) -> str:
    return next(r.precision for r in report.modules if r.name == name)


def findings(report, rule: str) -> list[tuple[int | None, str]]:
    return [(f.line, f.message) for f in report.findings if f.rule == rule]


QKV = "decoder.layers.0.self_attention.linear_qkv"


@pytest.mark.parametrize("value, enabled", [
    ('"false"', True), ("'no'", True), ('"0"', True), ("1", True), ("yes", True),
    ("0", False), ('""', False), ("null", False), ("[]", False)])
def test_enabled_is_read_by_truthiness(write, value, enabled):
    report, _ = audit(write, f'qkv: {{type: glob, pattern: "*linear_qkv", config: hp, '
                             f'enabled: {value}}}\n')
    assert precision(report, QKV) == ("bf16" if enabled else "fp8/tensorwise")
    warnings = findings(report, "QA018")
    if value == "yes":  # YAML 1.1 reads an unquoted yes as the boolean true: no trap
        assert warnings == []
        return
    assert len(warnings) == 1 and warnings[0][0] == 4
    assert f"the matcher is {'enabled' if enabled else 'disabled'}" in warnings[0][1]


def test_the_string_false_says_it_enables(write):
    report, recipe = audit(write, 'qkv: {type: glob, pattern: "*linear_qkv", config: hp, '
                                  'enabled: "false"}\n')
    (line, message), = findings(report, "QA018")
    assert message == ("matcher 'qkv': enabled is string 'false', which Megatron reads by "
                       "truthiness: the matcher is enabled (a non-empty string is true, even "
                       "'false')")
    finding = next(f for f in report.findings if f.rule == "QA018")
    assert finding.file == recipe and finding.fix == "write 'enabled: true' (unquoted)"


def test_unknown_top_level_and_matcher_keys_are_ignored_with_a_warning(write):
    report, _ = audit(write, """\
        qkv:
          type: glob
          pattern: "*linear_qkv"
          config: hp
          enabled: true
          priority: 1
        fc1: {type: glob, pattern: "*fc1", config: hp, enable: true}
        """, extra="matcher:\n  x: {}\nversion: 2\n")
    assert precision(report, QKV) == "bf16"  # the matcher works despite its extra key
    assert precision(report, "decoder.layers.0.mlp.linear_fc1") == "fp8/tensorwise"  # 'enable'
    assert findings(report, "QA019") == [
        (9, "matcher 'qkv': unknown field 'priority'; Megatron ignores it"),
        (10, "matcher 'fc1': unknown field 'enable' (did you mean 'enabled'?); Megatron "
             "ignores it"),
        (11, "unknown top-level key 'matcher' (did you mean 'matchers'?): Megatron reads only "
             "'configs' and 'matchers' and ignores it"),
        (13, "unknown top-level key 'version': Megatron reads only 'configs' and 'matchers' "
             "and ignores it")]
    assert [line for line, _ in findings(report, "QA010")] == [10]  # 'fc1' is not enabled


def test_duplicate_matcher_keeps_the_last_body_at_the_first_place(write):
    # PyYAML: the later value replaces the earlier one in place, so 'first' still comes before
    # 'catch_all' in the match order but matches fc1 now, not qkv.
    recipe = write("r.yaml", """\
        configs:
          hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
          hp2: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
        matchers:
          first: {type: glob, pattern: "*linear_qkv", config: hp, enabled: true}
          catch_all: {type: glob, pattern: "*", config: hp2, enabled: true}
          first: {type: glob, pattern: "*linear_fc1", config: hp, enabled: true}
        """)
    report = audit_files(write("c.yaml", CONFIG), recipe, FAST)
    rows = {r.name: r for r in report.modules}
    assert rows["decoder.layers.0.mlp.linear_fc1"].recipe == "hp"
    assert rows[QKV].recipe == "hp2"
    (line, message), = findings(report, "QA019")
    assert line == 7 and message.startswith("key 'first' is written twice (first at line 5)")


def test_duplicate_keys_inside_a_matcher_keep_the_last(write):
    report, _ = audit(write, 'qkv: {type: glob, pattern: "*linear_qkv", config: hp, '
                             'enabled: true, enabled: false}\n')
    assert precision(report, QKV) == "fp8/tensorwise"
    assert [m for _, m in findings(report, "QA019")][0].startswith("key 'enabled' is written twice")


def test_merge_key_overrides_are_not_duplicates():
    text = HEAD + ("  base: &base {type: glob, pattern: '*', config: hp, enabled: false}\n"
                   "  qkv:\n    <<: *base\n    pattern: '*linear_qkv'\n    enabled: true\n")
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "r.yaml"
        path.write_text(text)
        recipe = load_recipe(path)
    assert recipe.notes == []
    assert [(m.name, m.pattern) for m in recipe.matchers] == [("qkv", "*linear_qkv")]


@pytest.mark.parametrize("text, message", [
    ("configs: {}\nmatchers: [m]\n", "expected a mapping"),
    ("configs: {}\nmatchers:\n  m: {type: regex, pattern: '*', config: hp, enabled: 'false'}\n",
     "is not supported upstream"),
    ("configs: {}\nmatchers:\n  m: {pattern: '*', config: hp, enabled: 1}\n",
     "lacks required field"),
    ("configs: {}\nmatchers:\n  m: 'x'\n", "must be a mapping"),
])
def test_what_megatron_rejects_is_still_refused(write, text, message):
    with pytest.raises(InputError, match=message):
        load_recipe(Path(write("r.yaml", text)))


def test_cli_warns_and_audits_instead_of_exit_2(write, monkeypatch, capsys):
    recipe = write("r.yaml", HEAD + '  qkv: {type: glob, pattern: "*linear_qkv", config: hp, '
                                    'enabled: "false"}\nmatcher: {}\n')
    config = write("c.yaml", CONFIG)
    code, out, err = run_in_process(monkeypatch, capsys, "check", config, "--recipe", recipe,
                                    "--format", "json", "--steps", "1", cwd=None)
    report = json.loads(out)
    assert code == 0 and err == ""
    assert sorted((f["rule"], f["line"]) for f in report["findings"]
                  if f["rule"] in ("QA018", "QA019")) == [("QA018", 4), ("QA019", 5)]
    code, _, _ = run_in_process(monkeypatch, capsys, "check", config, "--recipe", recipe,
                                "--fail-on", "warning", "--steps", "1", cwd=None)
    assert code == 1


def test_explain_pages_exist(monkeypatch, capsys):
    for rule_id, words in (("QA018", "truthiness"), ("QA019", "PyYAML")):
        code, out, _ = run_in_process(monkeypatch, capsys, "explain", rule_id)
        assert code == 0 and words in out
