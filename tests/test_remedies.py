"""QA001's fix line: remedies cheapest first (the pricing --suggest uses), written in the input's
own syntax, one test per input route (issue 39, item 1)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from qaudit.commands.check import audit_files
from qaudit.judge import remedies
from qaudit.run.options import AuditOptions

REPO = Path(__file__).resolve().parents[1]
FAST = AuditOptions(steps=1, microbatches=2)


def _qa001_fix(report) -> str:
    fixes = {f.fix for f in report.findings if f.rule == "QA001"}
    assert len(fixes) == 1
    return fixes.pop()


def _in_order(text: str, pieces: list[str]) -> bool:
    positions = [text.index(piece) for piece in pieces]
    return positions == sorted(positions)


def _suggested_settings(report) -> list[str]:
    """--suggest's remedies that change a setting, in the order it lists them."""
    names = {"no weight caching": "disable_parameter_transpose_cache",
             "no fused wgrad accumulation": "gradient_accumulation_fusion",
             "one MTP layer per depth": "mtp_use_repeated_layer"}
    return [names[s["remedy"]] for s in report.suggestions if s["remedy"] in names]


def test_yaml_route_lists_the_free_remedy_first_in_suggest_order():
    report = audit_files(str(REPO / "configs" / "gpt-mtp-bf16.yaml"), None, FAST, suggest=True)
    fix = _qa001_fix(report)
    # BF16: nothing is cached, so passing None costs nothing here; the repeated layer's
    # replacement adds parameters, the most expensive.
    assert fix.startswith("set disable_parameter_transpose_cache: true (")
    assert "no cost here" in fix.split("; or ")[0]
    assert _in_order(fix, [f"set {key}:" for key in _suggested_settings(report)])
    assert fix.index("set gradient_accumulation_fusion: false") \
        < fix.index("set mtp_use_repeated_layer: false")
    free = [s for s in report.suggestions if s["cost"].startswith("none")]
    assert report.suggestions[:len(free)] == free  # --suggest too: the free ones first
    by_remedy = {s["remedy"]: s for s in report.suggestions}
    assert by_remedy["no weight caching"]["yaml"] == "disable_parameter_transpose_cache: true"
    assert by_remedy["no weight caching"]["passes"] is True


def test_quantized_config_prices_the_weight_cache_as_speed():
    report = audit_files(str(REPO / "configs" / "deepseek-v3-mtp-fp8.yaml"), None, FAST,
                         suggest=True)
    fix = _qa001_fix(report)
    assert "set disable_parameter_transpose_cache: true" in fix
    assert "costs speed" in fix and "no cost here" not in fix
    assert _in_order(fix, [f"set {key}:" for key in _suggested_settings(report)])


def test_launch_script_route_writes_flags(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(textwrap.dedent("""\
        #!/bin/bash
        torchrun pretrain_gpt.py \\
            --num-layers 2 --hidden-size 128 --num-attention-heads 4 \\
            --mtp-num-layers 2 --mtp-use-repeated-layer --bf16
        """))
    report = audit_files(str(script), None, FAST, suggest=True)
    fix = _qa001_fix(report)
    assert "drop --mtp-use-repeated-layer (" in fix
    assert "pass --no-gradient-accumulation-fusion (" in fix
    # Megatron-LM has no flag for it: said so, not a made-up flag.
    assert fix.startswith("no Megatron-LM flag sets disable_parameter_transpose_cache")
    assert "set mtp_use_repeated_layer:" not in fix
    by_remedy = {s["remedy"]: s for s in report.suggestions}
    assert by_remedy["one MTP layer per depth"]["yaml"] == "# drop --mtp-use-repeated-layer"


def test_bridge_route_writes_model_overrides_that_work():
    config = str(REPO / "configs" / "bridge-lightning-mtp-bf16.yaml")
    report = audit_files(config, None, FAST, suggest=True)
    fix = _qa001_fix(report)
    # The file lacks the key (a trimmed dump): Hydra would refuse it without `++`.
    assert fix.startswith("++model.disable_parameter_transpose_cache=true (")
    assert " model.mtp_use_repeated_layer=false (" in fix  # in the file: a plain override
    assert "set mtp_use_repeated_layer" not in fix
    first = report.suggestions[0]
    assert first["yaml"].splitlines() == [
        "model:", "  disable_parameter_transpose_cache: true",
        "# or the override argument: ++model.disable_parameter_transpose_cache=true"]
    # Each written override, applied as the user would apply it, clears QA001.
    for override in ("++model.disable_parameter_transpose_cache=true",
                     "model.mtp_use_repeated_layer=false"):
        fixed = audit_files(config, None, AuditOptions(steps=1, microbatches=2,
                                                       overrides=(override,)))
        assert "QA001" not in {f.rule for f in fixed.findings}, override


def test_bridge_route_names_the_ddp_section_for_the_sharding_strategy():
    class Source:
        origin, argv = "bridge", None

    class Config:
        source, file = Source(), "c.yaml"

        def where(self, key):
            return "c.yaml", 12  # in the file: a plain override

    assert remedies.written(Config(), "data_parallel_sharding_strategy", "optim_grads") \
        == "ddp.data_parallel_sharding_strategy=optim_grads"


@pytest.mark.parametrize("ranked", [remedies.FREE, remedies.PARAMETERS])
def test_cheapest_first_is_stable_and_by_rank(ranked):
    make = lambda name, rank: remedies.Remedy(name, None, name, "", "", rank)  # noqa: E731
    items = [make("b", ranked), make("a", remedies.SPEED), make("c", ranked)]
    order = [r.name for r in remedies.cheapest_first(items)]
    assert order == (["b", "c", "a"] if ranked < remedies.SPEED else ["a", "b", "c"])
