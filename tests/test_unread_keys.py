"""Issue 48: nothing silently ignored. Every key an input gives is read or refused (exit 2 at
its file, line and key); the false passes the issue found are exit 2 now."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qaudit.commands.check import load_inputs
from qaudit.errors import InputError

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "configs" / "deepseek-v3-mtp-fp8.yaml"
NESTED = "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"


def _load(path: Path):
    return load_inputs(str(path))


# --- plain YAML: keys beside `model:` -------------------------------------------------------

@pytest.mark.parametrize("extra, key, words", [
    ("mtp_num_layers: 2\nmtp_use_repeated_layer: true\n", "mtp_num_layers",
     ("belongs under `model:`",)),
    ("disable_parameter_transpose_cache: true\n", "disable_parameter_transpose_cache",
     ("belongs under `model:`",)),
    ("add_bias_linear: false\n", "add_bias_linear", ("belongs under `model:`",)),
    ("bogus_top: 1\n", "bogus_top", ("unknown top-level key",)),
    ("mtp_num_layer: 1\n", "mtp_num_layer", ("did you mean 'mtp_num_layers'?",
                                             "belongs under `model:`")),
    ("modle: {}\n", "modle", ("did you mean 'model'?",)),
])
def test_a_key_beside_model_is_refused_at_its_line(tmp_path, extra, key, words):
    """The example nests its fields under `model:`; a key appended at the top level used to
    change nothing (the repeated MTP layer written there gave exit 0)."""
    path = tmp_path / "config.yaml"
    text = EXAMPLE.read_text()
    path.write_text(text + extra)
    with pytest.raises(InputError) as error:
        _load(path)
    line = text.count("\n") + 1
    assert (error.value.file, error.value.line, error.value.key) == (str(path), line, key)
    for word in words:
        assert word in error.value.message


def test_model_alone_and_flat_files_still_load(tmp_path):
    nested, flat = tmp_path / "nested.yaml", tmp_path / "flat.yaml"
    nested.write_text(NESTED)
    flat.write_text(NESTED.replace("model:\n", "").replace("  ", ""))
    assert _load(nested)[0].num_layers == _load(flat)[0].num_layers == 2


# --- Bridge: a `_target_` that is not the class the section holds ----------------------------

SUPER = REPO / "configs" / "bridge-super-nvfp4-mtp-bf16.yaml"
LIGHTNING = REPO / "configs" / "bridge-lightning-mtp-bf16.yaml"
MP_CLASS = "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"


@pytest.mark.parametrize("old, new, key", [
    (MP_CLASS, "os.system", "mixed_precision._target_"),
    (MP_CLASS, "mypkg.MixedPrecisionConfig", "mixed_precision._target_"),
    ("megatron.bridge.training.comm_overlap.CommOverlapConfig", "os.system",
     "comm_overlap._target_"),
    ("megatron.bridge.training.config.DistributedInitConfig", "os.system", "dist._target_"),
])
def test_a_foreign_target_in_a_dump_is_refused_never_imported(tmp_path, old, new, key):
    """Issue 48: the section was audited as Bridge's class while Bridge would instantiate the
    foreign target (the dump's old verdict, exit 1)."""
    import sys

    text = (SUPER if old == MP_CLASS else LIGHTNING).read_text()
    if old not in text:  # the Lightning dump leaves comm_overlap/dist in Bridge's classes
        text = SUPER.read_text()
    assert old in text
    path = tmp_path / "dump.yaml"
    path.write_text(text.replace(old, new, 1))
    before = set(sys.modules)
    with pytest.raises(InputError) as error:
        _load(path)
    line = text.splitlines().index(next(l for l in text.splitlines() if old in l)) + 1
    assert (error.value.line, error.value.key) == (line, key)
    assert repr(new) in error.value.message and "never imports" in error.value.message
    assert not {m for m in set(sys.modules) - before if m.startswith("mypkg")}


@pytest.mark.parametrize("argument", ["++mixed_precision={_target_: os.system}",
                                      "++mixed_precision={_target_: os.system, fp8: e4m3}",
                                      "mixed_precision._target_=os.system",
                                      "++model._target_=os.system"])
def test_a_foreign_target_as_an_argument_is_refused(argument):
    # The Lightning dump names a recipe (a string): `mixed_precision._target_=` cannot be set
    # there (Hydra refuses, and so does qaudit, before any target is looked at).
    dumps = (SUPER,) if argument.startswith("mixed_precision.") else (SUPER, LIGHTNING)
    for dump in dumps:
        with pytest.raises(InputError) as error:
            load_inputs(str(dump), None, None, (argument,))
        assert "'os.system'" in error.value.message
        assert error.value.key.endswith("._target_") and argument in error.value.file


def test_bridge_classes_are_accepted():
    """Every class the shipped dumps name is Bridge's own (nothing refused)."""
    for dump in (SUPER, LIGHTNING):
        assert _load(dump)[0].num_layers > 0
    config, _ = load_inputs(str(SUPER), None, None, (f"++mixed_precision._target_={MP_CLASS}",))
    assert config.num_layers > 0


# --- Bridge dumps and the Python API: top-level keys ----------------------------------------

@pytest.mark.parametrize("extra, key, words", [
    ("trian: {}\n", "trian", ("not a ConfigContainer section", "did you mean 'train'?")),
    ("mtp_num_layers: 2\n", "mtp_num_layers", ("belongs under `model:`",)),
])
def test_a_dump_key_that_is_no_section_is_refused(tmp_path, extra, key, words):
    text = SUPER.read_text()
    path = tmp_path / "dump.yaml"
    path.write_text(text + extra)
    with pytest.raises(InputError) as error:
        _load(path)
    assert (error.value.line, error.value.key) == (text.count("\n") + 1, key)
    for word in words:
        assert word in error.value.message


def test_the_api_refuses_a_model_field_beside_model():
    """`audit({"model": {...}, "mtp_num_layers": 2, ...})` gave exit 0 before: the repeated MTP
    layer beside `model` was never read."""
    from qaudit import audit

    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    with pytest.raises(InputError, match="belongs under `model:`") as error:
        audit({"model": model, "mtp_num_layers": 2, "mtp_use_repeated_layer": True})
    assert error.value.key == "mtp_num_layers"


# --- the documented list of what is deliberately not read -------------------------------------

def test_the_documented_unread_sections_are_the_code_s():
    """docs/bridge.md's list of sections deliberately not read is the code's, and every
    ConfigContainer section is either read or on that list (anything else is refused)."""
    import re

    from qaudit.load.bridge import SECTIONS
    from qaudit.load.bridge.sections import READ_SECTIONS, SKIPPED_SECTIONS

    text = (REPO / "docs" / "bridge.md").read_text()
    item = text[text.index("**Deliberately not read**"):text.index("**Refused**")]
    listed = set(re.findall(r"`([a-z_]+)`", item.split("):", 1)[1].split("(`distill`")[0]))
    assert listed == SKIPPED_SECTIONS
    assert SECTIONS == READ_SECTIONS | SKIPPED_SECTIONS
    assert not READ_SECTIONS & SKIPPED_SECTIONS


# --- Hydra values a Bridge config can hold (issue 48, item 5) -------------------------------

FAST = dict(steps=1, microbatches=2)


def _lightning_without_repeated_layer(tmp_path) -> Path:
    """The bundled Lightning dump (one MTP layer at two depths) with the repeated layer off."""
    text = LIGHTNING.read_text()
    assert "  mtp_use_repeated_layer: true\n" in text
    path = tmp_path / "lightning.yaml"
    path.write_text(text.replace("  mtp_use_repeated_layer: true\n",
                                 "  mtp_use_repeated_layer: false\n"))
    return path


@pytest.mark.parametrize("word, code", [("yes", 1), ("no", 1), ("on", 1), ("false", 0),
                                        ("''", 0)])
def test_a_hydra_string_on_a_boolean_field_runs_as_its_truth(tmp_path, word, code):
    """Hydra keeps `yes`/`no`/`on` as strings and Bridge sets them as is (untyped OmegaConf,
    setattr); Megatron only tests `if config.mtp_use_repeated_layer:`, so any non-empty string
    is true: the repeated MTP layer runs and loses gradients (QA001). Refused before (exit 2,
    no verdict)."""
    from qaudit import audit

    path = _lightning_without_repeated_layer(tmp_path)
    report = audit(str(path), overrides=[f"model.mtp_use_repeated_layer={word}"], **FAST)
    assert report.exit_code == code
    rules = {finding.rule for finding in report.report.findings if finding.severity == "error"}
    assert rules == ({"QA001"} if code else set())
    noted = "model.mtp_use_repeated_layer=" in str(report.report.to_dict())
    assert noted == (word != "false")  # the header names a string it read as a truth


def test_an_empty_count_is_no_mtp_and_float_counts_are_refused_with_where(tmp_path):
    from qaudit import audit

    report = audit(str(SUPER), overrides=["model.mtp_num_layers="], **FAST)
    assert "model.mtp_num_layers=''" in str(report.report.to_dict())
    for argument, where in (("model.mtp_num_layers=1e0", "gpt_layer_specs.py:782"),
                            ("model.num_moe_experts=1.28e2", "moe/router.py:62")):
        with pytest.raises(InputError) as error:
            load_inputs(str(SUPER), None, None, (argument,))
        assert where in error.value.message and argument in error.value.file


# --- kv_channels: null is not set (issue 48, item 3) ------------------------------------------

@pytest.mark.parametrize("kv, refused", [("", True), ("kv_channels: null\n", True),
                                         ("kv_channels: 32\n", False)])
def test_kv_channels_null_is_checked_as_absent(tmp_path, kv, refused):
    """docs/upstream-checks.md: the head width must divide the hidden size when kv_channels is
    not set, on every route; `null` skipped the check before (exit 0)."""
    path = tmp_path / "model.yaml"
    path.write_text(f"num_layers: 2\nhidden_size: 100\nnum_attention_heads: 3\n{kv}")
    if refused:
        with pytest.raises(InputError, match="must be divisible by num_attention_heads"):
            _load(path)
    else:
        assert _load(path)[0].kv_channels == 32


# --- upstream's start-up refusals (issue 48, item 4) -----------------------------------------

BRIDGE_DUMPS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "bridge" / "dumps"
needs_dumps = pytest.mark.skipif(not BRIDGE_DUMPS.is_dir(), reason="Bridge corpus absent")


def _refused(dump: Path, arguments: tuple[str, ...]) -> InputError:
    with pytest.raises(InputError) as error:
        load_inputs(str(dump), None, None, arguments)
    return error.value


def test_mtp_depths_with_expert_overlap_are_refused_with_upstream_words():
    error = _refused(LIGHTNING, ("comm_overlap.overlap_moe_expert_parallel_comm=true",
                                 "comm_overlap.delay_wgrad_compute=true"))
    assert "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm." \
        in error.message and "transformer_config.py:2709" in error.message
    assert "overlap_moe_expert_parallel_comm=true" in error.file  # the argument that set it


@needs_dumps
def test_megatron_fsdp_saving_without_fsdp_dtensor_is_refused():
    dump = BRIDGE_DUMPS / "nemotron_3_5_lightning_pretrain_8gpu_b200_bf16_config.yaml"
    error = _refused(dump, ("ddp.use_megatron_fsdp=true",
                            "ddp.data_parallel_sharding_strategy=optim_grads_params"))
    assert "Megatron-FSDP requires the fsdp_dtensor checkpointing format!" in error.message
    assert error.key == "checkpoint.ckpt_format" and error.line is not None
    config, _ = load_inputs(str(dump), None, None, (
        "ddp.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=optim_grads_params",
        "checkpoint.ckpt_format=fsdp_dtensor"))
    assert config.use_megatron_fsdp


@needs_dumps
def test_delayed_scaling_with_moe_act_recompute_is_refused():
    dump = BRIDGE_DUMPS / "nemotron_3_5_lightning_pretrain_8gpu_b200_fp8mx_config.yaml"
    error = _refused(dump, ("mixed_precision.fp8_recipe=delayed",
                            "model.recompute_granularity=selective",
                            "model.recompute_modules=[moe_act]"))
    assert "Delayed scaling does not support moe_act and layernorm recompute for fp8." \
        in error.message


@needs_dumps
@pytest.mark.parametrize("arguments, words", [
    (("model.gradient_accumulation_fusion=false",),
     "Cannot defer embedding wgrad compute when gradient accumulation fusion is not used"),
    (("model.pipeline_model_parallel_size=1", "model.virtual_pipeline_model_parallel_size=null"),
     "Cannot defer embedding wgrad compute when pipeline model parallel is not used")])
def test_deferred_embedding_wgrad_needs_fusion_and_pipelining(arguments, words):
    dump = BRIDGE_DUMPS / "gpt3_175b_pretrain_32gpu_h100_bf16_config.yaml"
    assert words in _refused(dump, arguments).message
    # The dump's own `false` is the build machine's probe (a recipe's false could not start):
    # audited as the GPU job resolves it, true, not both ways.
    config, _ = load_inputs(str(dump))
    assert config.gradient_accumulation_fusion is True and not config.source.alternatives


@needs_dumps
def test_reusing_the_grad_buffer_without_mxfp8_params_is_refused():
    dump = BRIDGE_DUMPS / "nemotron_3_5_lightning_pretrain_8gpu_b200_fp8mx_config.yaml"
    error = _refused(dump, ("mixed_precision.fp8_param_gather=false",))
    assert "Reuse grad buffer only when keeping params in MXFP8." in error.message
    assert error.key == "mixed_precision.fp8_param_gather"
    assert load_inputs(str(dump), None, None, (
        "mixed_precision.fp8_param_gather=false",
        "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=false"))[0].fp8


@pytest.mark.parametrize("fields, words", [
    ("mtp_num_layers: 2\noverlap_moe_expert_parallel_comm: true\n", "MTP supports at most"),
    ("fp8: e4m3\nfp8_recipe: delayed\nrecompute_granularity: selective\n"
     "recompute_modules: [layernorm]\n", "Delayed scaling does not support"),
    ("defer_embedding_wgrad_compute: true\n", "pipeline model parallel is not used"),
    ("defer_embedding_wgrad_compute: true\npipeline_model_parallel_size: 2\n"
     "gradient_accumulation_fusion: false\n", "gradient accumulation fusion is not used")])
def test_the_model_field_refusals_hold_on_the_yaml_route(tmp_path, fields, words):
    path = tmp_path / "model.yaml"
    path.write_text(f"num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\n{fields}")
    with pytest.raises(InputError, match=words):
        _load(path)


MCORE_CASES = {
    "mtp with expert overlap": (dict(mtp_num_layers=2, overlap_moe_expert_parallel_comm=True,
                                     expert_model_parallel_size=2, num_moe_experts=4,
                                     moe_token_dispatcher_type="alltoall", bf16=True,
                                     moe_ffn_hidden_size=64, add_bias_linear=False),
                                "MTP supports at most one layer"),
    "delayed with layernorm recompute": (dict(fp8="e4m3", fp8_recipe="delayed",
                                              recompute_granularity="selective",
                                              recompute_modules=["layernorm"]),
                                         "Delayed scaling does not support moe_act"),
    "defer at pp 1": (dict(defer_embedding_wgrad_compute=True, gradient_accumulation_fusion=True),
                      "pipeline model parallel is not used"),
    "defer without fusion": (dict(defer_embedding_wgrad_compute=True,
                                  pipeline_model_parallel_size=2,
                                  gradient_accumulation_fusion=False),
                             "gradient accumulation fusion is not used"),
}


@pytest.mark.slow
@pytest.mark.usefixtures("forget_megatron")
@pytest.mark.parametrize("case", MCORE_CASES)
def test_the_model_field_refusals_are_megatron_cores_own(megatron, tmp_path, case):
    """The same fields through megatron-core 0.19.2's own TransformerConfig: refused with the
    words qaudit quotes (and qaudit refuses the YAML of those fields)."""
    import json

    from qaudit.crosscheck.build_scope import upstream_environment
    from qaudit.runtime.standin.side import TESide

    fields, words = MCORE_CASES[case]
    base = dict(num_layers=4, hidden_size=64, num_attention_heads=4)
    with upstream_environment(TESide("standin")):
        import torch
        from megatron.core.transformer.transformer_config import TransformerConfig

        # What upstream needs besides (not a YAML value): the pipeline's dtype.
        extra = {"pipeline_dtype": torch.bfloat16} \
            if fields.get("pipeline_model_parallel_size", 1) > 1 else {}
        with pytest.raises((ValueError, AssertionError), match=words):
            TransformerConfig(**base, **fields, **extra)
    path = tmp_path / "model.yaml"
    path.write_text(json.dumps({**base, **fields}))
    with pytest.raises(InputError, match=words):
        _load(path)


def test_the_header_says_the_start_up_checks_did_not_run_without_megatron(monkeypatch, capsys):
    """Issue 48: without an importable Megatron the report said nothing about upstream's own
    start-up checks; a launch script validate_args would refuse passed silently."""
    import sys

    from qaudit import cli

    monkeypatch.setattr(sys, "argv", ["qaudit", "check", str(REPO / "configs" / "gpt-mtp-bf16.yaml"),
                                      "--steps", "1", "--microbatches", "1", "--format", "json"])
    with pytest.raises(SystemExit):
        cli.main()
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["megatron"]["source"] == "assumed"
    assert report["megatron"]["startup_checks"].startswith("not run (no Megatron importable)")
