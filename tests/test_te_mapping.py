"""The te runtime's own logic on CPU, against a stand-in transformer_engine (tests/fake_te.py).

These check qaudit's side only: Quant -> TE recipe mapping and back, feature detection of
renamed TE APIs and missing recipe classes, the GPU-capability refusal, module construction
arguments, row padding, and the wgrad probe and its measurement. Whether real TE behaves as
assumed is tests/test_gpu.py's job (marked gpu, run by scripts/gpu-check).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import fake_te
from qaudit.run.options import AuditOptions
from qaudit.commands.check import audit_files
from qaudit.errors import EnvironmentProblem
from qaudit.load.precision import Quant
from qaudit.runtime import reference
from qaudit.runtime.te import TEApi, TERuntime, _pad_rows
from qaudit.runtime.wgrad import documented_rule, measure_wgrad_rule, observe_wgrad

QUANTS = [Quant("fp8", "tensorwise", "e4m3"), Quant("fp8", "tensorwise", "hybrid"),
          Quant("fp8", "delayed", "hybrid"), Quant("fp8", "blockwise", "e4m3"),
          Quant("fp8", "mxfp8", "e4m3"), Quant("fp4", "nvfp4")]
TE_CLASS = {"tensorwise": "Float8CurrentScaling", "delayed": "DelayedScaling",
            "blockwise": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling",
            "nvfp4": "NVFP4BlockScaling"}


@pytest.fixture
def new_te(monkeypatch):
    fake_te.install(monkeypatch, "new")
    return TERuntime(TEApi.load(), device="cpu")


@pytest.fixture
def old_te(monkeypatch):
    fake_te.install(monkeypatch, "old", version="1.13.0")
    return TERuntime(TEApi.load(), device="cpu")


@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: f"{q.label}-{q.fp8_format}")
def test_quant_maps_to_te_recipe_and_back_through_te_state(new_te, quant):
    recipe = new_te.recipe_for(quant)
    assert type(recipe).__name__ == TE_CLASS[quant.recipe]
    if quant.fmt == "fp8":
        assert recipe.fp8_format == fake_te.Format[quant.fp8_format.upper()]
    assert new_te.recipe_for(quant) is recipe  # one recipe object per Quant
    assert new_te.current_quant() is None
    with new_te.autocast(quant):
        assert fake_te.FP8GlobalStateManager.enabled  # TE's own state, not a stack of ours
        assert new_te.current_quant() == quant
        with new_te.autocast(None):
            assert not fake_te.FP8GlobalStateManager.enabled
            assert new_te.current_quant() is None
        assert new_te.current_quant() == quant
    assert new_te.current_quant() is None


def test_delayed_scaling_gets_megatron_defaults(new_te):
    recipe = new_te.recipe_for(Quant("fp8", "delayed", "e4m3"))
    assert (recipe.margin, recipe.amax_history_len, recipe.amax_compute_algo) == (0, 1, "most_recent")


def test_high_precision_outside_any_autocast_enters_nothing(new_te):
    with new_te.autocast(None):
        assert fake_te.FP8GlobalStateManager.depth == 0  # Megatron opens nullcontext here
    assert fake_te.AUTOCAST_CALLS == []


def test_new_api_is_preferred(new_te):
    assert new_te.api.autocast_api == "autocast" and new_te.api.model_init_api == "quantized_model_init"
    with new_te.autocast(QUANTS[0]):
        pass
    assert [name for name, _ in fake_te.AUTOCAST_CALLS] == ["autocast"]
    assert new_te.description == "te (CUDA, TE 2.18.0)"


def test_old_api_is_detected_and_missing_recipes_are_named(old_te):
    assert old_te.api.autocast_api == "fp8_autocast" and old_te.api.model_init_api == "fp8_model_init"
    quant = Quant("fp8", "delayed", "e4m3")
    with old_te.autocast(quant):
        assert old_te.current_quant() == quant
    assert [name for name, _ in fake_te.AUTOCAST_CALLS] == ["fp8_autocast"]
    with pytest.raises(EnvironmentProblem) as excinfo:
        old_te.recipe_for(Quant("fp8", "tensorwise", "e4m3"))
    message = str(excinfo.value)
    assert "Float8CurrentScaling" in message and "TE 2.2 or newer" in message and "1.13.0" in message


def test_unsupported_gpu_is_one_line_naming_recipe_and_capability(new_te):
    reason = "Device compute capability 10.0 or higher required for MXFP8 execution."
    fake_te.FP8GlobalStateManager.support["is_mxfp8_available"] = (False, reason)
    with pytest.raises(EnvironmentProblem) as excinfo:
        with new_te.autocast(Quant("fp8", "mxfp8", "e4m3")):
            pass
    message = str(excinfo.value)
    assert "\n" not in message
    assert "fp8/mxfp8" in message and "MXFP8BlockScaling" in message
    assert "compute capability 10.0+" in message and reason in message
    assert "--runtime reference" in message
    assert not fake_te.FP8GlobalStateManager.enabled  # refused before entering TE's autocast


def test_custom_recipe_is_refused(new_te):
    with pytest.raises(EnvironmentProblem, match="custom"):
        new_te.recipe_for(Quant("fp8", "custom", "e4m3"))


def test_modules_are_built_as_documented(new_te):
    new_te.wgrad_rule("linear"), new_te.wgrad_rule("grouped_linear")  # measured on own modules
    fake_te.CONSTRUCTED.clear()
    linear = new_te.linear(32, 64, fuse=True)
    grouped = new_te.grouped_linear(4, 32, 16, fuse=False)
    built = [c for c in fake_te.CONSTRUCTED if c["init_depth"]]  # inside quantized_model_init
    assert [c["class"] for c in built] == ["Linear", "GroupedLinear"]
    for kwargs, fuse in zip(built, (True, False)):
        assert kwargs["fuse_wgrad_accumulation"] is fuse and kwargs["bias"] is False
        assert kwargs["params_dtype"] is torch.float32 and kwargs["device"] == "cpu"
    assert ("quantized_model_init", {"enabled": False}) in fake_te.AUTOCAST_CALLS
    assert float(linear.weight.detach().std()) == pytest.approx(32 ** -0.5, rel=0.2)  # reference's init
    assert isinstance(grouped, fake_te.GroupedLinear)


def test_pad_rows_keeps_values_and_restores_order():
    x = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4)
    padded, splits, restore = _pad_rows(x, [3, 0, 5], 16)
    assert splits == [16, 0, 16] and padded.shape == (32, 4)
    assert torch.equal(padded[:3], x[:3]) and torch.equal(padded[16:21], x[3:])
    assert padded[3:16].abs().sum() == 0 and padded[21:].abs().sum() == 0
    assert torch.equal(restore(padded), x)
    dense = torch.ones(2, 3, 4)
    padded, _, restore = _pad_rows(dense, None, 16)
    assert padded.shape == (16, 4) and torch.equal(restore(padded), dense)
    assert _pad_rows(x, [16, 0], 16)[2] is None


def test_grouped_rows_are_padded_only_when_quantized(new_te):
    grouped = new_te.grouped_linear(3, 32, 16, fuse=False)
    x = torch.randn(8, 32)
    plain = grouped(x, [3, 0, 5])
    with new_te.autocast(Quant("fp8", "mxfp8", "e4m3")):
        padded = grouped(x, [3, 0, 5])
    assert fake_te.SEEN_SPLITS[-2:] == [[3, 0, 5], [32, 0, 32]]
    assert torch.allclose(plain, padded)  # the fake runs high precision either way


def test_measured_rule_of_reference_modules_is_the_documented_rule():
    x = torch.randn(16, 32)
    for make, call in [
        (lambda fuse: reference.Linear(32, 32, fuse_wgrad_accumulation=fuse),
         lambda m, inp, flag: m(inp, is_first_microbatch=flag)),
        (lambda fuse: reference.GroupedLinear(2, 32, 32, fuse_wgrad_accumulation=fuse),
         lambda m, inp, flag: m(inp, [8, 8], is_first_microbatch=flag)),
    ]:
        assert measure_wgrad_rule(make, call, x) == documented_rule()


def test_measurement_notices_a_module_that_breaks_the_rule():
    class AlwaysAccumulates(reference.Linear):
        def forward(self, x, is_first_microbatch=None):
            return super().forward(x, None)  # ignores the flag

    rule = measure_wgrad_rule(lambda fuse: AlwaysAccumulates(32, 32, fuse_wgrad_accumulation=fuse),
                              lambda m, inp, flag: m(inp, is_first_microbatch=flag), torch.randn(16, 32))
    assert rule[(True, True, False)] == "accumulate" != documented_rule()[(True, True, False)]


def test_probe_reports_before_the_module_backward():
    events = []

    class Recorded(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            events.append("module backward")
            return grad * 2

    x = torch.ones(3, requires_grad=True)
    out = observe_wgrad(Recorded.apply(x), lambda d: events.append(d), "overwrite")
    out.sum().backward()
    assert events == ["overwrite", "module backward"]
    with torch.no_grad():
        assert observe_wgrad(Recorded.apply(x), events.append, "x") is not None
    assert len(events) == 2


def test_te_runtime_measures_the_documented_rule_on_the_fake(new_te):
    assert new_te.wgrad_rule_differences() == {k: [] for k in ("linear", "layernorm_linear", "grouped_linear")}


ROW_FIELDS = ("name", "type", "precision", "recipe", "tracked", "accumulation",
              "calls_per_microbatch", "nograd_calls_per_microbatch", "verdict")
SMALL_MOE_FP8 = """\
num_layers: 2
hidden_size: 256
num_attention_heads: 8
num_moe_experts: 4
moe_router_topk: 2
moe_grouped_gemm: true
mtp_num_layers: 2
mtp_use_repeated_layer: true
fp8: e4m3
fp8_recipe: blockwise
"""


def test_full_audit_through_te_runtime_plumbing_matches_reference(monkeypatch, write_yaml, repo_configs):
    """Every row and verdict through TERuntime (fake TE, CPU) equals the reference runtime's:
    the probe, the measured rule, the autocast state and the padding are wired correctly."""
    fake_te.install(monkeypatch, "new")
    import qaudit.run.audit

    real_select = qaudit.run.audit.select_runtime
    monkeypatch.setattr(qaudit.run.audit, "select_runtime",
                        lambda name, device=None, **kw: TERuntime(TEApi.load(), device="cpu")
                        if name == "te" else real_select(name, device, **kw))
    for config in (str(repo_configs / "gpt-mtp-fp8-mtp-bf16.yaml"), write_yaml("moe.yaml", SMALL_MOE_FP8)):
        te = audit_files(config, options=AuditOptions(runtime="te"))
        ref = audit_files(config, options=AuditOptions(runtime="reference"))
        assert te.runtime.startswith("te (") and ref.runtime.startswith("reference")
        rows = [tuple(getattr(r, f) for f in ROW_FIELDS) for r in te.modules]
        assert rows == [tuple(getattr(r, f) for f in ROW_FIELDS) for r in ref.modules]
        assert [dataclasses.astuple(f) for f in te.findings] == [dataclasses.astuple(f) for f in ref.findings]
        assert any(r.verdict != "ok" for r in te.modules)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA answers")
def test_runtime_selection_without_cuda():
    from qaudit.runtime import select_runtime, te_unavailable_reason

    assert te_unavailable_reason()  # no CUDA here, with or without TE installed
    assert select_runtime("auto").description == "reference (CPU)"
    assert select_runtime("auto", "cpu").description == "reference (CPU)"
    with pytest.raises(EnvironmentProblem, match="--runtime te: "):
        select_runtime("te")
    # te on the CPU is TE's Python on qaudit's kernel stand-in: absent TE, an environment problem
    with pytest.raises(EnvironmentProblem, match="--runtime te: "):
        select_runtime("te", "cpu")
    with pytest.raises(EnvironmentProblem, match="--device cuda"):
        select_runtime("reference", "cuda")
    with pytest.raises(EnvironmentProblem, match="--device cuda"):
        select_runtime("auto", "cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA answers")
def test_cli_device_option_exit_codes(monkeypatch, capsys, repo_configs):
    import sys

    from qaudit import cli

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["qaudit", "check", str(repo_configs / "gpt-small-bf16.yaml"), *args])
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
        out, err = capsys.readouterr()
        return exit_info.value.code, out, err

    code, out, err = run("--device", "cuda")
    assert code == 3 and out == "" and err.count("\n") == 1 and "--device cuda" in err
    code, out, err = run("--runtime", "te", "--device", "cpu")
    assert code == 3 and out == "" and "--runtime te: " in err
    code, out, err = run("--device", "cpu", "--format", "json")
    assert code == 0 and '"runtime": "reference (CPU)"' in out


def test_parity_differences_follow_the_documented_tolerances():
    from qaudit.commands.parity import Side, differences, outcome

    def make(name, accumulation="overwrite-first", error=0.3, qa001=True, other_error=1e-7):
        side = Side(name, runtime=name, exit_code=1 if qa001 else 0)
        verdict = "QA001" if qa001 else "ok"
        for module, err, q in (("m", error, qa001), ("n", other_error, False)):
            side.rows[module] = {"precision": "fp8/tensorwise", "recipe": "-", "tracked": "yes",
                                 "accumulation": accumulation if module == "m" else "accumulate",
                                 "calls_per_microbatch": 2, "nograd_calls_per_microbatch": 0,
                                 "verdict": verdict if module == "m" else "ok"}
            side.errors[module], side.outcomes[module] = err, outcome(err, q)
        side.findings = [("QA001", "error", "m")] if qa001 else []
        return side

    assert differences(make("a"), make("b")) == []
    assert differences(make("a"), make("b", error=0.005)) == [
        "m: gradient a=lost (grad_rel_error 0.3) b=kept (grad_rel_error 0.005)"]
    assert differences(make("a"), make("b", accumulation="accumulate")) == [
        "m: accumulation a='overwrite-first' b='accumulate'"]
    assert differences(make("a"), make("b", other_error=0.05)) == []  # quantization noise
    assert differences(make("a"), make("b", other_error=0.5))[0].startswith("n: gradient a=kept")
    assert differences(make("a"), Side("b", unavailable="needs sm100")) == []


def test_gpu_check_runs_what_it_can_and_exits_3_without_te(monkeypatch, tmp_path, capsys, repo_configs):
    import json

    from qaudit.commands import parity
    monkeypatch.setattr(parity, "environment", lambda: {
        "torch": torch.__version__, "torch_cuda": "13.0", "cuda_available": True, "gpu": "Fake GPU",
        "compute_capability": "9.0", "transformer_engine": None, "te_reason": "TE is not installed"})
    monkeypatch.setenv("OUT", str(tmp_path))
    code = parity.main(["--sides", "reference-cpu,te", "--steps", "1", "--microbatches", "1",
                        str(repo_configs / "gpt-mtp-fp8-mtp-bf16.yaml")])
    out = capsys.readouterr().out
    assert code == 3
    assert "te not checked: TE is not installed" in out and "gpt-mtp-fp8-mtp-bf16" in out
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    assert result["exit_code"] == 3 and result["sides"] == ["reference-cpu"]
    side = result["configs"][0]["sides"]["reference-cpu"]
    assert side["exit_code"] == 1 and side["gradient_outcome"]["mtp.layers.0.eh_proj"] == "lost"


def test_the_te_side_of_a_config_only_the_reference_models_is_not_run(repo_configs):
    """--runtime te refuses CUDA graphs (exit 2): gpu-check's te side is then n/a with the
    reason, before anything runs, instead of an error that stops the whole check."""
    from qaudit.commands.parity import audit_side

    side = audit_side(str(repo_configs / "bridge-super-nvfp4-mtp-bf16.yaml"), "te", verify=False,
                      steps=1, microbatches=1)
    assert side.unavailable == ("--runtime te does not model cuda_graph_impl (reference "
                                "runtime only)")
    assert side.summary() == "n/a" and side.rows == {}
