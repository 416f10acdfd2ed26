"""Hybrid (Mamba) models: the pattern, its layers and names, both input routes (docs/hybrid.md)."""

from __future__ import annotations


import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files, load_inputs
from qaudit.errors import InputError
from qaudit.plan.dims import model_dims
from qaudit.families.hybrid.pattern import parse_pattern, pattern_from_ratios
from qaudit.plan.pipeline import pipeline_layout
from tests.model_args import write_model_args as flags

FAST = AuditOptions(steps=1, microbatches=2)
BASE = """\
hidden_size: 256
num_attention_heads: 4
mamba_num_heads: 16
"""


def names(report, prefix: str = "") -> list[str]:
    return [row.name for row in report.modules if row.name.startswith(prefix)]


def rows(report) -> dict[str, object]:
    return {row.name: row for row in report.modules}


# --- the pattern ---------------------------------------------------------------------------


def assert_refused(path: str, where: str, key: str, words: tuple[str, ...]) -> None:
    """Loading `path` fails with a message naming the file (`where`), the key and `words`."""
    with pytest.raises(InputError) as info:
        load_inputs(path)
    message = str(info.value)
    assert f"key '{key}'" in message and where in message
    for word in words:
        assert word in message

def test_pattern_splits_pipeline_segments_and_mtp_depths():
    parsed = parse_pattern("M-M*|M-ME/*E/*E")
    assert parsed.segments == ("M-M*", "M-ME") and parsed.main == "M-M*M-ME"
    assert (parsed.mtp, parsed.mtp_depths) == ("*E", 2)
    assert parse_pattern("M*M-/").mtp_depths == 0  # upstream: nothing after '/' is no MTP


@pytest.mark.parametrize("pattern, words", [
    ("M*X-", ("'X' in the main pattern is not a layer symbol", "M (Mamba)")),
    ("MGM*", ("'G' (gated delta net) layers are not modelled",)),
    ("M+M", ("multi-latent attention",)),
    ("M*/M|M", ("'|' in the MTP pattern",)),
    ("M*/*E/*-", ("same pattern", "depth 2 is '*-'")),
    ("M*||M*", ("segment is empty",)),
    ("|", ("no layers",)),
])
def test_bad_patterns_say_what_is_wrong(pattern, words):
    with pytest.raises(ValueError) as info:
        parse_pattern(pattern)
    for word in words:
        assert word in str(info.value)


def test_ratios_spread_attention_then_mlp_among_mamba_layers():
    assert pattern_from_ratios(8, 0.25, 0.0) == "MM*MM*MM"
    pattern = pattern_from_ratios(10, 0.2, 0.2)
    assert (pattern.count("*"), pattern.count("-"), len(pattern)) == (2, 2, 10)
    assert pattern_from_ratios(4, 0.0, 0.0) == "MMMM"


# --- YAML route ----------------------------------------------------------------------------

def test_yaml_pattern_gives_layers_mtp_and_names(write_yaml):
    path = write_yaml("h.yaml", BASE + 'hybrid_layer_pattern: "M-*E/*-/*-"\nnum_moe_experts: 4\n')
    config = load_inputs(path)[0]
    assert (config.num_layers, config.mtp_num_layers) == (4, 2)
    assert config.moe_layer_pattern() == [False, False, False, True]
    assert not config.share_embeddings_and_output_weights  # HybridModel's default
    report = audit_files(path, options=FAST)
    assert names(report, "decoder.") == [
        "decoder.layers.0.mixer.in_proj", "decoder.layers.0.mixer.out_proj",
        "decoder.layers.1.mlp.linear_fc1", "decoder.layers.1.mlp.linear_fc2",
        "decoder.layers.2.self_attention.linear_qkv", "decoder.layers.2.self_attention.linear_proj",
        "decoder.layers.3.mlp.experts.linear_fc1", "decoder.layers.3.mlp.experts.linear_fc2"]
    assert names(report, "mtp.layers.1.") == [
        "mtp.layers.1.eh_proj",
        "mtp.layers.1.mtp_model_layer.layers.0.self_attention.linear_qkv",
        "mtp.layers.1.mtp_model_layer.layers.0.self_attention.linear_proj",
        "mtp.layers.1.mtp_model_layer.layers.1.mlp.linear_fc1",
        "mtp.layers.1.mtp_model_layer.layers.1.mlp.linear_fc2"]
    by_name = rows(report)
    assert by_name["decoder.layers.0.mixer.in_proj"].type == "TELayerNormColumnParallelLinear"
    assert by_name["decoder.layers.0.mixer.out_proj"].type == "TERowParallelLinear"
    assert by_name["decoder.layers.3.mlp.experts.linear_fc1"].type == \
        "TEColumnParallelGroupedLinear"  # the hybrid spec groups experts always
    assert by_name["output_layer"].type == "ColumnParallelLinear"


def test_mixer_widths_follow_mamba_fields(write_yaml):
    path = write_yaml("h.yaml", BASE + "hybrid_layer_pattern: M*\nmamba_num_groups: 4\n"
                                       "mamba_state_dim: 32\nmamba_head_dim: 16\n")
    config = load_inputs(path)[0]
    full = model_dims(config, full_size=True)
    assert (full.d_inner, full.mamba_heads) == (256, 16)  # 16 heads x head dim 16
    assert full.in_proj_out == 2 * 256 + 2 * 4 * 32 + 16
    shrunk = model_dims(config)
    assert shrunk.in_proj_out == 2 * 64 + 2 * 2 * 8 + 8 and shrunk.d_inner == 2 * shrunk.hidden
    # Without mamba_num_heads: d_inner = 2 * hidden_size, heads = d_inner / head dim.
    path = write_yaml("g.yaml", "hidden_size: 256\nnum_attention_heads: 4\nhybrid_layer_pattern: M\n")
    full = model_dims(load_inputs(path)[0], full_size=True)
    assert (full.d_inner, full.mamba_heads, full.mamba_groups, full.mamba_state) == (512, 8, 8, 128)


def test_both_mixer_linears_get_exact_gradients(write_yaml):
    path = write_yaml("h.yaml", BASE + "hybrid_layer_pattern: MM*\n")
    report = audit_files(path, options=AuditOptions(steps=1, microbatches=2, verify=True))
    for name in ("decoder.layers.0.mixer.in_proj", "decoder.layers.1.mixer.out_proj"):
        row = rows(report)[name]
        assert row.grad_rel_error is not None and row.grad_rel_error < 1e-4, name


@pytest.mark.parametrize("extra, key, words", [
    ("hybrid_layer_pattern: M*Q\n", "hybrid_layer_pattern", ("'Q'", "not a layer symbol")),
    ("hybrid_layer_pattern: M*M\nnum_layers: 4\n", "num_layers", ("contradicts", "3 decoder layers")),
    ("hybrid_layer_pattern: M*\nhybrid_override_pattern: M*\n", "hybrid_override_pattern",
     ("cannot be set together",)),
    ("hybrid_layer_pattern: M*E\n", "hybrid_layer_pattern", ("num_moe_experts is not set",)),
    ("hybrid_layer_pattern: M*/M\nmtp_num_layers: 2\n", "mtp_num_layers", ("1 MTP depths",)),
    ("hybrid_layer_pattern: M*\nmtp_num_layers: 1\n", "mtp_num_layers", ("no MTP part",)),
    ("hybrid_layer_pattern: M*|M*|M*\npipeline_model_parallel_size: 2\n", "hybrid_layer_pattern",
     ("3 '|' segments",)),
    ("hybrid_layer_pattern: M*M*\npipeline_model_parallel_size: 2\n"
     "virtual_pipeline_model_parallel_size: 2\n", "virtual_pipeline_model_parallel_size",
     ("needs '|' separators",)),
    ("hybrid_layer_pattern: M*\nmamba_num_groups: 3\n", "mamba_num_groups", ("multiple of",)),
    ("hybrid_attention_ratio: 0.5\nhybrid_layer_pattern: M*\n", "hybrid_attention_ratio",
     ("cannot be combined",)),
])
def test_bad_hybrid_yaml_names_file_line_and_key(write_yaml, extra, key, words):
    assert_refused(write_yaml("bad.yaml", BASE + extra), "bad.yaml:", key, words)


def test_ratios_build_a_pattern(write_yaml):
    path = write_yaml("r.yaml", BASE + "num_layers: 8\nhybrid_attention_ratio: 0.25\n")
    assert load_inputs(path)[0].hybrid_layer_pattern == "MM*MM*MM"


def test_mtp_depths_beside_ratios_are_refused_at_their_line(write_yaml):
    """A ratio pattern has no MTP part: mtp_num_layers with it is exit 2 (the fuzz campaign's
    `hybrid_mlp_ratio: 1` beside a GPT config's MTP depths was an internal error)."""
    path = write_yaml("r.yaml", BASE + "num_layers: 4\nhybrid_mlp_ratio: 1\nmtp_num_layers: 2\n")
    with pytest.raises(InputError, match="the pattern hybrid_mlp_ratio makes") as refused:
        load_inputs(path)
    assert refused.value.key == "mtp_num_layers" and refused.value.line is not None


def test_pipe_segments_are_the_model_chunks(write_yaml):
    path = write_yaml("p.yaml", BASE + "hybrid_layer_pattern: M*M|M-|M*|MMM-\n"
                                       "pipeline_model_parallel_size: 2\n")
    config = load_inputs(path)[0]
    assert config.virtual_pipeline_model_parallel_size == 2
    layout = [(c.stage, c.chunk, c.first_layer, c.num_layers) for c in pipeline_layout(config)]
    assert layout == [(0, 0, 0, 3), (1, 0, 3, 2), (0, 1, 5, 2), (1, 1, 7, 4)]
    report = audit_files(path, options=FAST)
    assert "stage1.chunk1/decoder.layers.3.mlp.linear_fc1" in names(report)
    assert "stage0.chunk1/decoder.layers.1.self_attention.linear_qkv" in names(report)


def test_first_last_bf16_on_the_global_index_and_mtp_stays_fp8(write_yaml):
    path = write_yaml("f.yaml", BASE + "hybrid_layer_pattern: M*M-/*-\nfp8: e4m3\n"
                                       "fp8_recipe: mxfp8\nfirst_last_layers_bf16: true\n")
    by_name = rows(audit_files(path, options=FAST))
    assert by_name["decoder.layers.0.mixer.in_proj"].precision == "bf16"
    assert by_name["decoder.layers.2.mixer.out_proj"].precision == "fp8/mxfp8"
    assert by_name["decoder.layers.3.mlp.linear_fc1"].precision == "bf16"
    assert {r.precision for n, r in by_name.items() if n.startswith("mtp.")} == {"fp8/mxfp8"}


def test_fp4_reaches_hybrid_mtp_layers_by_their_inner_index(write_yaml):
    """(inference) The MTP's inner HybridStack opens per-layer fp4 contexts; the MTP block
    itself only opens fp8. So eh_proj stays BF16 and inner layer 0 is a 'first' BF16 layer."""
    path = write_yaml("f.yaml", BASE + "hybrid_layer_pattern: M*M-/*-\nfp4: e2m1\n"
                                       "first_last_layers_bf16: true\n")
    by_name = rows(audit_files(path, options=FAST))
    assert by_name["mtp.layers.0.eh_proj"].precision == "bf16"
    assert by_name["mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_qkv"].precision \
        == "bf16"
    assert by_name["mtp.layers.0.mtp_model_layer.layers.1.mlp.linear_fc1"].precision == "fp4/nvfp4"


def test_repeated_hybrid_mtp_layer_overwrites_under_fp8(write_yaml):
    path = write_yaml("m.yaml", BASE + "hybrid_layer_pattern: M*/M-/M-\nfp8: e4m3\n"
                                       "fp8_recipe: tensorwise\nmtp_use_repeated_layer: true\n")
    report = audit_files(path, options=FAST)
    mtp = [r for r in report.modules if r.name.startswith("mtp.")]
    assert {r.name.split(".")[2] for r in mtp} == {"0"}
    assert {(r.calls_per_microbatch, r.verdict) for r in mtp} == {(2, "QA001")}
    assert "mtp.layers.0.mtp_model_layer.layers.0.mixer.in_proj" in {r.name for r in mtp}


def test_full_recompute_adds_a_nograd_call_to_mixer_linears(write_yaml):
    path = write_yaml("c.yaml", BASE + "hybrid_layer_pattern: M*M-\nrecompute_granularity: full\n"
                                       "recompute_method: uniform\nrecompute_num_layers: 1\n")
    row = rows(audit_files(path, options=FAST))["decoder.layers.2.mixer.in_proj"]
    assert (row.calls_per_microbatch, row.nograd_calls_per_microbatch) == (1, 1)


# --- flag route ----------------------------------------------------------------------------

FLAGS = """\
--hidden-size: 256
--num-attention-heads: 4
--mamba-num-heads: 16
--spec: "[megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec]"
"""


def test_flags_take_num_layers_from_the_pattern(write_yaml):
    path = flags(write_yaml, FLAGS + "--hybrid-layer-pattern: M-M*|M-M*\n"
                                     "--pipeline-model-parallel-size: 2\n")
    config = load_inputs(path)[0]
    assert (config.num_layers, config.virtual_pipeline_model_parallel_size) == (8, None)
    assert config.share_embeddings_and_output_weights  # tied unless --untie-... is given
    assert config.source.notes == []  # the hybrid spec is the one modelled: no warning


def test_flags_override_num_layers_and_mtp_depths_with_a_note(write_yaml):
    path = flags(write_yaml, FLAGS + "--hybrid-override-pattern: M*M*/*-\n--num-layers: 6\n"
                                     "--mtp-num-layers: 3\n")
    config = load_inputs(path)[0]
    assert (config.hybrid_layer_pattern, config.num_layers, config.mtp_num_layers) == \
        ("M*M*/*-", 4, 1)
    notes = " ".join(note.message for note in config.source.notes)
    assert "--num-layers 6: ignored" in notes and "pattern's 1 MTP depths" in notes


def test_legacy_mtp_pattern_is_appended_per_depth(write_yaml):
    path = flags(write_yaml, FLAGS + "--hybrid-layer-pattern: M*M*\n--mtp-num-layers: 2\n"
                                     "--mtp-hybrid-override-pattern: '*-'\n")
    config = load_inputs(path)[0]
    assert (config.hybrid_layer_pattern, config.mtp_num_layers) == ("M*M*/*-/*-", 2)


def test_mtp_num_layers_without_mtp_pattern_builds_no_mtp(write_yaml):
    path = flags(write_yaml, FLAGS + "--hybrid-layer-pattern: M*M*\n--mtp-num-layers: 2\n")
    config = load_inputs(path)[0]
    assert config.mtp_depths == 0
    assert any("no MTP is built" in note.message for note in config.source.notes)


@pytest.mark.parametrize("extra, flag, words", [
    ("--hybrid-layer-pattern: M*\n--hybrid-override-pattern: M*\n", "--hybrid-override-pattern",
     ("cannot be given together",)),
    ("--hybrid-layer-pattern: M*|M*\n--pipeline-model-parallel-size: 2\n"
     "--decoder-first-pipeline-num-layers: 1\n", "--decoder-first-pipeline-num-layers",
     ("'|' separators define",)),
    ("--hybrid-layer-pattern: M*M*\n--num-virtual-stages-per-pipeline-rank: 2\n",
     "--num-virtual-stages-per-pipeline-rank", ("cannot be used with a hybrid layer pattern",)),
    ("--hybrid-layer-pattern: M*|M*|M*\n--pipeline-model-parallel-size: 2\n",
     "--hybrid-layer-pattern", ("3 '|' segments",)),
    ("--hybrid-layer-pattern: MZ\n", "--hybrid-layer-pattern", ("'Z'",)),
])
def test_bad_hybrid_flags_name_file_line_and_flag(write_yaml, extra, flag, words):
    assert_refused(flags(write_yaml, FLAGS + extra), "model_config.yaml:", flag, words)


def test_is_hybrid_model_without_pattern_is_noted(write_yaml):
    path = flags(write_yaml, "--num-layers: 2\n--hidden-size: 64\n--num-attention-heads: 4\n"
                             "--is-hybrid-model: true\n")
    config = load_inputs(path)[0]
    assert not config.is_hybrid
    assert any("audited as a GPT stack" in note.message for note in config.source.notes)


def test_full_size_parameter_count_of_a_nemotron_h_8b_shape(repo_configs):
    from dataclasses import replace

    from qaudit.plan.sizes import model_params
    config = load_inputs(str(repo_configs / "nemotron-h-8b-fp8.yaml"))[0]
    assert 8.0e9 < model_params(replace(config, vocab_size=131072)) < 8.2e9  # "8B"
