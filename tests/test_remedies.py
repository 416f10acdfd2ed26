"""QA001's fix line: remedies the input can say first, cheapest first (the pricing --suggest
uses), written in the input's own syntax and place, one test per input route (issue 39, item
1; issue 45, items 1 and 2)."""

from __future__ import annotations

import re
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
    passing = [s for s in report.suggestions if s["passes"]]
    assert report.suggestions[:len(passing)] == passing  # --suggest: those that pass first
    writable = [s for s in passing if not s["yaml"].startswith("#")]
    assert passing[:len(writable)] == writable  # then those the input can say
    free = [s for s in writable if s["cost"].startswith("none")]
    assert writable[:len(free)] == free  # and among them the free ones first
    by_remedy = {s["remedy"]: s for s in report.suggestions}
    assert by_remedy["no weight caching"]["yaml"] == "disable_parameter_transpose_cache: true"
    assert by_remedy["no weight caching"]["passes"] is True


def _gib(text: str) -> float:
    number, unit = re.search(r"costs (?:\+[\d.]+ [MB] parameters, [\d.,]+ GiB held, )?"
                             r"([\d.,]+) (GiB|MiB) more traffic", text).groups()
    return float(number.replace(",", "")) / (1024 if unit == "MiB" else 1)


def test_quantized_config_prices_every_remedy_in_one_unit_and_orders_by_price():
    report = audit_files(str(REPO / "configs" / "deepseek-v3-mtp-fp8.yaml"), None, FAST,
                         suggest=True)
    fix = _qa001_fix(report)
    parts = fix.split("; or ")
    # Nested YAML: each says where it goes.
    assert all(part.split(" (")[0].endswith("under model:") for part in parts), parts
    assert "set disable_parameter_transpose_cache: true under model:" in fix
    assert "no cost here" not in fix and "every call re-quantizes" not in fix
    prices = [_gib(part) for part in parts]
    assert prices == sorted(prices)
    # The repeated layer's replacement is priced by the optimizer traffic of its parameters
    # and comes first on DeepSeek-V3: re-quantizing or unfusing touches every weight.
    assert parts[0].startswith("set mtp_use_repeated_layer: false under model:")
    assert _in_order(fix, [f"set {key}:" for key in _suggested_settings(report)])


def test_primary_fp8_weights_have_no_weight_cache_to_lose(tmp_path):
    text = (REPO / "configs" / "deepseek-v3-mtp-fp8.yaml").read_text()
    config = tmp_path / "primary.yaml"
    config.write_text(text.replace("  fp8: e4m3\n", "  fp8: e4m3\n  fp8_param: true\n"))
    fix = _qa001_fix(audit_files(str(config), None, FAST))
    first = fix.split("; or ")[0]
    assert first.startswith("set disable_parameter_transpose_cache: true under model: (")
    assert "no cost here: primary quantized weights have no cache" in first
    assert "re-quantiz" not in fix


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
    assert "remove --mtp-use-repeated-layer from the launch command at line 4 (" in fix
    assert "add --no-gradient-accumulation-fusion before --num-layers at line 3 (" in fix
    # Megatron-LM has no flag for it: said so, not a made-up flag, and listed after every
    # remedy the script can say, marked as a code change with where.
    parts = fix.split("; or ")
    code = [i for i, part in enumerate(parts) if part.startswith("needs a")]
    assert code and code == list(range(code[0], len(parts)))
    assert any(part.startswith("needs a code change: no Megatron-LM flag sets "
                               "disable_parameter_transpose_cache; set it to True on the "
                               "TransformerConfig in core_transformer_config_from_args")
               for part in parts)
    assert "set mtp_use_repeated_layer:" not in fix
    by_remedy = {s["remedy"]: s for s in report.suggestions}
    assert by_remedy["one MTP layer per depth"]["yaml"] \
        == "# remove --mtp-use-repeated-layer from the launch command at line 4"
    assert by_remedy["no weight caching"]["yaml"].startswith("# needs a code change: ")


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


@pytest.mark.parametrize("ranked", [remedies.FREE, remedies.PRECISION])
def test_cheapest_first_is_stable_and_by_rank(ranked):
    make = lambda name, rank: remedies.Remedy(name, ("k", 1), name, "", "", rank)  # noqa: E731
    items = [make("b", ranked), make("a", remedies.SPEED), make("c", ranked)]
    order = [r.name for r in remedies.cheapest_first(items)]
    assert order == (["b", "c", "a"] if ranked < remedies.SPEED else ["a", "b", "c"])


def test_priced_remedies_sort_by_price_and_code_changes_last():
    make = lambda name, price, setting=("k", 1): remedies.Remedy(  # noqa: E731
        name, setting, name, "", "", remedies.PRICED, price)
    items = [make("dear", 9.0), make("upgrade", None, None), make("cheap", 1.0)]
    assert [r.name for r in remedies.cheapest_first(items)] == ["cheap", "dear", "upgrade"]
