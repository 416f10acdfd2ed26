"""qaudit's model against Megatron's own code (issue 13, docs/upstream-model.md): MLA classes,
the fused MLA down projection, the flag route's argument rules, pipeline layouts and the
modelopt spec. Each test states the upstream fact it pins."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files, load_inputs
from qaudit.errors import InputError
from cli_helpers import run_in_process

FAST = AuditOptions(steps=1, microbatches=2)


@pytest.fixture
def write(tmp_path: Path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return str(path)
    return write


def types_of(report, prefix: str) -> dict[str, str]:
    """Row name after `prefix` -> upstream class, for the rows under `prefix`."""
    return {row.name[len(prefix):]: row.type for row in report.modules
            if row.name.startswith(prefix)}


# --- multi-latent attention: qk_layernorm and the fused down projection -----------------------

MLA = """\
num_layers: 2
hidden_size: 64
num_attention_heads: 4
multi_latent_attention: true
q_lora_rank: 32
fp8: e4m3
fp8_recipe: blockwise
"""
ATTN = "decoder.layers.0.self_attention."


def test_mla_up_projections_fuse_a_norm_only_with_qk_layernorm(write):
    plain = types_of(audit_files(write("a.yaml", MLA), None, FAST), ATTN)
    assert plain == {"linear_q_down_proj": "TELinear", "linear_q_up_proj": "TEColumnParallelLinear",
                     "linear_kv_down_proj": "TELinear",
                     "linear_kv_up_proj": "TEColumnParallelLinear",
                     "linear_proj": "TERowParallelLinear"}
    normed = types_of(audit_files(write("b.yaml", MLA + "qk_layernorm: true\n"), None, FAST), ATTN)
    assert normed == {**plain, "linear_q_up_proj": "TELayerNormColumnParallelLinear",
                      "linear_kv_up_proj": "TELayerNormColumnParallelLinear"}


@pytest.mark.parametrize("mla", [MLA, MLA + "mla_down_proj_fusion: true\n",
                                 MLA.replace("q_lora_rank: 32", "q_lora_rank: null")])
def test_selective_recompute_of_mla_up_proj_reruns_the_up_projections(write, mla):
    """multi_latent_attention.py runs qkv_up_proj_and_rope_apply under a checkpoint: one no-grad
    pass, then the grad rerun in backward, which sees False and accumulates."""
    text = mla + "recompute_granularity: selective\nrecompute_modules: [mla_up_proj]\n"
    rows = {r.name[len(ATTN):]: r for r in audit_files(write("r.yaml", text), None, FAST).modules
            if r.name.startswith(ATTN)}
    up = [n for n in rows if "up_proj" in n or n == "linear_q_proj"]
    assert len(up) == 2
    for name, row in rows.items():
        expected = (1, "accumulate") if name in up else (0, "overwrite-first")
        assert (row.nograd_calls_per_microbatch, row.accumulation) == expected, name


def test_mla_single_q_projection_fuses_the_norm_with_qk_layernorm(write):
    # mla_qk_norm_config.py: without q_lora_rank the query norm goes into linear_q_proj.
    base = MLA.replace("q_lora_rank: 32", "q_lora_rank: null")
    assert types_of(audit_files(write("a.yaml", base), None, FAST), ATTN)["linear_q_proj"] == \
        "TEColumnParallelLinear"
    assert types_of(audit_files(write("b.yaml", base + "qk_layernorm: true\n"), None, FAST),
                    ATTN)["linear_q_proj"] == "TELayerNormColumnParallelLinear"


@pytest.mark.parametrize("qk_layernorm, up_class", [
    (False, "TEColumnParallelLinear"), (True, "TELayerNormColumnParallelLinear")])
def test_mla_down_proj_fusion_builds_one_fused_down_projection(write, qk_layernorm, up_class):
    text = MLA + "mla_down_proj_fusion: true\n" + ("qk_layernorm: true\n" if qk_layernorm else "")
    report = audit_files(write("a.yaml", text), None, FAST)
    assert types_of(report, ATTN) == {
        "linear_qkv_down_proj": "TELayerNormColumnParallelLinear", "linear_q_up_proj": up_class,
        "linear_kv_up_proj": up_class, "linear_proj": "TERowParallelLinear"}
    rows = {r.name: r for r in report.modules}
    assert rows[ATTN + "linear_qkv_down_proj"].precision == "fp8/blockwise"
    assert rows[ATTN + "linear_qkv_down_proj"].calls_per_microbatch == 1


def test_fused_down_projection_is_what_recipes_match(write):
    recipe = write("r.yaml", """
        configs:
          hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
        matchers:
          down: {type: glob, pattern: "*linear_qkv_down_proj", config: hp, enabled: true}
        """)
    report = audit_files(write("a.yaml", MLA + "mla_down_proj_fusion: true\n"), recipe, FAST)
    rows = {r.name: r for r in report.modules}
    assert rows[ATTN + "linear_qkv_down_proj"].precision == "bf16"
    assert rows[ATTN + "linear_qkv_down_proj"].recipe == "hp"
    assert rows[ATTN + "linear_q_up_proj"].precision == "fp8/blockwise"
    assert not any(f.rule == "QA011" for f in report.findings)  # the matcher matches


@pytest.mark.parametrize("text, message", [
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nmla_down_proj_fusion: true\n",
     r"a.yaml:4: key 'mla_down_proj_fusion': needs multi_latent_attention"),
    (MLA.replace("q_lora_rank: 32", "q_lora_rank: null") + "mla_down_proj_fusion: true\n",
     r"key 'mla_down_proj_fusion': needs q_lora_rank \(Megatron's FusedMLASelfAttention"),
])
def test_mla_down_proj_fusion_needs_what_upstream_asserts(write, text, message):
    with pytest.raises(InputError, match=message):
        load_inputs(write("a.yaml", text))


def test_mla_flags_give_the_same_rows_as_the_yaml(write):
    yaml_text = MLA + "kv_lora_rank: 32\nqk_layernorm: true\nmla_down_proj_fusion: true\n"
    script = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
              "--num-attention-heads 4 --multi-latent-attention --q-lora-rank 32 \\\n"
              "  --kv-lora-rank 32 --qk-layernorm --mla-down-proj-fusion --fp8-format e4m3 "
              "--fp8-recipe blockwise\n")
    rows = [json.dumps(audit_files(write(name, text), None, FAST).to_dict()["modules"],
                       sort_keys=True) for name, text in (("m.yaml", yaml_text), ("t.sh", script))]
    assert rows[0] == rows[1] and "linear_qkv_down_proj" in rows[0]
    config, _ = load_inputs(write("u.sh", script))
    assert config.source.notes == []  # both flags are modelled now, no QA090


def test_mla_down_proj_fusion_flag_without_mla_is_refused_at_the_flag(write):
    script = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 \\\n"
              "  --num-attention-heads 4 --mla-down-proj-fusion\n")
    with pytest.raises(InputError, match=r"t.sh:3: key '--mla-down-proj-fusion': needs "):
        load_inputs(write("t.sh", script))


def test_cli_json_shows_the_fused_projection(write, monkeypatch, capsys):
    path = write("a.yaml", MLA + "mla_down_proj_fusion: true\n")
    code, out, _ = run_in_process(monkeypatch, capsys, "check", path, "--format", "json",
                                  "--steps", "1", cwd=None)
    assert code == 0
    modules = {m["name"]: m["type"] for m in json.loads(out)["modules"]}
    assert modules[ATTN + "linear_qkv_down_proj"] == "TELayerNormColumnParallelLinear"
    assert ATTN + "linear_q_down_proj" not in modules


# --- the flag route: Megatron's argument rules ------------------------------------------------

GPT = "--hidden-size 64 --num-attention-heads 4"


def script(body: str, entry: str = "pretrain_gpt.py") -> str:
    return f"#!/bin/bash\ntorchrun {entry} {GPT} \\\n  {body}\n"


def test_quick_geglu_is_gated_but_keeps_the_4h_width(write):
    # validate_args gives the 2/3 x 4h default to --swiglu only.
    geglu = load_inputs(write("g.sh", script("--num-layers 2 --quick-geglu")))[0]
    swiglu = load_inputs(write("s.sh", script("--num-layers 2 --swiglu")))[0]
    assert geglu.gated_linear_unit and geglu.ffn_hidden_size == 4 * 64
    assert swiglu.gated_linear_unit and swiglu.ffn_hidden_size == int(4 * 64 * 2 / 3 / 64) * 64


def test_quick_geglu_with_swiglu_is_refused(write):
    with pytest.raises(InputError, match=r"key '--quick-geglu': cannot be combined with --swiglu"):
        load_inputs(write("g.sh", script("--num-layers 2 --swiglu --quick-geglu")))


@pytest.mark.parametrize("selective", ["--recompute-activations",
                                       "--recompute-granularity selective"])
def test_selective_recompute_with_a_method_is_refused_as_validate_args_does(write, selective):
    text = script(f"--num-layers 2 {selective} \\\n  --recompute-method uniform")
    with pytest.raises(InputError, match=r"t.sh:4: key '--recompute-method': cannot be used here"
                                         r".*not yet supported for selective"):
        load_inputs(write("t.sh", text))


def test_recompute_activations_alone_is_selective(write):
    config = load_inputs(write("t.sh", script("--num-layers 2 --recompute-activations")))[0]
    assert config.recompute_granularity == "selective" and config.recompute_method is None


def test_encoder_num_layers_in_pretrain_gpt_is_a_gpt_layer_count(write):
    config = load_inputs(write("t.sh", script("--encoder-num-layers 3")))[0]
    assert not config.is_t5 and config.num_layers == 3
    assert config.source.notes == []
    noted = load_inputs(write("u.sh", script("--encoder-num-layers 3 --decoder-num-layers 5")))[0]
    assert [n.message for n in noted.source.notes] == [
        "--decoder-num-layers 5: pretrain_gpt.py builds a GPT model and never reads it; the "
        "model has 3 layers"]
    t5 = load_inputs(write("v.sh", script("--encoder-num-layers 3", "pretrain_t5.py")))[0]
    assert t5.is_t5 and t5.encoder_num_layers == 3


def test_encoder_and_num_layers_in_pretrain_gpt_is_refused(write):
    with pytest.raises(InputError, match=r"key '--encoder-num-layers': cannot be given together"):
        load_inputs(write("t.sh", script("--num-layers 2 --encoder-num-layers 2")))


def test_cli_gpt_script_with_encoder_layers_has_no_t5_modules(write, monkeypatch, capsys):
    path = write("t.sh", script("--encoder-num-layers 2"))
    code, out, _ = run_in_process(monkeypatch, capsys, "check", path, "--format", "json",
                                  "--steps", "1", cwd=None)
    names = [m["name"] for m in json.loads(out)["modules"]]
    assert code == 0 and names[-1] == "output_layer"
    assert not any(n.startswith("encoder.") or "cross_attention" in n for n in names)


# --- explicit pipeline layouts -----------------------------------------------------------------

def chunk_layers(report) -> dict[str, int]:
    """Row prefix (stageS.chunkC) -> decoder layers it holds."""
    layers: dict[str, set[str]] = {}
    for row in report.modules:
        prefix, _, name = row.name.partition("/")
        layers.setdefault(prefix, set())
        if name.startswith("decoder.layers."):
            layers[prefix].add(name.split(".")[2])
    return {prefix: len(found) for prefix, found in layers.items()}


def test_layout_flag_sets_stages_chunks_and_the_per_chunk_split(write):
    # validate_args: 8 chunks over PP 2 -> VPP 4; chunk c * PP + s is chunk c of stage s.
    text = script("--num-layers 16 --mtp-num-layers 1 --pipeline-model-parallel-size 2 \\\n"
                  "  --pipeline-model-parallel-layout 'Et*3|(tt|)*6tmL'")
    config, recipe = load_inputs(write("t.sh", text))
    assert (config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size) == (2, 4)
    report = audit_files(write("u.sh", text), None, FAST)
    assert chunk_layers(report) == {"stage0.chunk0": 3, "stage1.chunk0": 2, "stage0.chunk1": 2,
                                    "stage1.chunk1": 2, "stage0.chunk2": 2, "stage1.chunk2": 2,
                                    "stage0.chunk3": 2, "stage1.chunk3": 1}
    names = {row.name for row in report.modules}
    assert "stage1.chunk3/mtp.layers.0.eh_proj" in names
    assert "stage1.chunk3/output_layer" in names
    assert config.source.notes == []  # no QA090: the layout is modelled


def test_layout_yaml_string_and_list_give_the_same_rows(write):
    base = "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\npipeline_model_parallel_size: 2\n"
    as_string = base + "pipeline_model_parallel_layout: 'Et|ttt||L'\n"
    as_list = base + ("pipeline_model_parallel_layout:\n  - [embedding, decoder]\n"
                      "  - [decoder, decoder, decoder]\n  - []\n  - [loss]\n")
    rows = [json.dumps(audit_files(write(name, text), None, FAST).to_dict()["modules"],
                       sort_keys=True) for name, text in (("a.yaml", as_string), ("b.yaml", as_list))]
    assert rows[0] == rows[1]
    assert '"stage1.chunk0/decoder.layers.2.' in rows[0] and '"stage1.chunk1/output_layer"' in rows[0]


@pytest.mark.parametrize("layout, extra, message", [
    ("Ett|tL", "", r"holds 3 decoder layers \(t\), num_layers is 4"),
    ("tt|ttL", "", r"must begin with the embedding"),
    ("Ett|ttL|", "", r"3 model chunks do not split over pipeline_model_parallel_size=2"),
    ("Ett|tt|m|L", "mtp_num_layers: 1\n", r"places the MTP layers on stage 0, not the last"),
    ("Ett|mttL", "mtp_num_layers: 1\n", r"places a decoder layer after an MTP layer"),
    ("Ett|ttL", "num_layers_in_first_pipeline_stage: 2\n",
     r"key 'num_layers_in_first_pipeline_stage': cannot be set with pipeline_model_parallel_layout"),
    ("Ett|ttL", "virtual_pipeline_model_parallel_size: 2\n",
     r"key 'virtual_pipeline_model_parallel_size': contradicts"),
    ("Ex|ttL", "", r"invalid layer character 'x'"),
    ("E(t)*99999999L", "", r"expands to more than"),
])
def test_layouts_megatron_rejects_are_refused(write, layout, extra, message):
    text = (f"num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\n"
            f"pipeline_model_parallel_size: 2\npipeline_model_parallel_layout: '{layout}'\n{extra}")
    with pytest.raises(InputError, match=message):
        load_inputs(write("a.yaml", text))


@pytest.mark.parametrize("extra, key", [
    ("num_layers: 2\npipeline_model_parallel_layout: 'Et|tL'\n", "pipeline_model_parallel_layout"),
    ("num_layers: 4\nvirtual_pipeline_model_parallel_size: 2\n",
     "virtual_pipeline_model_parallel_size"),
    ("hybrid_layer_pattern: 'M*|M*'\nmamba_num_groups: 1\n", "hybrid_layer_pattern"),
])
def test_virtual_chunks_on_one_stage_are_refused(write, extra, key):
    # parallel_state.initialize_model_parallel raises; the chunks' row names would collide.
    with pytest.raises(InputError, match=rf"key '{key}': makes 2 model chunks on one pipeline "
                                         r"stage: Megatron raises 'pipeline-model-parallel size"):
        load_inputs(write("a.yaml", "hidden_size: 64\nnum_attention_heads: 4\n" + extra))


def test_layout_with_another_virtual_pipeline_flag_is_refused(write):
    text = script("--num-layers 4 --pipeline-model-parallel-size 2 \\\n"
                  "  --num-virtual-stages-per-pipeline-rank 2 --pipeline-model-parallel-layout 'Et|t|t|tL'")
    with pytest.raises(InputError, match=r"t.sh:4: key '--[a-z-]+': no more than one of"):
        load_inputs(write("t.sh", text))


def test_layout_with_uneven_stage_flags_names_the_flag(write):
    text = script("--num-layers 4 --pipeline-model-parallel-size 2 \\\n"
                  "  --decoder-first-pipeline-num-layers 1 --pipeline-model-parallel-layout 'Et|tttL'")
    with pytest.raises(InputError, match=r"key '--decoder-first-pipeline-num-layers': cannot be "
                                         r"set with pipeline_model_parallel_layout"):
        load_inputs(write("t.sh", text))


# --- the modelopt spec --------------------------------------------------------------------------

MOE_MTP = ("--num-layers 2 --num-experts 4 --moe-layer-freq ([0]*1+[1]*1) --moe-grouped-gemm \\\n"
           "  --moe-shared-expert-intermediate-size 32 --disable-bias-linear --mtp-num-layers 1 "
           "--swiglu")


def modelopt_conf(write, body: str, name: str = "Some-Model.sh") -> str:
    """An argument file where ModelOpt's examples keep them (conf/<org>/<model>.sh)."""
    return write(f"examples/post_training/modelopt/conf/org/{name}",
                 f"#!/bin/bash\nMODEL_ARGS=\" \\\n    {GPT} \\\n    {body} \\\n\"\n")


def test_modelopt_argument_file_builds_megatron_linears_and_te_mtp(write):
    report = audit_files(modelopt_conf(write, MOE_MTP), None, FAST)
    types = {row.name: row.type for row in report.modules}
    layer = "decoder.layers.{}."
    assert types[layer.format(0) + "self_attention.linear_qkv"] == "ColumnParallelLinear"
    assert types[layer.format(0) + "self_attention.linear_proj"] == "RowParallelLinear"
    assert types[layer.format(0) + "mlp.linear_fc1"] == "ColumnParallelLinear"
    # MoE: SequentialMLP of Megatron's linears, whatever --moe-grouped-gemm says.
    assert types[layer.format(1) + "mlp.experts.local_experts.3.linear_fc2"] == "RowParallelLinear"
    assert types[layer.format(1) + "mlp.shared_experts.linear_fc1"] == "ColumnParallelLinear"
    assert not any(".experts.linear_fc1" in name for name in types if name.startswith("decoder."))
    # The MTP block comes from the TE decoder specs (model_builder.py).
    assert types["mtp.layers.0.eh_proj"] == "TEColumnParallelLinear"
    assert types["mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1"] == \
        "TEColumnParallelGroupedLinear"
    rows = {row.name: row for row in report.modules}
    assert rows[layer.format(0) + "mlp.linear_fc1"].tracked == "-"  # not a TE module


def test_modelopt_linears_run_in_bf16_under_fp8_and_are_never_bound(write):
    recipe = write("r.yaml", """
        configs:
          mx: {transformer_engine_config_type: TEQuantizationParams,
               training_recipe: {fp8_quantization_recipe: tensorwise}}
        matchers:
          all: {type: glob, pattern: "*", config: mx, enabled: true}
        """)
    path = modelopt_conf(write, "--num-layers 2 --fp8-format e4m3 --fp8-recipe tensorwise")
    report = audit_files(path, recipe, FAST)
    decoder = [r for r in report.modules if r.name.startswith("decoder.")]
    assert decoder and {(r.precision, r.recipe, r.tracked) for r in decoder} == {("bf16", "-", "-")}
    notes = [f.message for f in report.findings if f.rule == "QA090"]
    assert any("the modelopt spec builds Megatron's own linears" in n for n in notes)


def test_modelopt_mla_uses_modelopt_linear_for_down_projections(write):
    mla = ("--num-layers 1 --multi-latent-attention --q-lora-rank 32 --kv-lora-rank 16 "
           "--qk-layernorm")
    report = audit_files(modelopt_conf(write, mla), None, FAST)
    assert types_of(report, ATTN) == {
        "linear_q_down_proj": "Linear", "linear_q_up_proj": "ColumnParallelLinear",
        "linear_kv_down_proj": "Linear", "linear_kv_up_proj": "ColumnParallelLinear",
        "linear_proj": "RowParallelLinear"}
    rows = {r.name: r for r in report.modules}
    assert rows[ATTN + "linear_q_down_proj"].accumulation == "autograd"  # a torch.nn.Linear


@pytest.mark.parametrize("mla, message", [
    ("--multi-latent-attention --q-lora-rank 32", r"rejects without qk_layernorm"),
    ("--multi-latent-attention --qk-layernorm", r"rejects without q_lora_rank"),
])
def test_modelopt_mla_without_what_its_norms_need_is_refused(write, mla, message):
    with pytest.raises(InputError, match=r"key '--multi-latent-attention': the modelopt spec .*"
                                         + message):
        load_inputs(modelopt_conf(write, f"--num-layers 1 {mla}"))


def test_export_default_te_spec_builds_the_te_spec_with_every_layer_moe(write):
    path = modelopt_conf(write, MOE_MTP + " --export-default-te-spec")
    report = audit_files(path, None, FAST)
    types = {row.name: row.type for row in report.modules}
    # One TE layer spec for all layers (grouped experts: not prune.py), layer 0 MoE too.
    assert types["decoder.layers.0.mlp.experts.linear_fc1"] == "TEColumnParallelGroupedLinear"
    assert types["decoder.layers.0.self_attention.linear_qkv"] == "TELayerNormColumnParallelLinear"


def test_distillation_turns_the_modelopt_builder_on_in_pretrain_gpt(write):
    text = script("--num-layers 2 --export-kd-teacher-load /ckpt/teacher --export-te-mcore-model")
    config = load_inputs(write("t.sh", text))[0]
    assert config.layer_spec == "modelopt"
    assert [n.message for n in config.source.notes] == [
        "--export-kd-teacher-load: the distillation teacher is a second model; only the student "
        "is audited"]
    plain = load_inputs(write("u.sh", script("--num-layers 2")))[0]
    assert plain.layer_spec == "te" and plain.source.notes == []


def test_modelopt_entry_script_path_turns_the_builder_on(write):
    text = ("#!/bin/bash\ntorchrun examples/post_training/modelopt/quantize.py --num-layers 2 "
            f"{GPT}\n")
    assert load_inputs(write("t.sh", text))[0].layer_spec == "modelopt"


def test_modelopt_hybrid_builds_megatron_linears_everywhere(write):
    body = ("--hybrid-layer-pattern M*E/E --mamba-num-heads 16 --mamba-head-dim 16 "
            "--mamba-num-groups 2 --mamba-state-dim 16 --num-experts 4 --export-model-type HybridModel")
    report = audit_files(modelopt_conf(write, body), None, FAST)
    types = {row.name: row.type for row in report.modules}
    assert types["decoder.layers.0.mixer.in_proj"] == "ColumnParallelLinear"
    assert types["decoder.layers.2.mlp.experts.local_experts.0.linear_fc1"] == "ColumnParallelLinear"
    assert types["mtp.layers.0.eh_proj"] == "ColumnParallelLinear"  # the local stack's MTP spec
    assert {t for t in types.values()} <= {"ColumnParallelLinear", "RowParallelLinear"}


def test_modelopt_hybrid_pattern_with_the_gpt_model_type_is_refused(write):
    body = ("--hybrid-layer-pattern M* --mamba-num-heads 16 --mamba-head-dim 16 "
            "--mamba-num-groups 2 --mamba-state-dim 16")
    with pytest.raises(InputError, match=r"key '--export-model-type': ModelOpt's builder builds a "
                                         r"GPTModel"):
        load_inputs(modelopt_conf(write, body))


def test_modelopt_spec_in_yaml(write):
    report = audit_files(write("a.yaml", "num_layers: 1\nhidden_size: 64\nnum_attention_heads: 4\n"
                                         "layer_spec: modelopt\n"), None, FAST)
    assert {r.type for r in report.modules} == {"ColumnParallelLinear", "RowParallelLinear"}


def test_cli_table_shows_mcore_types_for_the_modelopt_spec(write, monkeypatch, capsys):
    path = modelopt_conf(write, "--num-layers 1")
    code, out, _ = run_in_process(monkeypatch, capsys, "check", path, "--steps", "1", cwd=None)
    assert code == 0
    assert "mcore.Col" in out and "mcore.Row" in out and "te." not in out


@pytest.mark.parametrize("body, key, message", [
    ("--num-layers 4 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2",
     "--num-virtual-stages-per-pipeline-rank", "does not currently support virtual pipeline"),
    ("--num-layers 2 --spec my.module my_spec", "--spec", "does not support custom args.spec"),
])
def test_what_modelopt_builder_raises_is_refused(write, body, key, message):
    with pytest.raises(InputError, match=rf"key '{key}': ModelOpt's builder raises '.*{message}"):
        load_inputs(modelopt_conf(write, body))


# --- which entry point the file names ----------------------------------------------------------

@pytest.mark.parametrize("script, file, name, gpt, modelopt", [
    ("pretrain_gpt.py", "/x/train.sh", "pretrain_gpt.py", True, False),
    ("/opt/Megatron-LM/pretrain_t5.py", "/x/train.sh", "pretrain_t5.py", False, False),
    ("/m/examples/post_training/modelopt/finetune.py", "/x/t.sh", "finetune.py", False, True),
    ("\x00/quantize.py", "/x/t.sh", "quantize.py", False, False),  # ${SCRIPT_DIR}: unknown
    (None, "/m/examples/post_training/modelopt/conf/org/M.sh", None, False, True),
    (None, "/corpus/post_training__modelopt__conf__org__M.sh", None, False, True),
    (None, "/x/model_config.yaml", None, False, False),
])
def test_entry_point_of_a_file(script, file, name, gpt, modelopt):
    from qaudit.load.sources.entry import Entry
    entry = Entry(script, 1 if script else None, file)
    assert (entry.name, entry.builds_gpt, entry.modelopt_location() is not None) == \
        (name, gpt, modelopt)


def test_export_default_te_spec_with_mtp_experts_grouped_otherwise_is_refused(write):
    path = modelopt_conf(write, MOE_MTP.replace("--moe-grouped-gemm", "")
                         + " --export-default-te-spec")
    with pytest.raises(InputError, match=r"key '--export-default-te-spec': .* its MTP layers' "
                                         r"follow the flag; not modelled"):
        load_inputs(path)


PLAIN = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"


# (qk_layernorm came in 0.6.0; the only older release, 0.5.0, refuses every config today:
# the derived moe_ffn_hidden_size counts as set there.)
@pytest.mark.parametrize("text, key, since, megatron", [
    (PLAIN + "multi_latent_attention: true\nq_lora_rank: 32\nmla_down_proj_fusion: true\n",
     "mla_down_proj_fusion", "0.17.0", "0.16.1"),
    (PLAIN + "pipeline_model_parallel_size: 2\npipeline_model_parallel_layout: 'Et|tL'\n",
     "pipeline_model_parallel_layout", "0.13.0", "0.12.3"),
])
def test_new_fields_exit_2_on_a_megatron_that_lacks_them(write, monkeypatch, capsys, text, key,
                                                         since, megatron):
    # qaudit/plan/upstream/releases.py FIELD_SINCE, read from the release wheels.
    path = write("a.yaml", text)
    code, _, err = run_in_process(monkeypatch, capsys, "check", path, "--megatron", megatron,
                                  "--steps", "1", cwd=None)
    assert code == 2 and f"key '{key}'" in err and f"megatron-core {since}" in err
    code, _, _ = run_in_process(monkeypatch, capsys, "check", path, "--megatron", since,
                                "--steps", "1", cwd=None)
    assert code in (0, 1)
