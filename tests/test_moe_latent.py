"""MoE latent projections (`moe_latent_size`): Megatron's fc1_latent_proj / fc2_latent_proj
(TELinear, duplicated) around experts that run at the latent width
(megatron/core/transformer/moe/moe_layer.py, experts.py)."""

from __future__ import annotations

import pytest

from qaudit.commands.check import audit_files
from qaudit.errors import InputError
from qaudit.run.options import AuditOptions

LATENT_MOE = """\
num_layers: 2
hidden_size: 1024
ffn_hidden_size: 4096
num_attention_heads: 8
num_moe_experts: 8
moe_ffn_hidden_size: 512
moe_shared_expert_intermediate_size: 512
moe_grouped_gemm: true
moe_layer_freq: [0, 1]
moe_latent_size: 256
add_bias_linear: false
seq_length: 4096
fp8: e4m3
fp8_recipe: blockwise
"""


def test_latent_projections_are_built_and_audited_as_te_linears(write_yaml):
    report = audit_files(write_yaml("latent.yaml", LATENT_MOE), options=AuditOptions())
    rows = {r.name: r for r in report.modules}
    for name in ("decoder.layers.1.mlp.fc1_latent_proj", "decoder.layers.1.mlp.fc2_latent_proj"):
        assert rows[name].type == "TELinear" and rows[name].precision == "fp8/blockwise"
        assert rows[name].calls_per_microbatch == 1
    assert "decoder.layers.0.mlp.fc1_latent_proj" not in rows  # a dense layer
    assert not any(f.rule == "QA090" and "latent" in f.message for f in report.findings)


def test_experts_run_at_the_latent_width_and_the_shared_experts_at_the_hidden_width(write_yaml):
    full = audit_files(write_yaml("latent.yaml", LATENT_MOE), options=AuditOptions(full_size=True))
    shapes = {s["modules"]: s for s in full.gemm_shapes}
    down = shapes["decoder.layers.*.mlp.fc1_latent_proj"]
    up = shapes["decoder.layers.*.mlp.fc2_latent_proj"]
    assert (down["k"], down["n"], up["k"], up["n"]) == (1024, 256, 256, 1024)
    fc1, fc2 = shapes["decoder.layers.*.mlp.experts.linear_fc1"], shapes[
        "decoder.layers.*.mlp.experts.linear_fc2"]
    assert (fc1["k"], fc2["n"]) == (256, 256)
    assert shapes["decoder.layers.*.mlp.shared_experts.linear_fc1"]["k"] == 1024
    # The shrunk build's table is the real-width one, as for every other module.
    shrunk = audit_files(write_yaml("latent.yaml", LATENT_MOE), options=AuditOptions())
    assert shrunk.gemm_shapes == full.gemm_shapes


def test_a_recipe_matcher_keeps_the_latent_projections_in_bf16(write_yaml):
    recipe = write_yaml("recipe.yaml", """\
        configs:
          hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
        matchers:
          latent: {type: glob, pattern: '*_latent_proj', config: hp, enabled: true}
        """)
    report = audit_files(write_yaml("latent.yaml", LATENT_MOE + "quant_recipe: recipe.yaml\n"),
                         recipe)
    rows = {r.name: r for r in report.modules}
    assert rows["decoder.layers.1.mlp.fc1_latent_proj"].precision == "bf16"
    assert rows["decoder.layers.1.mlp.experts.linear_fc1"].precision == "fp8/blockwise"


def test_a_latent_size_below_one_is_exit_2_at_its_line(write_yaml):
    path = write_yaml("latent.yaml", LATENT_MOE.replace("moe_latent_size: 256",
                                                        "moe_latent_size: 0"))
    with pytest.raises(InputError) as caught:
        audit_files(path, options=AuditOptions())
    assert caught.value.key == "moe_latent_size" and caught.value.line == 10  # moe_latent_size


def test_the_cross_checks_upstream_build_runs_its_experts_at_qaudits_shrunk_latent_width(
        write_yaml):
    """Upstream's build is shrunk as qaudit's own is, the latent width with the rest: at the
    real width Nemotron-3 Ultra's 512 experts alone passed the worker's memory limit."""
    from pathlib import Path

    from qaudit.crosscheck.upstream_config import cpu_overrides
    from qaudit.load.config import load_model_config
    from qaudit.plan.dims import model_dims

    config = load_model_config(Path(write_yaml("latent.yaml", LATENT_MOE)))
    shrunk = model_dims(config)
    assert cpu_overrides(config)["moe_latent_size"] == shrunk.moe_latent < 256
    assert "moe_latent_size" not in cpu_overrides(load_model_config(Path(write_yaml(
        "plain.yaml", LATENT_MOE.replace("moe_latent_size: 256\n", "")))))
