"""Encoder-decoder (T5) models: names, counts, cross-attention, precision, both input routes
(docs/t5.md)."""

from __future__ import annotations

import textwrap

import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files, load_inputs
from qaudit.plan.sizes import model_params
from cli_helpers import run_in_process
from test_hybrid import assert_refused, names, rows
from model_args import write_model_args as flags

# Megatron-LM main: BF16 configs are untracked there (0.19.2 adds a QA003 note per module).
FAST = AuditOptions(steps=1, microbatches=2, megatron="main")
BASE = """\
hidden_size: 64
num_attention_heads: 4
"""
CROSS = ("linear_q", "linear_kv", "linear_proj")


# --- YAML route ----------------------------------------------------------------------------

def test_yaml_encoder_and_decoder_counts_and_upstream_names(write_yaml):
    path = write_yaml("t.yaml", BASE + "encoder_num_layers: 3\nnum_layers: 2\n")
    config = load_inputs(path)[0]
    assert config.is_t5 and (config.encoder_num_layers, config.num_layers) == (3, 2)
    assert not config.share_embeddings_and_output_weights  # T5Model's default
    report = audit_files(path, options=FAST)
    assert names(report, "encoder.layers.2.") == [
        "encoder.layers.2.self_attention.linear_qkv", "encoder.layers.2.self_attention.linear_proj",
        "encoder.layers.2.mlp.linear_fc1", "encoder.layers.2.mlp.linear_fc2"]
    assert names(report, "decoder.layers.1.") == [
        "decoder.layers.1.self_attention.linear_qkv", "decoder.layers.1.self_attention.linear_proj",
        *(f"decoder.layers.1.cross_attention.{n}" for n in CROSS),
        "decoder.layers.1.mlp.linear_fc1", "decoder.layers.1.mlp.linear_fc2"]
    assert not names(report, "encoder.layers.3") and not names(report, "decoder.layers.2")
    order = [row.name for row in report.modules]
    assert order[0].startswith("encoder.") and order[-1] == "lm_head.output_layer"
    assert order.index("encoder.layers.2.mlp.linear_fc2") < order.index(
        "decoder.layers.0.self_attention.linear_qkv")


def test_te_classes_follow_the_t5_spec(write_yaml):
    path = write_yaml("t.yaml", BASE + "encoder_num_layers: 1\nnum_layers: 1\n")
    by_name = rows(audit_files(path, options=FAST))
    kind = {name: row.type for name, row in by_name.items()}
    assert kind["decoder.layers.0.self_attention.linear_qkv"] == "TELayerNormColumnParallelLinear"
    assert kind["decoder.layers.0.cross_attention.linear_q"] == "TEColumnParallelLinear"  # no norm
    assert kind["decoder.layers.0.cross_attention.linear_kv"] == "TEColumnParallelLinear"
    assert kind["decoder.layers.0.cross_attention.linear_proj"] == "TERowParallelLinear"
    assert kind["lm_head.output_layer"] == "ColumnParallelLinear"


def test_each_module_runs_once_per_microbatch_and_cross_attention_gets_exact_gradients(write_yaml):
    """The encoder runs once; its output feeds every decoder layer's linear_kv, whose
    gradients (and the encoder's, summed over the decoder layers) match plain autograd."""
    path = write_yaml("t.yaml", BASE + "encoder_num_layers: 2\nnum_layers: 2\n")
    report = audit_files(path, options=AuditOptions(steps=1, microbatches=2, verify=True,
                                                    megatron="main"))
    assert {row.calls_per_microbatch for row in report.modules} == {1}
    for name in ("decoder.layers.1.cross_attention.linear_kv", "decoder.layers.0.cross_attention.linear_q",
                 "encoder.layers.0.self_attention.linear_qkv", "encoder.layers.1.mlp.linear_fc2"):
        row = rows(report)[name]
        assert row.grad_rel_error is not None and row.grad_rel_error < 1e-4, name
    assert report.findings == []


def test_first_last_bf16_per_block_under_fp8(write_yaml):
    """Each TransformerBlock applies the rule with its own config's num_layers: the encoder's
    copy has the encoder's count, so both blocks keep their own first and last layers BF16."""
    path = write_yaml("f.yaml", BASE + "encoder_num_layers: 4\nnum_layers: 3\nfp8: e4m3\n"
                                       "fp8_recipe: mxfp8\nfirst_last_layers_bf16: true\n")
    by_name = rows(audit_files(path, options=FAST))
    precision = {n: r.precision for n, r in by_name.items()}
    for block, count in (("encoder", 4), ("decoder", 3)):
        assert precision[f"{block}.layers.0.mlp.linear_fc1"] == "bf16"
        assert precision[f"{block}.layers.{count - 1}.self_attention.linear_qkv"] == "bf16"
        assert precision[f"{block}.layers.1.mlp.linear_fc2"] == "fp8/mxfp8"
    assert precision["decoder.layers.1.cross_attention.linear_kv"] == "fp8/mxfp8"
    assert precision["decoder.layers.2.cross_attention.linear_kv"] == "bf16"
    assert precision["lm_head.output_layer"] == "bf16"
    assert by_name["encoder.layers.1.mlp.linear_fc2"].tracked == "yes"


def test_fp8_output_proj_builds_no_te_head(write_yaml):
    path = write_yaml("o.yaml", BASE + "encoder_num_layers: 1\nnum_layers: 1\nfp8: e4m3\n"
                                       "fp8_recipe: mxfp8\nfp8_output_proj: true\n")
    assert rows(audit_files(path, options=FAST))["lm_head.output_layer"].type == "ColumnParallelLinear"


def test_a_recipe_binds_no_t5_module_as_upstream(write_yaml):
    """megatron-core 0.19.2's T5Model has no finish_init walk: a matcher naming a T5 module
    binds nothing and the module runs in the global fp8 (what --cross-check showed)."""
    recipe = write_yaml("r.yaml", textwrap.dedent("""\
        configs:
          bf16: {transformer_engine_config_type: TEQuantizationParams,
                 training_recipe: {}}
        matchers:
          kv: {type: glob, pattern: "*cross_attention.linear_kv", config: bf16, enabled: true}
        """))
    path = write_yaml("t.yaml", BASE + "encoder_num_layers: 1\nnum_layers: 2\nfp8: e4m3\n"
                                       "fp8_recipe: tensorwise\n")
    by_name = rows(audit_files(path, recipe, options=FAST))
    kv = by_name["decoder.layers.1.cross_attention.linear_kv"]
    assert (kv.recipe, kv.precision) == ("-", "fp8/tensorwise")
    assert by_name["decoder.layers.1.cross_attention.linear_q"].recipe == "-"


def test_a_t5_quant_recipe_is_read_no_effect(write_yaml):
    recipe = write_yaml("r.yaml", "configs: {}\nmatchers: {}\n")
    path = write_yaml("t.yaml", BASE + "encoder_num_layers: 1\nnum_layers: 2\nfp8: e4m3\n"
                                       f"quant_recipe: {recipe}\n")
    config, _ = load_inputs(str(path))
    notes = [n for n in config.source.notes if n.key == "quant_recipe"]
    assert notes and notes[0].no_effect and "finish_init" in notes[0].message


def test_full_recompute_reruns_decoder_layers_with_the_encoder_output(write_yaml):
    path = write_yaml("c.yaml", BASE + "encoder_num_layers: 1\nnum_layers: 2\n"
                                       "recompute_granularity: full\nrecompute_method: uniform\n"
                                       "recompute_num_layers: 1\n")
    row = rows(audit_files(path, options=FAST))["decoder.layers.1.cross_attention.linear_kv"]
    assert (row.calls_per_microbatch, row.nograd_calls_per_microbatch) == (1, 1)


@pytest.mark.parametrize("extra, key, words", [
    ("encoder_num_layers: 0\n", "encoder_num_layers", ("must be >= 1",)),
    ("encoder_num_layers: two\n", "encoder_num_layers", ("expected an integer",)),
    ("encoder_num_layers: 2\npipeline_model_parallel_size: 2\n", "pipeline_model_parallel_size",
     ("cannot be pipelined", "not supported for T5")),
    ("encoder_num_layers: 2\nnum_moe_experts: 4\n", "num_moe_experts", ("dense MLPs only",)),
    ("encoder_num_layers: 2\nmtp_num_layers: 1\n", "mtp_num_layers", ("no multi-token",)),
    ("encoder_num_layers: 2\nmulti_latent_attention: true\n", "multi_latent_attention",
     ("no MLA",)),
    ("encoder_num_layers: 2\nnum_query_groups: 2\n", "num_query_groups",
     ("as many query groups as attention heads",)),
    ("encoder_num_layers: 1023\n", "encoder_num_layers", ("limit is 1024",)),
])
def test_bad_t5_yaml_names_file_line_and_key(write_yaml, extra, key, words):
    assert_refused(write_yaml("t.yaml", BASE + "num_layers: 2\n" + extra), "t.yaml:", key, words)


def test_full_size_parameter_count_adds_encoder_and_cross_attention(write_yaml):
    path = write_yaml("t.yaml", BASE + "encoder_num_layers: 2\nnum_layers: 3\nvocab_size: 100\n")
    config = load_inputs(path)[0]
    h = 64
    dense = 4 * h * h + 2 * h * 4 * h  # qkv + proj, fc1 + fc2 (ffn 4h)
    assert model_params(config) == 100 * h * 2 + 5 * dense + 3 * 4 * h * h


# --- flag route ----------------------------------------------------------------------------

FLAGS = """\
--hidden-size: 64
--num-attention-heads: 4
--encoder-seq-length: 512
--decoder-seq-length: 128
--max-position-embeddings: 512
"""


def test_flags_build_encoder_and_decoder_with_the_encoder_count(write_yaml):
    path = flags(write_yaml, FLAGS + "--encoder-num-layers: 3\n--decoder-num-layers: 3\n")
    config = load_inputs(path)[0]
    assert (config.encoder_num_layers, config.num_layers) == (3, 3)
    assert config.share_embeddings_and_output_weights  # tied unless --untie-... is given
    assert config.source.notes == []


def test_decoder_num_layers_is_not_read_upstream_and_noted(write_yaml):
    path = flags(write_yaml, FLAGS + "--encoder-num-layers: 3\n--decoder-num-layers: 5\n"
                                     "--untie-embeddings-and-output-weights: true\n")
    config = load_inputs(path)[0]
    assert (config.encoder_num_layers, config.num_layers) == (3, 3)
    assert not config.share_embeddings_and_output_weights
    notes = [note for note in config.source.notes if note.key == "--decoder-num-layers"]
    assert len(notes) == 1 and "never reads it" in notes[0].message and notes[0].line == 8


def test_num_layers_with_decoder_num_layers_gives_both_blocks(write_yaml):
    path = flags(write_yaml, FLAGS + "--num-layers: 2\n--decoder-num-layers: 2\n")
    config = load_inputs(path)[0]
    assert (config.encoder_num_layers, config.num_layers) == (2, 2)


@pytest.mark.parametrize("extra, flag, words", [
    ("--encoder-num-layers: 2\n--num-layers: 2\n", "--encoder-num-layers",
     ("cannot be given together with --num-layers",)),
    ("--decoder-num-layers: 2\n", "--decoder-num-layers", ("needs --encoder-num-layers",)),
    ("--encoder-num-layers: 2\n--pipeline-model-parallel-size: 2\n",
     "--pipeline-model-parallel-size", ("cannot be pipelined",)),
    # Megatron's parser converts with int() before anything else reads it.
    ("--encoder-num-layers: x\n", "--encoder-num-layers", ("invalid int value: 'x'",)),
])
def test_bad_t5_flags_name_file_line_and_flag(write_yaml, extra, flag, words):
    assert_refused(flags(write_yaml, FLAGS + extra), "model_config.yaml:", flag, words)


def test_cli_audits_a_t5_flag_file(write_yaml, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    path = flags(write_yaml, FLAGS + "--encoder-num-layers: 2\n--decoder-num-layers: 2\n"
                                     "--bf16: true\n")
    code, out, _ = run_in_process(monkeypatch, capsys, "check", path, "--steps", "1",
                                  "--microbatches", "2", cwd=None)
    assert code == 0
    assert "decoder.layers.[0-1].cross_attention.linear_kv" in out
    assert "encoder.layers.[0-1].self_attention.linear_qkv" in out


def test_torchrun_refuses_t5_before_building(write_yaml):
    from qaudit.run.audit import check_world_matches_stages
    from qaudit.run.distributed import World
    from qaudit.errors import InputError

    config = load_inputs(write_yaml("t.yaml", BASE + "encoder_num_layers: 2\nnum_layers: 2\n"))[0]
    with pytest.raises(InputError, match="T5.*cannot be pipelined.*without torchrun"):
        check_world_matches_stages(config, World(0, 2))
