"""Pipeline layouts: stage/chunk split, stage-local names, per-chunk recipe matching (issue 6)."""

from __future__ import annotations

import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files
from qaudit.load.config import ModelConfig
from qaudit.errors import InputError
from qaudit.plan.pipeline import pipeline_layout

HP_LAYER0 = """\
configs:
  hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
matchers:
  layer0: {type: glob, pattern: "decoder.layers.0.*", config: hp, enabled: true}
"""


def layout(**fields):
    base = {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4}
    base.update(fields)
    return [(c.stage, c.chunk, c.first_layer, c.num_layers) for c in pipeline_layout(ModelConfig(**base))]


def test_uniform_stages():
    assert layout(pipeline_model_parallel_size=4) == [(0, 0, 0, 2), (1, 0, 2, 2), (2, 0, 4, 2), (3, 0, 6, 2)]


def test_virtual_chunks_interleave_layers_over_stages():
    assert layout(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2) == [
        (0, 0, 0, 2), (1, 0, 2, 2), (0, 1, 4, 2), (1, 1, 6, 2)]


def test_embedding_and_loss_take_a_layer_slot():
    assert layout(num_layers=6, pipeline_model_parallel_size=2,
                  account_for_embedding_in_pipeline_split=True,
                  account_for_loss_in_pipeline_split=True) == [(0, 0, 0, 3), (1, 0, 3, 3)]
    assert layout(num_layers=7, pipeline_model_parallel_size=2,
                  account_for_embedding_in_pipeline_split=True) == [(0, 0, 0, 3), (1, 0, 3, 4)]


def test_virtual_chunks_with_embedding_and_loss_slots():
    # Megatron's pp4 vp2 functional test: 6 layers + 2 slots, one slot per chunk.
    assert layout(num_layers=6, pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
                  account_for_embedding_in_pipeline_split=True,
                  account_for_loss_in_pipeline_split=True) == [
        (0, 0, 0, 0), (1, 0, 0, 1), (2, 0, 1, 1), (3, 0, 2, 1),
        (0, 1, 3, 1), (1, 1, 4, 1), (2, 1, 5, 1), (3, 1, 6, 0)]


def test_uneven_first_and_last_stage():
    assert layout(num_layers=10, pipeline_model_parallel_size=4, num_layers_in_first_pipeline_stage=1,
                  num_layers_in_last_pipeline_stage=1) == [(0, 0, 0, 1), (1, 0, 1, 4), (2, 0, 5, 4), (3, 0, 9, 1)]


@pytest.mark.parametrize("fields", [{"pipeline_model_parallel_size": 3},
                                    {"pipeline_model_parallel_size": 2,
                                     "virtual_pipeline_model_parallel_size": 3}])
def test_splits_megatron_rejects_are_input_errors(fields):
    with pytest.raises(InputError):
        layout(**fields)


def test_names_are_stage_local_and_recipes_match_per_chunk(write_yaml):
    config = write_yaml("c.yaml", "num_layers: 4\nhidden_size: 128\nnum_attention_heads: 4\n"
                        "pipeline_model_parallel_size: 2\nmtp_num_layers: 1\nfp8: e4m3\n"
                        "fp8_recipe: tensorwise\nquant_recipe: r.yaml\n")
    write_yaml("r.yaml", HP_LAYER0)
    report = audit_files(config)
    rows = {r.name: r for r in report.modules}
    # Global layers 0 and 2 are both "decoder.layers.0" in their stage: the pattern hits both.
    assert rows["stage0/decoder.layers.0.mlp.linear_fc1"].recipe == "hp"
    assert rows["stage1/decoder.layers.0.mlp.linear_fc1"].recipe == "hp"
    assert rows["stage1/decoder.layers.1.mlp.linear_fc1"].precision == "fp8/tensorwise"
    assert (rows["stage1/mtp.layers.0.eh_proj"].stage, rows["stage1/output_layer"].stage) == (1, 1)
    assert "QA017" in {f.rule for f in report.findings}
    assert report.to_dict()["modules"][0]["stage"] == 0


def test_first_last_bf16_uses_the_global_layer_index(write_yaml):
    config = write_yaml("c.yaml", "num_layers: 4\nhidden_size: 128\nnum_attention_heads: 4\n"
                        "pipeline_model_parallel_size: 2\nfp8: e4m3\nfp8_recipe: tensorwise\n"
                        "first_last_layers_bf16: true\n")
    rows = {r.name: r.precision for r in audit_files(config).modules}
    assert rows["stage0/decoder.layers.0.mlp.linear_fc1"] == "bf16"        # global 0
    assert rows["stage1/decoder.layers.0.mlp.linear_fc1"] == "fp8/tensorwise"  # global 2
    assert rows["stage1/decoder.layers.1.mlp.linear_fc1"] == "bf16"        # global 3


def test_rank_shows_one_stage(write_yaml):
    config = write_yaml("c.yaml", "num_layers: 4\nhidden_size: 128\nnum_attention_heads: 4\n"
                        "pipeline_model_parallel_size: 2\n")
    report = audit_files(config, options=AuditOptions(rank=1))
    assert report.modules and {r.stage for r in report.modules} == {1}
    with pytest.raises(InputError):
        audit_files(config, options=AuditOptions(rank=2))


def test_te_output_layer_with_tied_embeddings_needs_pipelining(write_yaml):
    text = ("num_layers: 2\nhidden_size: 128\nnum_attention_heads: 4\nfp8: e4m3\n"
            "fp8_recipe: mxfp8\nfp8_output_proj: true\n")
    with pytest.raises(InputError):
        audit_files(write_yaml("a.yaml", text))
    rows = audit_files(write_yaml("b.yaml", text + "pipeline_model_parallel_size: 2\n")).modules
    assert rows[-1].type == "TELMHeadColumnParallelLinear"
