"""Recipe matching semantics (docs/semantics.md §3.1) on the §3.6 example."""

from __future__ import annotations

from pathlib import Path

from qaudit.load.precision import Quant
from qaudit.load.recipe import load_recipe

EXAMPLE = """\
configs:
  keep_high_precision:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe: {}
  experts_nvfp4:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp4_quantization_recipe: nvfp4
      override_nonquantized_autocast: true
    evaluation_recipe: {}
matchers:
  mtp_stays_hp: {type: glob, pattern: "mtp.*", config: keep_high_precision, enabled: true}
  experts:      {type: glob, pattern: "*.mlp.experts.*", config: experts_nvfp4, enabled: true}
  draft:        {type: glob, pattern: "*linear_fc2", config: keep_high_precision}
"""


def load(tmp_path: Path, text: str = EXAMPLE):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return load_recipe(path)


def test_first_enabled_match_wins_and_star_crosses_dots(tmp_path):
    recipe = load(tmp_path)
    assert recipe.match("decoder.layers.2.mlp.experts.linear_fc1").name == "experts"
    assert recipe.match("mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1").name == "mtp_stays_hp"
    assert recipe.match("decoder.layers.0.self_attention.linear_qkv") is None


def test_matcher_without_enabled_is_skipped(tmp_path):
    recipe = load(tmp_path)
    assert recipe.match("decoder.layers.0.mlp.linear_fc2") is None
    assert [(d.name, d.explicit) for d in recipe.disabled_matchers] == [("draft", False)]


def test_payload_defaults_and_evaluation_recipe(tmp_path):
    recipe = load(tmp_path)
    config = recipe.config_for(recipe.match("decoder.layers.2.mlp.experts.linear_fc1"))
    assert config.training.quant == Quant("fp4", "nvfp4")
    assert config.training.override_quantized_autocast is True
    assert config.training.override_nonquantized_autocast is True
    assert config.recipe_for(training=False).quant is None
    hp = recipe.config_for(recipe.match("mtp.layers.0.eh_proj"))
    assert hp.training.quant is None and hp.training.override_nonquantized_autocast is False


def test_unmatched_broken_payload_is_not_validated(tmp_path):
    text = EXAMPLE.replace("  keep_high_precision:\n", "  broken: {nonsense: 1}\n  keep_high_precision:\n")
    recipe = load(tmp_path, text)
    assert recipe.match("mtp.layers.0.eh_proj").config == "keep_high_precision"
