"""The TE settings qaudit models (docs/te-settings.md), against TE's behaviour as read in its
code (TE main d0067d0da6 and the tags named there): the reference runtime's modules, then whole
audits whose verdicts the settings flip, with --verify measuring the gradients."""

from __future__ import annotations

import json

import pytest
import torch

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files
from qaudit.errors import InputError
from qaudit.load.precision import Quant
from qaudit.runtime.reference import GroupedLinear, Linear, autocast, graph_replay
from qaudit.run.train import attach_grad_buffers, run_backward_dw
from qaudit.plan.upstream.te import locate_te, te_behaviour, te_version_key

from cli_helpers import run_in_process

FP8 = Quant("fp8", "tensorwise")


def _module(fuse: bool = True, delayed: bool = False) -> Linear:
    torch.manual_seed(0)
    module = Linear(8, 4, fuse_wgrad_accumulation=fuse)
    if delayed:
        module.enable_delay_wgrad_compute()
    return module


def _two_calls(module: Linear, flags=(True, False)) -> None:
    """Two calls of one module per microbatch, call 2 consuming call 1 (as a repeated MTP
    layer), then backward: call 2's backward runs first, call 1's (flag True) last."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    h = module(x, is_first_microbatch=flags[0])
    y = module(torch.cat([h, h], dim=1), is_first_microbatch=flags[1])
    y.sum().backward()


def _true_grad(module: Linear) -> torch.Tensor:
    reference = Linear(8, 4, fuse_wgrad_accumulation=False)
    reference.weight.data.copy_(module.weight.data)
    _two_calls(reference)
    return reference.weight.grad.clone()


# --- the reference runtime ------------------------------------------------------------------

def test_frozen_weight_gets_no_weight_gradient():
    """TE linear.py: weight_requires_grad False at forward means requires_wgrad False: no GEMM,
    no main_grad write, wgrad None (the reference used to write main_grad anyway)."""
    module = _module()
    module.weight.requires_grad_(False)
    module.weight.main_grad = torch.full_like(module.weight, 7.0)
    decisions = []
    module.wgrad_listener = decisions.append
    x = torch.randn(3, 8, requires_grad=True)
    module(x, is_first_microbatch=True).sum().backward()
    assert decisions == [] and module.weight.grad is None
    assert torch.equal(module.weight.main_grad, torch.full_like(module.weight, 7.0))
    assert x.grad is not None  # dgrad still flows


@pytest.mark.parametrize("fuse", [True, False])
def test_delayed_wgrad_with_ddp_hook_gives_the_undelayed_outcome(fuse):
    """Queue in backward order (FIFO), decision frozen at backward, backward_dw writes it; with
    Megatron DDP's hook on the module the outcome equals the undelayed run's, fused or not."""
    outcomes = []
    for delayed in (False, True):
        module = _module(fuse, delayed)
        attach_grad_buffers(module)
        decisions = []
        module.wgrad_listener = decisions.append
        _two_calls(module)
        if delayed:
            assert not decisions and len(module.wgrad_store) == 2  # nothing ran yet
            assert torch.count_nonzero(module.weight.main_grad) == 0
            run_backward_dw(module)
        outcomes.append((decisions, module.weight.main_grad.clone()))
    (plain_decisions, plain), (delayed_decisions, delayed_grad) = outcomes
    assert plain_decisions == delayed_decisions
    assert torch.allclose(plain, delayed_grad)
    if fuse:  # call 1 (True) runs last and overwrites: the loss QA001 reports, unchanged
        assert plain_decisions == ["accumulate", "overwrite"]
        assert not torch.allclose(plain, _true_grad(module), atol=1e-6)
    else:
        assert torch.allclose(plain, _true_grad(module), atol=1e-6)


def test_delayed_wgrad_without_fusion_assigns_and_loses_without_the_hook():
    """TE base.py backward_dw (v2.8+): without fusion weight.grad is ASSIGNED; two queued
    GEMMs popped with no hook in between keep only the last one's gradient."""
    module = _module(fuse=False, delayed=True)
    _two_calls(module)
    assert module.weight.grad is None  # backward handed autograd None
    module.backward_dw()
    first = module.weight.grad.clone()
    module.backward_dw()
    assert not torch.allclose(module.weight.grad, first)
    assert not torch.allclose(module.weight.grad, _true_grad(module), atol=1e-6)


def test_delayed_wgrad_sets_grad_added_to_main_grad_at_backward_and_pop_empty_raises():
    module = _module(fuse=True, delayed=True)
    module.weight.main_grad = torch.zeros_like(module.weight)
    module.weight.grad_added_to_main_grad = False
    _two_calls(module)
    assert module.weight.grad_added_to_main_grad is True
    assert module.weight.skip_backward_post_hook is True
    run_backward_dw(module)
    with pytest.raises(RuntimeError, match="empty queue"):
        module.backward_dw()
    grouped = GroupedLinear(2, 8, 4, fuse_wgrad_accumulation=True)
    grouped.enable_delay_wgrad_compute()
    grouped.backward_dw()  # TE main's GroupedLinear returns on an empty queue


def _stale_setup(primary: bool) -> tuple[Linear, torch.Tensor]:
    module = _module()
    module.primary_quantized_weight = primary
    x = torch.randn(3, 8)
    with torch.no_grad(), autocast(FP8):
        module(x, is_first_microbatch=True)
        module.weight.add_(0.5)  # the optimizer step
    return module, x


@pytest.mark.parametrize("primary", [False, True])
def test_primary_quantized_weight_bypasses_the_workspace(primary):
    """TE base.py quantize_weight: a QuantizedTensor parameter is returned as is, so False
    cannot reuse a stale copy."""
    module, x = _stale_setup(primary)
    with torch.no_grad(), autocast(FP8):
        stale = module(x, is_first_microbatch=False)
        fresh = module(x, is_first_microbatch=None)
    assert torch.equal(stale, fresh) is primary
    assert ("reuse" in module.workspace_events) is not primary
    assert all(e == "primary" for e in module.workspace_events) is primary


@pytest.mark.parametrize("skip", [True, False])
def test_graph_replay_forces_false_and_gates_the_refresh(skip):
    """TE linear.py forward: with the skip tensor in a capture, is_first_microbatch becomes
    False (so True accumulates with fusion), and the cached weight is refreshed unless skip."""
    module, x = _stale_setup(primary=False)
    module.weight.main_grad = torch.full_like(module.weight, 3.0)
    decisions = []
    module.wgrad_listener = decisions.append
    with autocast(FP8), graph_replay(skip):
        module(x, is_first_microbatch=True).sum().backward()
    assert decisions == ["accumulate"]
    assert module.workspace_events[-1] == ("reuse" if skip else "refresh")


@pytest.mark.parametrize("version, reads", [("2.8", False), ("2.9", True), ("2.14.1", True),
                                            ("2.15", True)])
def test_overwrite_main_grad_is_ignored_before_te_2_9(version, reads):
    behaviour = te_behaviour(version)
    assert behaviour.reads_overwrite_main_grad is reads
    assert behaviour.overwrite_main_grad == {"2.8": "ignored", "2.9": "backward",
                                             "2.14.1": "backward", "2.15": "forward"}[version]
    module = _module()
    module.reads_overwrite_main_grad = behaviour.reads_overwrite_main_grad
    module.weight.main_grad = torch.zeros_like(module.weight)
    module.weight.overwrite_main_grad = True
    decisions = []
    module.wgrad_listener = decisions.append
    module(torch.randn(3, 8), is_first_microbatch=False).sum().backward()
    assert decisions == ["overwrite" if reads else "accumulate"]


@pytest.mark.parametrize("version", ["2.8.0", "2.9.0", "2.14.1", "2.15.0", "2.20.2"])
@pytest.mark.parametrize("kind", ["linear", "layernorm_linear", "grouped_linear"])
@pytest.mark.parametrize("quant, primary", [(None, False), (FP8, False), (FP8, True),
                                            (Quant("fp8", "mxfp8"), False)])
def test_overwrite_main_grad_per_release_module_kind_and_weight_copy(version, kind, quant,
                                                                     primary):
    """TE 2.9-2.14.1's LayerNormLinear and GroupedLinear read overwrite_main_grad in backward
    from the tensor their GEMM used (a quantized copy under FP8: no attribute, so the flag
    decides); their Linear, and every module from 2.15, read the parameter; 2.8 ignores it.
    A weight stored quantized (primary) is the GEMM's tensor itself, so it keeps it."""
    from qaudit.runtime.reference import ReferenceRuntime

    behaviour = te_behaviour(version)
    runtime = ReferenceRuntime("cpu", behaviour.reads_overwrite_main_grad,
                               overwrite_read_from_gemm_weight=(
                                   behaviour.overwrite_read_from_gemm_weight))
    module = (runtime.grouped_linear(2, 8, 8, fuse=True) if kind == "grouped_linear"
              else getattr(runtime, kind)(8, 8, fuse=True))
    module.primary_quantized_weight = primary
    module.weight.main_grad = torch.zeros_like(module.weight)
    module.weight.overwrite_main_grad = True
    decisions = []
    module.wgrad_listener = decisions.append
    x = torch.randn(4, 8)
    with autocast(quant):
        out = module(x, [2, 2], is_first_microbatch=False) if kind == "grouped_linear" \
            else module(x, is_first_microbatch=False)
    out.sum().backward()
    key = te_version_key(version)
    hidden = (2, 9) <= key < (2, 15) and kind != "linear" and quant is not None and not primary
    seen = key >= (2, 9) and not hidden
    assert decisions == ["overwrite" if seen else "accumulate"]


# --- the TE version audited for -------------------------------------------------------------

def test_te_version_is_read_from_metadata_without_importing(tmp_path):
    package = tmp_path / "site" / "transformer_engine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    info = tmp_path / "site" / "transformer_engine-2.12.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: transformer_engine\nVersion: 2.12.0\n")
    assert locate_te([str(tmp_path / "site")]) == (tmp_path / "site", "2.12.0")
    from qaudit.plan.upstream import te as te_module
    found = te_module._installed_or_assumed([str(tmp_path / "empty"), str(tmp_path / "site")])
    assert (found.source, found.version, found.behaviour.graph_warmup_rearms) == \
        ("installed", "2.12.0", True)
    assert te_module._installed_or_assumed([str(tmp_path / "empty")]).source == "assumed"


def test_te_checkout_version_file(tmp_path):
    (tmp_path / "transformer_engine").mkdir()
    (tmp_path / "transformer_engine" / "__init__.py").write_text("")
    (tmp_path / "build_tools").mkdir()
    (tmp_path / "build_tools" / "VERSION.txt").write_text("2.20.0.dev0\n")
    assert locate_te([str(tmp_path)]) == (tmp_path, "2.20.0.dev0")


# --- whole audits: each setting where it flips a verdict, with --verify ---------------------

REPEATED_MTP = """\
num_layers: 2
hidden_size: 256
num_attention_heads: 4
mtp_num_layers: 2
mtp_use_repeated_layer: true
"""
FP8_LINES = "fp8: e4m3\nfp8_recipe: tensorwise\n"


def _audit(path: str, **options):
    return audit_files(path, options=AuditOptions(verify=True, **options))


def _rows(report, prefix: str = "") -> dict:
    return {r.name: r for r in report.modules if r.name.startswith(prefix)}


@pytest.mark.parametrize("fusion", [True, False])
def test_delayed_wgrad_flips_no_verdict_under_megatron_ddp(write_yaml, fusion):
    """Reading TE and Megatron (docs/te-settings.md): the queue runs in backward order with the
    decision of the undelayed backward, and DDP's hook adds each assigned .grad: the same rows,
    findings and measured gradients with and without delay_wgrad_compute."""
    text = REPEATED_MTP + FP8_LINES + f"gradient_accumulation_fusion: {str(fusion).lower()}\n"
    plain = _audit(write_yaml("plain.yaml", text))
    delayed = _audit(write_yaml("delayed.yaml", text + "delay_wgrad_compute: true\n"))
    assert [(r.name, r.tracked, r.accumulation, r.verdict) for r in plain.modules] == \
        [(r.name, r.tracked, r.accumulation, r.verdict) for r in delayed.modules]
    # The same gradients up to summation order (the hook adds each call's .grad separately).
    for a, b in zip(plain.modules, delayed.modules):
        assert (a.grad_rel_error is None) == (b.grad_rel_error is None)
        assert a.grad_rel_error is None or abs(a.grad_rel_error - b.grad_rel_error) < 1e-6
    assert [f.message for f in plain.findings] == [f.message for f in delayed.findings]
    assert (plain.exit_code() == 1) is fusion


def test_te_cuda_graphs_remove_false_failures_inside_the_graph(write_yaml):
    """cuda_graph_impl transformer_engine + fp8: the MTP layer's inner modules replay a graph
    captured with is_first_microbatch=False, so they accumulate (QA001 gone, gradients exact);
    eh_proj is outside every graph and still loses its gradient."""
    before = _audit(write_yaml("a.yaml", REPEATED_MTP + FP8_LINES))
    after = _audit(write_yaml("b.yaml", REPEATED_MTP + FP8_LINES +
                              "cuda_graph_impl: transformer_engine\n"))
    inner = "mtp.layers.0.mtp_model_layer."
    assert all(r.verdict == "QA001" and r.grad_rel_error > 0.1 for r in _rows(before, inner).values())
    for row in _rows(after, inner).values():
        assert (row.tracked, row.accumulation, row.verdict) == ("graph", "accumulate", "ok")
        assert row.grad_rel_error < 1e-5
    eh_proj = _rows(after)["mtp.layers.0.eh_proj"]
    assert eh_proj.tracked == "yes" and eh_proj.verdict == "QA001" and eh_proj.grad_rel_error > 0.1
    assert _rows(after)["output_layer"].tracked == "-"


def test_cuda_graph_scope_picks_the_captured_modules(write_yaml):
    report = audit_files(write_yaml("c.yaml", REPEATED_MTP + FP8_LINES +
                                    "cuda_graph_impl: local\ncuda_graph_modules: [attn]\n"))
    graphed = {r.name for r in report.modules if r.tracked == "graph"}
    assert graphed and all(".self_attention." in name for name in graphed)
    assert "decoder.layers.0.mlp.linear_fc1" not in graphed


RECIPE = """\
configs:
  fp8:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp8_quantization_recipe: tensorwise
      override_nonquantized_autocast: true{extra}
matchers:
  decoder:
    type: glob
    pattern: "decoder.*"
    config: fp8
    enabled: true
"""
RECIPE_ONLY = "num_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\nquant_recipe: recipe.yaml\n"


def _recipe_config(write_yaml, primary: bool, extra: str = "") -> str:
    write_yaml("recipe.yaml", RECIPE.format(
        extra="\n      fp8_param: true" if primary else ""))
    return write_yaml("config.yaml", RECIPE_ONLY + extra)


@pytest.mark.parametrize("primary", [False, True])
def test_primary_weights_remove_stale_weight_errors(write_yaml, primary):
    """megatron-core 0.18.2 does not re-arm for a recipe alone (QA002, confirmed by --verify);
    with the recipe's fp8_param the weight is the quantized parameter: nothing goes stale."""
    report = _audit(_recipe_config(write_yaml, primary), megatron="0.18.2")
    qa002 = [f for f in report.findings if f.rule == "QA002"]
    assert bool(qa002) is not primary
    assert all(f.evidence.startswith("confirmed") for f in qa002)


@pytest.mark.parametrize("primary", [False, True])
def test_cuda_graphs_without_skip_flag_keep_a_stale_weight(write_yaml, primary):
    """A recipe-only config has no TE skip flag in its graphs: the capture after warm-up saw
    False and the replay never refreshes the cached weight (new QA002, measured); primary
    weights have no cache to go stale."""
    report = _audit(_recipe_config(write_yaml, primary, "cuda_graph_impl: local\n"))
    qa002 = [f for f in report.findings if f.rule == "QA002"]
    assert bool(qa002) is not primary
    assert all("CUDA graph" in f.message and f.evidence.startswith("confirmed") for f in qa002)


@pytest.mark.parametrize("te, accumulation", [("2.13", "overwrite-first"), ("2.14", "accumulate")])
def test_bf16_graph_capture_follows_te_warmup_rearming(write_yaml, te, accumulation):
    """No skip flag in BF16: TE before 2.14 re-armed the flags after warm-up, so the first
    microbatch's graph captured True (an overwrite, harmless for one call); from 2.14 on the
    capture sees the consumed flag and accumulates."""
    report = audit_files(write_yaml("g.yaml", "num_layers: 2\nhidden_size: 256\n"
                                    "num_attention_heads: 4\ncuda_graph_impl: transformer_engine\n"),
                         options=AuditOptions(te=te))
    rows = _rows(report, "decoder.")
    assert {(r.tracked, r.accumulation) for r in rows.values()} == {("graph", accumulation)}
    assert report.te["version"] == te and report.exit_code() == 0


def test_freeze_all_layers_removes_the_loss(write_yaml):
    report = _audit(write_yaml("f.yaml", REPEATED_MTP + FP8_LINES + "freeze_all_layers: true\n"))
    assert report.exit_code() == 0
    mtp = _rows(report, "mtp.")
    assert {r.accumulation for r in mtp.values()} == {"frozen"}
    assert all(r.calls_per_microbatch == 0 and r.nograd_calls_per_microbatch >= 2
               for r in mtp.values())
    assert all(r.grad_rel_error is None for r in report.modules)  # no gradient to measure


def test_megatron_fsdp_overwrite_is_ignored_before_te_2_9(write_yaml):
    """Megatron-FSDP sets overwrite_main_grad; TE before v2.9 has no such attribute, so a BF16
    repeated module on Megatron-LM main (None: accumulate) keeps all its calls' gradients (no
    QA001), but adds them into the uninitialised bucket of sharded gradients (QA006)."""
    path = write_yaml("fsdp.yaml", REPEATED_MTP + "use_megatron_fsdp: true\n"
                      "data_parallel_sharding_strategy: optim_grads_params\n")
    new = _audit(path, megatron="main")
    old = _audit(path, megatron="main", te="2.8")
    assert new.exit_code() == 1 and "QA006" not in {f.rule for f in new.findings}
    # Megatron's own output layer (one call per MTP depth) overwrites whatever TE does.
    te_errors = {f.rule for f in old.findings
                 if f.severity == "error" and f.module != "output_layer"}
    assert te_errors == {"QA006"}
    assert any(f.rule == "QA001" and f.module == "output_layer" for f in old.findings)
    assert max(r.grad_rel_error for r in _rows(new, "mtp.").values()) > 0.1
    assert max(r.grad_rel_error for r in _rows(old, "mtp.").values()) < 1e-5
    assert {r.accumulation for r in _rows(old, "mtp.").values()} == {"accumulate"}


@pytest.mark.parametrize("te, extra, message", [
    ("2.2", "", "needs Transformer Engine 2.3"),
    ("2.6", "gradient_accumulation_fusion: false\n", "2.7 or newer"),
])
def test_delayed_wgrad_on_a_te_megatron_refuses_exits_2(monkeypatch, capsys, write_yaml, te,
                                                       extra, message):
    path = write_yaml("d.yaml", REPEATED_MTP + "delay_wgrad_compute: true\n" + extra)
    code, _, err = run_in_process(monkeypatch, capsys, "check", path, "--te", te)
    assert code == 2 and message in err and "delay_wgrad_compute" in err


def test_te_runtime_refuses_settings_only_the_reference_models(write_yaml):
    path = write_yaml("r.yaml", REPEATED_MTP + "delay_wgrad_compute: true\n")
    with pytest.raises(InputError, match="--runtime te does not model delay_wgrad_compute"):
        audit_files(path, options=AuditOptions(runtime="te"))


FSDP_FP8_REPEATED_MTP = ("num_layers: 2\nhidden_size: 128\nnum_attention_heads: 4\n"
                         "mtp_num_layers: 2\nmtp_use_repeated_layer: true\n"
                         "fp8: e4m3\nfp8_recipe: tensorwise\nuse_megatron_fsdp: true\n"
                         "data_parallel_sharding_strategy: optim_grads_params\n")


@pytest.mark.parametrize("version", ["2.14.1", "2.20.2"])
def test_megatron_fsdp_fp8_layernorm_linear_on_te_2_14_follows_the_flag(write_yaml, version):
    """Megatron-FSDP sets overwrite_main_grad; under FP8, TE 2.14's LayerNormLinear does not
    see it (it reads the quantized copy), so its rows accumulate after the first microbatch,
    and a repeated one loses its gradient through the flag, not the attribute; Linear
    overwrites on every backward in both releases."""
    report = audit_files(write_yaml("fsdp.yaml", FSDP_FP8_REPEATED_MTP),
                         options=AuditOptions(te=version))
    rows = {r.name: r for r in report.modules}
    hidden = version == "2.14.1"
    assert rows["decoder.layers.0.mlp.linear_fc1"].accumulation == \
        ("overwrite-first" if hidden else "overwrite-always")
    assert rows["decoder.layers.0.mlp.linear_fc2"].accumulation == "overwrite-always"
    qa001 = {f.module: f.message for f in report.findings if f.rule == "QA001"}
    layernorm = qa001["mtp.layers.0.mtp_model_layer.mlp.linear_fc1"]
    assert ("is_first_microbatch=True" in layernorm) is hidden
    assert ("its weight has overwrite_main_grad" in layernorm) is not hidden
    assert "its weight has overwrite_main_grad" in qa001["mtp.layers.0.eh_proj"]


FSDP_FP8 = ("num_layers: 2\nhidden_size: 128\nnum_attention_heads: 4\nnum_moe_experts: 4\n"
            "moe_grouped_gemm: true\nmoe_ffn_hidden_size: 64\nmoe_layer_freq: [0, 1]\n"
            "fp8: e4m3\nfp8_recipe: tensorwise\nuse_megatron_fsdp: true\n"
            "data_parallel_sharding_strategy: optim_grads\n")


@pytest.mark.parametrize("version, extra, corrupt", [
    ("2.14.1", "", "layernorm and grouped"),
    ("2.10.0", "", "layernorm and grouped"),
    ("2.20.2", "", "none"),  # reads the attribute from the parameter
    # No such attribute before 2.9: every TE module adds (Megatron 0.19.2 refuses Megatron-FSDP
    # with fused accumulation before TE 2.10 for this reason).
    ("2.8.0", "", "every TE module"),
    ("2.14.1", "fp8_param: true\n", "none"),  # the GEMM's weight is the parameter
    ("2.14.1", "gradient_accumulation_fusion: false\n", "none"),
])
def test_an_fp8_layernorm_linear_adding_into_megatron_fsdps_bucket_is_qa006(write_yaml, version,
                                                                            extra, corrupt):
    """No module is repeated here, so QA001 has nothing to say: under sharded gradients the
    bucket a LayerNormLinear or GroupedLinear adds into on TE 2.9-2.14.1 is uninitialised."""
    report = audit_files(write_yaml("fsdp.yaml", FSDP_FP8 + extra),
                         options=AuditOptions(te=version))
    qa006 = {f.module for f in report.findings if f.rule == "QA006"}
    expected = {"decoder.layers.0.self_attention.linear_qkv", "decoder.layers.0.mlp.linear_fc1",
                "decoder.layers.1.self_attention.linear_qkv",
                "decoder.layers.1.mlp.experts.linear_fc1",
                "decoder.layers.1.mlp.experts.linear_fc2"}
    every_te = {r.name for r in report.modules if r.type.startswith("TE")}
    assert qa006 == {"layernorm and grouped": expected, "none": set(),
                     "every TE module": every_te}[corrupt]
    assert len(every_te) > len(expected)
    assert not any(f.rule == "QA001" for f in report.findings)
    assert report.exit_code() == (0 if corrupt == "none" else 1)


def test_every_format_names_the_te_behaviour(monkeypatch, capsys, write_yaml):
    path = write_yaml("t.yaml", "num_layers: 1\nhidden_size: 64\nnum_attention_heads: 4\n")
    code, out, _ = run_in_process(monkeypatch, capsys, "check", path, "--te", "2.15",
                                  "--format", "json")
    te = json.loads(out)["te"]
    assert te == {"source": "named", "version": "2.15", "label": "Transformer Engine 2.15",
                  "overwrite_main_grad": "forward", "location": None, "note": None}
    _, table, _ = run_in_process(monkeypatch, capsys, "check", path, "--te", "2.15")
    assert "te: Transformer Engine 2.15 (named with --te)" in table
    _, markdown, _ = run_in_process(monkeypatch, capsys, "check", path, "--te", "2.15",
                                    "--format", "markdown")
    assert "with Transformer Engine 2.15" in markdown
    _, sarif, _ = run_in_process(monkeypatch, capsys, "check", path, "--format", "sarif")
    assert json.loads(sarif)["runs"][0]["properties"]["te"]["source"] == "assumed"
    code, _, err = run_in_process(monkeypatch, capsys, "check", path, "--te", "3.0")
    assert code == 2 and "--te '3.0'" in err


def test_env_shows_megatron_and_te_side_by_side(monkeypatch, capsys):
    code, out, _ = run_in_process(monkeypatch, capsys, "env")
    block = out.split("audited for (check --megatron auto / --te auto):\n", 1)[1].split("\n\n")[0]
    labels = [line[:16].strip() for line in block.splitlines() if line[:16].strip()]
    assert labels == ["Megatron", "TE", "Bridge"] and "overwrite_main_grad" in block
    code, out, _ = run_in_process(monkeypatch, capsys, "env", "--format", "json")
    data = json.loads(out)
    assert data["te"]["source"] in ("installed", "assumed") and data["megatron"]["source"]


def test_auto_runtime_picks_reference_for_a_recipe_with_primary_weights(write_yaml):
    """A recipe's fp8_param is modelled by the reference runtime only: auto picks it, and
    --runtime te is refused before anything runs."""
    from qaudit.run.audit import reference_only_settings
    from qaudit.load.recipe import load_recipe
    from pathlib import Path

    path = _recipe_config(write_yaml, primary=True)
    recipe = load_recipe(Path(path).parent / "recipe.yaml")
    from qaudit.commands.check import load_inputs

    config, _ = load_inputs(path)
    assert reference_only_settings(config, recipe) == ["quant_recipe"]
    assert reference_only_settings(config, None) == []
    with pytest.raises(InputError, match="primary quantized weights"):
        audit_files(path, options=AuditOptions(runtime="te"))


def test_a_named_te_version_is_for_the_reference_runtime(write_yaml):
    path = write_yaml("n.yaml", "num_layers: 1\nhidden_size: 64\nnum_attention_heads: 4\n")
    with pytest.raises(InputError, match="--runtime te runs the installed"):
        audit_files(path, options=AuditOptions(runtime="te", te="2.8"))
    assert audit_files(path, options=AuditOptions(te="2.8")).runtime.startswith("reference")
