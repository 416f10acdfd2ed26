"""The rule registry owns each rule's ID and severity; one rule per module, named by its ID."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import qaudit.judge.rules as rules_package
from qaudit.commands.check import audit_files
from qaudit.judge.report import Finding
from qaudit.judge.rules import Hit, Rule, load_rules, rule
from qaudit.load.config import ModelConfig
from qaudit.plan.policies import POLICIES
from qaudit.run.evidence import AuditFacts

RULES_DIR = Path(rules_package.__file__).parent
GOLDEN = Path(__file__).parent / "golden"


def _rule_modules() -> list[Path]:
    return sorted(p for p in RULES_DIR.glob("*.py") if not p.name.startswith("_"))


def test_each_rule_lives_alone_in_a_module_named_by_its_id():
    by_module: dict[str, list[str]] = {}
    for current in load_rules().values():
        module = current.check.__module__.rsplit(".", 1)[-1]
        assert module.startswith(current.id.lower() + "_"), (current.id, module)
        by_module.setdefault(module, []).append(current.id)
    assert {m: ids for m, ids in by_module.items() if len(ids) > 1} == {}
    # ... and every rule module registers one (a helper belongs in a `_` module)
    assert sorted(by_module) == [p.stem for p in _rule_modules()]


def test_no_rule_module_builds_a_finding_itself():
    for path in _rule_modules() + sorted(RULES_DIR.glob("_*.py")):
        if path.name == "__init__.py":
            continue
        names = {node.id for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Name)}
        assert "Finding" not in names, f"{path.name}: yield a Hit; the registry makes the Finding"


def _facts() -> AuditFacts:
    config = ModelConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    return AuditFacts(config=config, recipe=None, policy=POLICIES["config"], rows=[], records={},
                      overwrite_main_grad={}, te_modules=[], bindings={})


def test_a_hit_becomes_a_finding_with_the_registered_id_and_severity():
    hit = Hit(module="m", message="m: x", file="c.yaml", line=3, fix="f")
    registered = Rule(id="QA999", severity="warning", title="t", check=lambda facts: [hit],
                      doc="d")
    assert registered.findings(_facts()) == [Finding(
        rule="QA999", severity="warning", module="m", message="m: x", file="c.yaml", line=3,
        fix="f")]


def test_a_check_that_yields_its_own_finding_is_refused():
    own = Finding(rule="QA999", severity="error", module=None, message="x", file=None, line=None)
    registered = Rule(id="QA999", severity="info", title="t", check=lambda facts: [own], doc="d")
    with pytest.raises(TypeError, match="QA999 yielded Finding"):
        registered.findings(_facts())


@pytest.mark.parametrize("rule_id, severity", [("QA1", "error"), ("QA100", "fatal")])
def test_registration_refuses_a_malformed_id_or_severity(rule_id, severity):
    with pytest.raises(ValueError):
        rule(rule_id, severity, "title")


BASE = "num_layers: 2\nhidden_size: 128\nnum_attention_heads: 4\n"
FP8 = "fp8: e4m3\nfp8_recipe: tensorwise\n"
MTP_BF16 = """\
configs:
  hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
  q:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe: {fp8_quantization_recipe: tensorwise}
    evaluation_recipe: {}
  broken: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {x: 1}}
matchers:
  mtp: {type: glob, pattern: 'mtp.*', config: hp, enabled: true}
  attn: {type: glob, pattern: '*self_attention*', config: hp, enabled: "false"}
  fc1: {type: glob, pattern: '*linear_fc1', config: q, enabled: true}
  fc1b: {type: glob, pattern: '*linear_fc1', config: q, enabled: true}
  draft: {type: glob, pattern: '*linear_fc2', config: q}
  none: {type: glob, pattern: 'encoder.*', config: missing, enabled: true, enable: true}
"""


def test_every_finding_has_its_rules_registered_severity(write_yaml):
    """Over the golden reports and an audit made to fire many rules at once."""
    registry = load_rules()
    findings = []
    for path in sorted(GOLDEN.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("schema") == "qaudit/1":
            findings += [(f["rule"], f["severity"], path.name) for f in data["findings"]]
    config = write_yaml("c.yaml", BASE + FP8 + "mtp_num_layers: 2\nmtp_use_repeated_layer: true\n"
                        "pipeline_model_parallel_size: 2\nquant_recipe: r.yaml\n")
    write_yaml("r.yaml", MTP_BF16.replace("'*linear_fc1'", "'decoder.layers.0.*'", 1))
    report = audit_files(config, None)
    fired = {f.rule for f in report.findings}
    assert len(fired) >= 8, fired  # the case must keep exercising many rules
    findings += [(f.rule, f.severity, "audit") for f in report.findings]
    wrong = [(r, s, where) for r, s, where in findings if registry[r].severity != s]
    assert wrong == []
