"""Ambient precision (docs/semantics.md §4) and the recipe decision (§3.3)."""

from __future__ import annotations

import pytest

from qaudit.load.config import ModelConfig
from qaudit.plan.execution import (decoder_layer_ambient, is_first_last_bf16_layer, mtp_ambient,
                         output_layer_ambient, resolve_execution)
from qaudit.load.precision import Quant
from qaudit.load.recipe import TERecipe

FP8 = Quant("fp8", "tensorwise")
NVFP4 = Quant("fp4", "nvfp4")


def config(**fields) -> ModelConfig:
    base = {"num_layers": 6, "hidden_size": 64, "num_attention_heads": 4}
    base.update(fields)
    return ModelConfig(**base)


def recipe(quant: Quant | None = None, override_q=True, override_nonq=False) -> TERecipe:
    fp8 = quant.recipe if quant and quant.fmt == "fp8" else None
    fp4 = quant.recipe if quant and quant.fmt == "fp4" else None
    return TERecipe(fp8_quantization_recipe=fp8, fp4_quantization_recipe=fp4,
                    custom_recipe_factory=None, fp8_format="e4m3",
                    override_quantized_autocast=override_q,
                    override_nonquantized_autocast=override_nonq, tp_only_amax_red=False,
                    fp8_param=False, fp4_param=False)


def test_first_last_rule_uses_global_zero_based_index():
    cfg = config(first_last_layers_bf16=True, num_layers_at_start_in_bf16=2, num_layers_at_end_in_bf16=1)
    assert [is_first_last_bf16_layer(cfg, i) for i in range(6)] == [True, True, False, False, False, True]
    assert not is_first_last_bf16_layer(config(), 0)


def test_fp8_delayed_covers_the_whole_block():
    cfg = config(fp8="e4m3", fp8_recipe="delayed")
    assert all(decoder_layer_ambient(cfg, i) == Quant("fp8", "delayed", "e4m3") for i in range(6))


def test_fp8_first_last_layers_run_bf16_but_mtp_stays_fp8():
    cfg = config(fp8="e4m3", fp8_recipe="tensorwise", first_last_layers_bf16=True, mtp_num_layers=1)
    assert decoder_layer_ambient(cfg, 0) is None
    assert decoder_layer_ambient(cfg, 5) is None
    assert decoder_layer_ambient(cfg, 3) == FP8
    assert mtp_ambient(cfg) == FP8


def test_fp4_applies_the_rule_and_is_ignored_by_mtp():
    cfg = config(fp4="e2m1", first_last_layers_bf16=True)
    assert decoder_layer_ambient(cfg, 0) is None
    assert decoder_layer_ambient(cfg, 2) == NVFP4
    assert mtp_ambient(cfg) is None


def test_output_layer_quantized_only_with_fp8_output_proj_and_mxfp8():
    assert output_layer_ambient(config(fp8="e4m3", fp8_recipe="mxfp8", fp8_output_proj=True)) == \
        Quant("fp8", "mxfp8", "e4m3")
    assert output_layer_ambient(config(fp8="e4m3", fp8_recipe="mxfp8")) is None


@pytest.mark.parametrize("ambient, rec, expected", [
    (FP8, None, FP8),                                         # no recipe: ambient
    (None, None, None),
    (FP8, recipe(None, override_q=False), FP8),               # no override: ambient recipe
    (FP8, recipe(None), None),                                # {} under fp8: high precision
    (FP8, recipe(NVFP4), NVFP4),                              # override to the recipe's format
    (None, recipe(NVFP4), None),                              # BF16 ambient, no override: HP
    (None, recipe(NVFP4, override_nonq=True), NVFP4),         # BF16 ambient, override: recipe
    (None, recipe(None, override_nonq=True), None),
])
def test_resolve_execution_table(ambient, rec, expected):
    assert resolve_execution(ambient, rec) == expected
