"""Megatron-Bridge ConfigContainer YAML (qaudit/load/bridge/, docs/bridge.md): read as data,
mixed_precision applied as Bridge applies it, serialized recipes, overrides, the fusion probe,
and the Python API. Small synthetic dumps; the real ones are tests/test_bridge_corpus.py."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cli_helpers import run_in_process
from qaudit.cli import split_targets
from qaudit.errors import InputError
from qaudit.load import load_files
from qaudit.load.bridge import load_bridge
from qaudit.load.bridge.mixed_precision import NAMED_RECIPES
from qaudit.load.bridge.overrides import Override

EXAMPLE = "configs/bridge-lightning-mtp-bf16.yaml"

# Bridge 0.6.2's MIXED_PRECISION_RECIPES (training/mixed_precision.py), underscore spelling:
# v0.6.0's 14 and nemotron_3_ultra_bf16_with_nvfp4_mixed.
RELEASE_RECIPES = {
    "bf16_mixed", "fp16_mixed", "bf16_with_fp8_delayed_scaling_mixed",
    "fp16_with_fp8_delayed_scaling_mixed", "bf16_with_mxfp8_mixed", "fp16_with_mxfp8_mixed",
    "bf16_with_fp8_current_scaling_mixed", "nemotron_h_bf16_with_fp8_current_scaling_mixed",
    "nanov2_bf16_with_fp8_current_scaling_mixed", "fp16_with_fp8_current_scaling_mixed",
    "bf16_with_fp8_subchannel_scaling_mixed", "fp16_with_fp8_subchannel_scaling_mixed",
    "bf16_with_nvfp4_mixed", "nemotron_3_super_bf16_with_nvfp4_mixed",
    "nemotron_3_ultra_bf16_with_nvfp4_mixed",
}
# recipe -> (precision label of a quantized layer, BF16 layers at start, at end)
QUANTIZED = {
    "bf16_with_fp8_delayed_scaling_mixed": ("fp8/delayed", 0, 0),
    "fp16_with_fp8_delayed_scaling_mixed": ("fp8/delayed", 0, 0),
    "bf16_with_mxfp8_mixed": ("fp8/mxfp8", 0, 0),
    "fp16_with_mxfp8_mixed": ("fp8/mxfp8", 0, 0),
    "bf16_with_fp8_current_scaling_mixed": ("fp8/tensorwise", 1, 1),
    "fp16_with_fp8_current_scaling_mixed": ("fp8/tensorwise", 1, 1),
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": ("fp8/tensorwise", 2, 2),
    "nanov2_bf16_with_fp8_current_scaling_mixed": ("fp8/blockwise", 2, 2),
    "bf16_with_fp8_subchannel_scaling_mixed": ("fp8/blockwise", 0, 0),
    "fp16_with_fp8_subchannel_scaling_mixed": ("fp8/blockwise", 0, 0),
    "bf16_with_nvfp4_mixed": ("fp4/nvfp4", 0, 0),
    "nemotron_3_super_bf16_with_nvfp4_mixed": ("fp4/nvfp4", 0, 14),
    "nemotron_3_ultra_bf16_with_nvfp4_mixed": ("fp4/nvfp4", 0, 16),
}
LAYERS = 16


def gpt_model(**fields) -> dict:
    return {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider",
            "num_layers": LAYERS, "hidden_size": 64, "num_attention_heads": 4,
            "ffn_hidden_size": 128, "fp8": None, "fp8_recipe": "delayed",
            "gradient_accumulation_fusion": True, "add_bias_linear": False,
            "params_dtype": {"_call_": False, "_target_": "torch.bfloat16"},
            "activation_func": {"_call_": False, "_target_": "torch.nn.functional.gelu"},
            **fields}


def write_dump(tmp_path: Path, name: str = "dump.yaml", model: dict | None = None,
               **sections) -> str:
    document = {"_target_": "megatron.bridge.training.config.ConfigContainer",
                "model": model if model is not None else gpt_model(),
                "train": {"_target_": "megatron.bridge.training.config.TrainingConfig",
                          "train_iters": 10},
                "mixed_precision": None, **sections}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def audit_json(monkeypatch, capsys, *args: str) -> tuple[int, dict]:
    code, out, err = run_in_process(monkeypatch, capsys, "check", *args, "--format", "json",
                                    cwd=None)
    assert code in (0, 1), err
    return code, json.loads(out)


def precisions(report: dict) -> dict[str, str]:
    return {row["name"]: row["precision"] for row in report["modules"]}


# --- mixed_precision ----------------------------------------------------------------------

def test_the_recipe_table_is_the_releases():
    assert set(NAMED_RECIPES) == RELEASE_RECIPES
    assert {name for name, fields in NAMED_RECIPES.items()
            if fields.get("fp8") or fields.get("fp4")} == set(QUANTIZED)


@pytest.mark.parametrize("name", sorted(QUANTIZED))
def test_a_quantized_named_recipe_never_audits_as_bf16(name, tmp_path, monkeypatch, capsys):
    label, start, end = QUANTIZED[name]
    # A pre-update dump: the model still says fp8 null, as run_recipe.py --dry-run writes it.
    path = write_dump(tmp_path, mixed_precision=name.replace("_", "-") if "fp16" in name else name)
    _, report = audit_json(monkeypatch, capsys, path)
    qkv = [precisions(report)[f"decoder.layers.{i}.self_attention.linear_qkv"]
           for i in range(LAYERS)]
    assert qkv == ["bf16"] * start + [label] * (LAYERS - start - end) + ["bf16"] * end
    assert "Bridge ConfigContainer, GPTModelProvider" in report["source"][0]


def test_a_mixed_precision_section_wins_over_the_model_fields(tmp_path, monkeypatch, capsys):
    """The issue's case: {fp8: e4m3, fp8_recipe: mxfp8} next to model.fp8 null."""
    section = {"_target_": "megatron.bridge.training.mixed_precision.MixedPrecisionConfig",
               "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True}
    pre = write_dump(tmp_path, "pre.yaml", mixed_precision=section)
    post = write_dump(tmp_path, "post.yaml", model=gpt_model(fp8="e4m3", fp8_recipe="mxfp8",
                                                             fp8_param=True),
                      mixed_precision=section)
    _, before = audit_json(monkeypatch, capsys, pre)
    _, after = audit_json(monkeypatch, capsys, post)
    assert set(precisions(before).values()) - {"bf16"} == {"fp8/mxfp8"}
    assert before["modules"] == after["modules"]
    config, _ = load_files(pre)
    assert config.fp8_param and config.where("fp8")[1] is not None


def test_a_null_in_the_section_clears_the_models_value(tmp_path):
    """setup() copies every field, None included: Bridge would run this BF16."""
    path = write_dump(tmp_path, model=gpt_model(fp8="e4m3", fp8_recipe="tensorwise"),
                      mixed_precision={"fp8": None, "bf16": True})
    config, _ = load_files(path)
    assert config.fp8 is None


def test_an_unknown_recipe_name_is_refused_at_its_line(tmp_path):
    path = write_dump(tmp_path, mixed_precision="bf16_with_fp9_mixed")
    with pytest.raises(InputError) as caught:
        load_files(path)
    assert caught.value.key == "mixed_precision" and caught.value.line is not None
    assert "bf16_with_mxfp8_mixed" in caught.value.message


# --- nodes, providers --------------------------------------------------------------------

def test_targets_are_never_imported(tmp_path):
    model = gpt_model(activation_func={"_call_": False, "_target_": "qaudit_no_such.module.f"},
                      init_method={"_call_": True, "_target_": "os.system", "_args_": ["true"]})
    path = write_dump(tmp_path, model=model)
    before = set(sys.modules)
    config, _ = load_files(path)
    assert config.num_layers == LAYERS
    assert not {m for m in set(sys.modules) - before if m.startswith(("qaudit_no_such",
                                                                       "megatron"))}


@pytest.mark.parametrize("target, why", [
    ("megatron.bridge.diffusion.models.wan.wan_provider.WanModelProvider", "diffusion"),
    ("megatron.bridge.models.qwen_vl.qwen3_vl_provider.Qwen3VLModelProvider", "vision-language"),
])
def test_providers_qaudit_does_not_build_are_refused(tmp_path, target, why):
    path = write_dump(tmp_path, model=gpt_model(_target_=target))
    with pytest.raises(InputError) as caught:
        load_files(path)
    assert caught.value.key == "model._target_" and why in caught.value.message
    assert caught.value.line is not None


def test_the_hybrid_provider_composes_the_mtp_pattern_as_finalize_does():
    config, _ = load_files(EXAMPLE)
    assert config.family == "hybrid"
    assert config.hybrid_layer_pattern == "MEM*EMEME/*E/*E"
    assert config.mtp_num_layers == 2 and config.mtp_use_repeated_layer
    assert config.source.origin == "bridge" and config.source.assumed_megatron == "bridge-v0.6.0"
    assert config.source.provider == "HybridModelProvider"


@pytest.mark.parametrize("section, key, value", [
    ("model", "mtp_num_layers", {"tp_comm_overlap": False}),  # found by the fuzz campaign
    ("model", "mtp_num_layers", "2"),
    ("model", "mtp_num_layers", True),
    ("model", "tensor_model_parallel_size", [2]),
    ("comm_overlap", "delay_wgrad_compute", "yes"),
])
def test_a_value_the_reader_computes_with_is_type_checked_at_its_line(tmp_path, section, key,
                                                                      value):
    """The reader composes the MTP pattern and the TP overlap before the field checks run: a
    wrong type there is exit 2 naming the key, never a TypeError (exit 3)."""
    document = yaml.safe_load(Path(EXAMPLE).read_text())
    document.setdefault("comm_overlap", {"_target_": "megatron.bridge.training.comm_overlap."
                                         "CommOverlapConfig", "tp_comm_overlap": True})
    document[section][key] = value
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(InputError) as caught:
        load_files(str(path))
    assert caught.value.key == f"{section}.{key}" and caught.value.line is not None


def test_mtp_depths_past_the_build_limit_compose_no_pattern(tmp_path):
    """The fuzz campaign's 2**31 depths had the reader write one pattern copy per depth (out of
    memory). Counted: the memory the load allocates stays far below what 999,999 copies of the
    MTP pattern would take (3 MB)."""
    import tracemalloc

    document = yaml.safe_load(Path(EXAMPLE).read_text())
    document["model"]["mtp_num_layers"] = 999_999
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as caught:
            load_files(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.key == "model.mtp_num_layers" and caught.value.line is not None
    assert peak < 1_500_000


# --- the bundled example: verdicts, fusion probe, Bridge-only fields -----------------------

def test_lightning_shaped_example_fails_on_its_mtp_modules(monkeypatch, capsys):
    code, report = audit_json(monkeypatch, capsys, str(Path(EXAMPLE).resolve()))
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert code == 1 and errors and all(f["rule"] == "QA001" for f in errors)
    assert all(f["module"].startswith("mtp.") for f in errors)
    assert any("true: 7 error(s), false: 0 error(s); reported: true (the worse)" in line
               for line in report["source"])
    # Named (users believe it acts), as info: no code reads it, so it changes nothing.
    named = [f for f in report["findings"] if f["rule"] == "QA091"]
    assert any("keep_mtp_spec_in_bf16" in f["message"] and "no code reads" in f["message"]
               for f in named)
    assert not [f for f in report["findings"] if f["rule"] == "QA090"]


def test_lightning_shaped_example_passes_with_megatron_main(monkeypatch, capsys):
    code, report = audit_json(monkeypatch, capsys, str(Path(EXAMPLE).resolve()),
                              "--megatron", "main")
    assert code == 0


def test_fusion_set_by_an_override_is_taken_as_written(monkeypatch, capsys):
    code, report = audit_json(monkeypatch, capsys, str(Path(EXAMPLE).resolve()),
                              "model.gradient_accumulation_fusion=false")
    assert code == 0 and not any("reported:" in line for line in report["source"])
    config, _ = load_files(EXAMPLE, overrides=["model.gradient_accumulation_fusion=true"])
    assert config.gradient_accumulation_fusion and not config.source.alternatives


def test_fusion_true_in_the_file_is_audited_once(tmp_path):
    config, _ = load_files(write_dump(tmp_path))
    assert config.gradient_accumulation_fusion and not config.source.alternatives


# --- serialized quant_recipe ---------------------------------------------------------------

def recipe_node(*matchers) -> dict:
    return {"_target_": "megatron.core.quantization.quant_config.RecipeConfig",
            "config_dict": {
                "bf16": {"training_recipe": {},
                         "transformer_engine_config_type": "TEQuantizationParams"},
                "mxfp8": {"training_recipe": {"fp8_quantization_recipe": "mxfp8"},
                          "transformer_engine_config_type": "TEQuantizationParams"}},
            "matchers": [{"_target_": "megatron.core.quantization.quant_config.GlobMatcher",
                          "config_key": key, "pattern": pattern} for pattern, key in matchers]}


def test_a_serialized_recipe_is_matched_in_order_and_linted_at_its_lines(tmp_path, monkeypatch,
                                                                         capsys):
    path = write_dump(tmp_path, model=gpt_model(quant_recipe=recipe_node(
        ("*.linear_qkv", "bf16"), ("*fc[12]_latent_proj", "bf16"), ("*", "mxfp8"))),
        mixed_precision="bf16_with_mxfp8_mixed")
    _, report = audit_json(monkeypatch, capsys, path)
    rows = precisions(report)
    assert rows["decoder.layers.0.self_attention.linear_qkv"] == "bf16"
    assert rows["decoder.layers.0.mlp.linear_fc1"] == "fp8/mxfp8"
    unmatched = [f for f in report["findings"] if f["rule"] == "QA011"]
    text = Path(path).read_text().splitlines()
    assert len(unmatched) == 1 and unmatched[0]["file"] == path
    assert "GlobMatcher" in text[unmatched[0]["line"] - 1]
    assert "_latent_proj" in text[unmatched[0]["line"]] or \
        "_latent_proj" in text[unmatched[0]["line"] + 1]


def test_a_matcher_class_megatron_lacks_is_refused(tmp_path):
    node = recipe_node(("*", "bf16"))
    node["matchers"][0]["_target_"] = "megatron.core.quantization.quant_config.RegexMatcher"
    with pytest.raises(InputError) as caught:
        load_files(write_dump(tmp_path, model=gpt_model(quant_recipe=node)))
    assert caught.value.key == "model.quant_recipe.matchers[0]._target_"


# --- overrides -----------------------------------------------------------------------------

def test_an_override_file_is_merged_and_traced(tmp_path, write_yaml):
    override = write_yaml("over.yaml", """\
        model:
          num_layers: 4
        mixed_precision: bf16_with_mxfp8_mixed
        train:
          train_iters: 5
        """)
    config, _ = load_files(write_dump(tmp_path), overrides=[Override(path=override)])
    assert config.num_layers == 4 and config.where("num_layers") == (override, 2)
    assert config.fp8_recipe == "mxfp8" and config.where("fp8") == (override, 3)


def test_a_perf_script_wrapper_is_unwrapped(tmp_path, write_yaml):
    override = write_yaml("perf.yaml", """\
        ConfigContainer:
          model:
            num_layers: 2
        perf_matrix:
          h100: {}
        """)
    config, _ = load_files(write_dump(tmp_path), overrides=[Override(path=override)])
    assert config.num_layers == 2


@pytest.mark.parametrize("argument, field, value", [
    ("model.num_layers=3", "num_layers", 3),
    ("++model.num_layers=5", "num_layers", 5),
    ("model.gradient_accumulation_fusion=FALSE", "gradient_accumulation_fusion", False),
    ("mixed_precision='bf16_with_fp8_current_scaling_mixed'", "fp8_recipe", "tensorwise"),
    ("~model.num_layers", "num_layers", LAYERS),  # Bridge leaves the recipe's value
])
def test_hydra_arguments(tmp_path, argument, field, value):
    config, _ = load_files(write_dump(tmp_path), overrides=[argument])
    assert getattr(config, field) == value


@pytest.mark.parametrize("argument, says", [
    ("model.no_such_field=1", "not in the config"),
    ("+model.num_layers=2", "already in the config"),
    ("model.num_layers=${oc.env:LAYERS}", "interpolations"),
    ("model.num_layers=1,2", "sweep"),
    ("model.num_layers=choice(1,2)", "functions"),
    ("model..x=1", "expected key=value"),
])
def test_bad_hydra_arguments_are_exit_2(tmp_path, argument, says):
    with pytest.raises(InputError) as caught:
        load_files(write_dump(tmp_path), overrides=[Override(text=argument, index=2)])
    assert says in caught.value.message and caught.value.file.startswith("argument 2")


def test_a_field_an_override_breaks_is_reported_at_the_override(tmp_path, write_yaml):
    override = write_yaml("over.yaml", "model:\n  hidden_size: 0\n")
    with pytest.raises(InputError) as caught:
        load_files(write_dump(tmp_path), overrides=[Override(path=override)])
    assert (caught.value.file, caught.value.line, caught.value.key) == \
        (override, 2, "model.hidden_size")


def test_split_targets():
    assert split_targets(["c.yaml", "a.b=1", "+x.y=2", "~z", "d.yaml"]) == \
        (["c.yaml", "d.yaml"], ["a.b=1", "+x.y=2", "~z"])


def test_an_existing_path_with_equals_is_a_path(tmp_path):
    odd = tmp_path / "a=b.yaml"
    odd.write_text("x: 1\n")
    assert split_targets([str(odd)]) == ([str(odd)], [])


def test_cli_overrides_and_refusals(tmp_path, monkeypatch, capsys, write_yaml):
    dump = write_dump(tmp_path)
    # Several configs are audited one by one (issue 23); overrides take exactly one.
    code, _, err = run_in_process(monkeypatch, capsys, "check", dump, dump, "model.num_layers=2",
                                  cwd=None)
    assert code == 2 and "overrides apply to one Megatron-Bridge config" in err
    code, _, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                  "model.num_layers=2")
    assert code == 2 and "ConfigContainer" in err
    partial = write_yaml("partial.yaml", "model:\n  num_layers: 2\ntrain:\n  train_iters: 3\n")
    code, _, err = run_in_process(monkeypatch, capsys, "check", partial, cwd=None)
    assert code == 2 and "override file" in err and "--override" in err
    assert err.count("\n") == 1 and ":1: key 'model'" in err
    code, out, err = run_in_process(monkeypatch, capsys, "check", dump, "model.num_layers=2",
                                    "--override", partial, "--format", "json", cwd=None)
    assert code == 0, err
    assert len({r["name"].split(".")[2] for r in json.loads(out)["modules"]
                if r["name"].startswith("decoder.")}) == 2


# --- the Python API --------------------------------------------------------------------------

@dataclass
class HybridModelProvider:  # a stand-in with the fields of the bundled example
    hybrid_layer_pattern: str = "MEM*EMEME"
    num_layers: int = 9
    hidden_size: int = 256
    ffn_hidden_size: int = 512
    num_attention_heads: int = 4
    num_query_groups: int = 2
    kv_channels: int = 64
    mamba_head_dim: int = 32
    mamba_num_groups: int = 8
    mamba_num_heads: int = 16
    num_moe_experts: int = 8
    moe_ffn_hidden_size: int = 128
    moe_grouped_gemm: bool = True
    moe_router_topk: int = 2
    moe_shared_expert_intermediate_size: int = 256
    mtp_hybrid_override_pattern: str = "*E"
    mtp_num_layers: int = 2
    mtp_use_repeated_layer: bool = True
    keep_mtp_spec_in_bf16: bool = True
    gradient_accumulation_fusion: bool = False
    share_embeddings_and_output_weights: bool = False
    is_hybrid_model: bool = True
    fp8: str | None = None


HybridModelProvider.__module__ = "megatron.bridge.models.hybrid.hybrid_provider"


@dataclass
class ConfigContainer:
    model: HybridModelProvider = field(default_factory=HybridModelProvider)
    mixed_precision: str = "bf16_mixed"


ConfigContainer.__module__ = "megatron.bridge.training.config"


def serialized(obj) -> dict:
    """The stand-in as Bridge's to_yaml() writes a dataclass: fields plus _target_."""
    from dataclasses import fields, is_dataclass

    if is_dataclass(obj):
        return {"_target_": f"{type(obj).__module__}.{type(obj).__qualname__}",
                **{f.name: serialized(getattr(obj, f.name)) for f in fields(obj)}}
    return obj


def comparable(report: dict) -> tuple:
    findings = [(f["rule"], f["severity"], f["module"], f["message"]) for f in report["findings"]]
    return report["modules"], findings


def test_audit_of_a_live_object_is_the_cli_on_its_dump(tmp_path, monkeypatch, capsys):
    from qaudit import AuditFailed, audit

    cfg = ConfigContainer()
    path = tmp_path / "ConfigContainer.yaml"
    path.write_text(yaml.safe_dump(serialized(cfg), sort_keys=False))
    code, from_cli = audit_json(monkeypatch, capsys, str(path))
    report = audit(cfg)
    assert report.exit_code == code == 1
    assert comparable(report.to_dict()) == comparable(from_cli)
    assert report.rows and {f.rule for f in report.findings} >= {"QA001"}
    with pytest.raises(AuditFailed) as caught:
        report.raise_for_findings()
    assert isinstance(caught.value, AssertionError) and "QA001" in str(caught.value)
    assert audit(cfg, megatron="main").raise_for_findings().exit_code == 0


def test_audit_of_a_provider_or_a_mapping(tmp_path):
    from qaudit import audit

    provider = audit(HybridModelProvider(gradient_accumulation_fusion=True, mtp_num_layers=1))
    assert provider.exit_code == 0 and provider.report.source[0].startswith("Python config")
    mapping = audit({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                     "fp8": "e4m3", "fp8_recipe": "tensorwise"})
    assert {r.precision for r in mapping.rows} >= {"fp8/tensorwise"}
    assert audit(EXAMPLE).exit_code == 1


def test_the_python_example_in_the_docs_runs(capsys):
    import re

    from qaudit import AuditFailed

    text = (Path(__file__).resolve().parent.parent / "docs" / "bridge.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    with pytest.raises(AuditFailed):
        exec(compile(code, "docs/bridge.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.startswith("1 ['QA001'")


def test_megatron_lms_pretrain_config_container_nests_the_transformer(tmp_path):
    """PretrainConfigContainer: model is a GPTModelConfig with `transformer:` inside."""
    transformer = {k: v for k, v in gpt_model().items() if k != "_target_"}
    document = {"_target_": "megatron.training.config.container.PretrainConfigContainer",
                "model": {"_target_": "megatron.training.models.gpt.GPTModelConfig",
                          "transformer": {"_target_": "megatron.core.transformer."
                                          "transformer_config.TransformerConfig",
                                          **transformer},
                          "vocab_size": 1024},
                "mixed_precision": "bf16_with_mxfp8_mixed"}
    path = tmp_path / "container.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config, _ = load_files(str(path))
    assert config.num_layers == LAYERS and config.fp8_recipe == "mxfp8"
    assert config.vocab_size == 1024 and config.family == "gpt"
    assert config.source.header_notes[0].startswith("Bridge PretrainConfigContainer")


def test_named_settings_are_warned_where_bridge_keeps_them(tmp_path):
    path = write_dump(tmp_path, ddp={"overlap_grad_reduce": True, "use_distributed_optimizer": True},
                      comm_overlap={"overlap_grad_reduce": False, "delay_wgrad_compute": None},
                      dist={"use_torch_fsdp2": True}, peft={"_target_": "x.LoRA"})
    config, _ = load_files(path)
    keys = {note.key for note in config.source.notes}
    # comm_overlap's non-null value wins over the DDP one (with the distributed optimizer)
    assert keys == {"dist.use_torch_fsdp2", "peft"}
    assert config.delay_wgrad_compute is False
    fsdp = write_dump(tmp_path, "fsdp.yaml", dist={"use_megatron_fsdp": True},
                      ddp={"data_parallel_sharding_strategy": "optim_grads_params"})
    config, _ = load_files(fsdp)
    assert config.use_megatron_fsdp
    assert config.data_parallel_sharding_strategy == "optim_grads_params"


def test_overlap_switches_are_read_with_no_effect_as_on_the_other_routes(tmp_path):
    """ddp.overlap_grad_reduce / overlap_param_gather and the optimizer's gather-with-step
    change nothing the audit reports (docs/no-effect-settings.md): one QA091 note each, never
    a QA090 warning, as for --overlap-grad-reduce in a launch script."""
    path = write_dump(tmp_path, ddp={"overlap_grad_reduce": True, "overlap_param_gather": True},
                      optimizer={"overlap_param_gather_with_optimizer_step": True})
    config, _ = load_files(path)
    notes = {note.key: note.no_effect for note in config.source.notes}
    assert notes == {"ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": True,
                     "optimizer.overlap_param_gather_with_optimizer_step": True}


def test_the_python_api_defaults_to_the_reference_runtime(monkeypatch):
    """audit() must not boot TE's CPU stand-in (which poses torch as a CUDA build for the rest
    of the caller's process) unless asked: its runtime defaults to the reference."""
    import qaudit.api as api

    seen = {}

    def spy(config, recipe, options, **kwargs):
        seen["runtime"] = options.runtime
        raise RuntimeError("stop here")

    monkeypatch.setattr("qaudit.commands.check.audit_inputs", spy)
    with pytest.raises(RuntimeError, match="stop here"):
        api.audit({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    assert seen["runtime"] == "reference"
    with pytest.raises(RuntimeError, match="stop here"):
        api.audit({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}, runtime="auto")
    assert seen["runtime"] == "auto"


# --- Bridge 0.6.2's refusals and acceptances (issue 37) -----------------------------------

def test_delay_wgrad_without_the_moe_overlap_is_refused_as_bridge_asserts(tmp_path):
    path = write_dump(tmp_path, comm_overlap={"delay_wgrad_compute": True})
    with pytest.raises(InputError) as error:
        load_files(path)
    assert error.value.key == "comm_overlap.delay_wgrad_compute" and error.value.line
    assert "overlap_moe_expert_parallel_comm is required for delay_wgrad_compute" \
        in error.value.message
    # With the overlap (in the section, or already on the model) Bridge goes on.
    for sections_ in ({"comm_overlap": {"delay_wgrad_compute": True,
                                        "overlap_moe_expert_parallel_comm": True}},
                      {"model": gpt_model(overlap_moe_expert_parallel_comm=True),
                       "comm_overlap": {"delay_wgrad_compute": True}}):
        config, _ = load_files(write_dump(tmp_path, "ok.yaml", **sections_))
        assert config.delay_wgrad_compute is True


def test_adding_a_field_the_provider_lacks_is_a_warning_as_in_bridge(tmp_path):
    """`+model.new_field=1`: Bridge's _apply_overrides warns and skips it."""
    path = write_dump(tmp_path)
    config, _ = load_bridge(Path(path), path, ["+model.new_field=1"])
    notes = [n for n in config.source.notes if n.key == "model.new_field"]
    assert len(notes) == 1 and "Bridge skips it with a warning" in notes[0].message
    assert notes[0].file == "argument 1 (+model.new_field=1)"
    with pytest.raises(InputError, match="not in the config"):  # without '+': Hydra refuses
        load_bridge(Path(path), path, ["model.new_field=1"])


def test_fp8_param_alone_is_undone_by_the_gather_flag_written_last(tmp_path):
    """MixedPrecisionConfig keeps the pair equal and _apply_overrides writes fp8_param_gather
    after fp8_param: `mixed_precision.fp8_param=true` over a dump ends false in Bridge."""
    section = {"_target_": "megatron.bridge.training.mixed_precision.MixedPrecisionConfig",
               "bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param": False,
               "fp8_param_gather": False}
    path = write_dump(tmp_path, mixed_precision=section)
    config, _ = load_bridge(Path(path), path, ["mixed_precision.fp8_param=true"])
    assert config.fp8_param is False
    assert any(n.key == "mixed_precision.fp8_param" for n in config.source.notes)
    config, _ = load_bridge(Path(path), path, ["mixed_precision.fp8_param_gather=true"])
    assert config.fp8_param is True


@pytest.mark.parametrize("current", ["bf16_mixed", None])
def test_a_mapping_over_a_recipe_name_is_refused_where_bridge_fails(tmp_path, write_yaml,
                                                                     monkeypatch, capsys, current):
    """OmegaConf.merge puts the mapping in place of the name, _apply_overrides stores the dict,
    and runtime_config_update's finalize() raises AttributeError: exit 2 at the override's line
    (it used to be audited as an FP32 MixedPrecisionConfig)."""
    path = write_dump(tmp_path, mixed_precision=current)
    override = write_yaml("over.yaml", """\
        train:
          train_iters: 5
        mixed_precision:
          grad_reduce_in_fp32: false
        """)
    with pytest.raises(InputError) as error:
        load_files(path, overrides=[Override(path=override)])
    assert (error.value.file, error.value.line, error.value.key) == (override, 3,
                                                                     "mixed_precision")
    assert "Bridge would fail" in error.value.message
    assert "'dict' object has no attribute 'finalize'" in error.value.message
    code, out, err = run_in_process(monkeypatch, capsys, "check", path, "--override", override,
                                    cwd=None)
    assert code == 2 and "Traceback" not in err and f"{override}:3" in err
    # `=` with a mapping value replaces the name as the merge does.
    argument = "mixed_precision={grad_reduce_in_fp32: false}"
    with pytest.raises(InputError, match="Bridge would fail") as error:
        load_bridge(Path(path), path, [argument])
    assert (error.value.file, error.value.key) == (f"argument 1 ({argument})", "mixed_precision")
    # Hydra's `+`/`++` build the mapping too: refused, at the argument.
    for argument in ("+mixed_precision.grad_reduce_in_fp32=false",
                     "++mixed_precision.grad_reduce_in_fp32=false"):
        with pytest.raises(InputError) as error:
            load_bridge(Path(path), path, [argument])
        assert error.value.file == f"argument 1 ({argument})"


def test_a_whole_mixed_precision_section_over_a_recipe_name_is_read(tmp_path, write_yaml):
    """A mapping with `_target_` is instantiated by Bridge: it replaces the name."""
    path = write_dump(tmp_path, mixed_precision="bf16_with_mxfp8_mixed")
    override = write_yaml("over.yaml", """\
        mixed_precision:
          _target_: megatron.bridge.training.mixed_precision.MixedPrecisionConfig
          bf16: true
          grad_reduce_in_fp32: false
        """)
    config, _ = load_files(path, overrides=[Override(path=override)])
    assert config.source.mapping["bf16"] is True and config.fp8 is None


def test_tensor_parallel_one_turns_sequence_parallelism_off_as_finalize_does(tmp_path):
    """Bridge's TransformerConfig.finalize(): sequence_parallel off when TP <= 1."""
    path = write_dump(tmp_path, model=gpt_model(tensor_model_parallel_size=2,
                                                sequence_parallel=True))
    argument = "model.tensor_model_parallel_size=1"
    config, _ = load_bridge(Path(path), path, [argument])
    assert config.source.mapping["sequence_parallel"] is False
    assert config.where("sequence_parallel") == (f"argument 1 ({argument})", None)
    assert any("sequence_parallel: true with tensor_model_parallel_size 1" in line
               and "finalize() turns it off" in line for line in config.source.header_notes)
    config, _ = load_bridge(Path(path), path)  # TP 2 keeps it
    assert config.source.mapping["sequence_parallel"] is True
