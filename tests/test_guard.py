"""The guard's pieces without Megatron: the observer on a minimal TE-shaped module, the
verdict's rules (QA001 against QA007), the launcher's exit codes and its usage errors.
The guard inside a real Megatron training run: tests/test_guard_run.py (slow)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from qaudit.guard import launch
from qaudit.guard.session import EXIT_GUARD_FAILED, EXIT_STOPPED, GuardOptions
from qaudit.guard.context import model_config
from qaudit.guard.verdict import build_report
from qaudit.run.observe import LiveObserver

REPO = Path(__file__).resolve().parent.parent


class _Gemms:
    """TE's GEMM entry point, as TE's module code calls it: `out` and `accumulate` keywords."""

    calls = 0

    @staticmethod
    def general_gemm(a, b, out_dtype=None, accumulate=False, layout="TN", out=None,
                     grad=False):
        _Gemms.calls += 1
        product = b.t() @ a
        if out is None:
            return product, None
        if accumulate:
            out.add_(product)
        else:
            out.copy_(product)
        return out, None


class _LinearFunction(torch.autograd.Function):
    """A TE-like fused linear: forward saves the flag; backward writes main_grad through the
    GEMM entry point with TE's rule (accumulate unless is_first_microbatch)."""

    @staticmethod
    def forward(ctx, x, weight, flag, module):
        ctx.save_for_backward(x)
        ctx.weight, ctx.flag, ctx.module = weight, flag, module
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        weight, module = ctx.weight, ctx.module
        accumulate = not ctx.flag if ctx.flag is not None else True
        gemm = sys.modules["transformer_engine.pytorch.module.linear"].general_gemm
        wgrad = None
        if not module.fuse_wgrad_accumulation:
            wgrad = grad.t() @ x  # Megatron's non-fused path: the gradient goes to .grad
        elif not weight.requires_grad or module.loses:
            pass  # frozen; or a backward that computes no weight gradient (TE #3234's shape)
        elif module.wgrad_store is not None:  # delay_wgrad_compute: backward_dw writes later
            module.pending.append((x, grad, accumulate))
        else:
            gemm(x, grad, accumulate=accumulate, layout="NT", out=weight.main_grad, grad=True)
        return grad @ weight, wgrad, None, None


@pytest.fixture
def fake_te(monkeypatch):
    """`transformer_engine.pytorch.Linear` and TE's GEMM module, as far as the observer looks."""
    pytorch = types.ModuleType("transformer_engine.pytorch")
    gemm_module = types.ModuleType("transformer_engine.pytorch.cpp_extensions.gemm")
    gemm_module.general_gemm = _Gemms.general_gemm
    linear_module = types.ModuleType("transformer_engine.pytorch.module.linear")
    linear_module.general_gemm = _Gemms.general_gemm

    class Linear(torch.nn.Module):
        def __init__(self, width: int, fuse: bool = True) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(width, width))
            self.weight.main_grad = torch.zeros(width, width)
            self.fuse_wgrad_accumulation = fuse
            self.loses = False  # its backward writes no weight gradient
            self.wgrad_store = None  # TE's WeightGradStore where delay_wgrad_compute is on
            self.pending = []

        def backward_dw(self):
            gemm = sys.modules["transformer_engine.pytorch.module.linear"].general_gemm
            for x, grad, accumulate in self.pending:
                gemm(x, grad, accumulate=accumulate, layout="NT", out=self.weight.main_grad,
                     grad=True)
            self.pending.clear()

        def forward(self, x, is_first_microbatch=None):
            return _LinearFunction.apply(x, self.weight, is_first_microbatch, self)

    pytorch.Linear = Linear
    for name, module in {"transformer_engine": types.ModuleType("transformer_engine"),
                         "transformer_engine.pytorch": pytorch,
                         "transformer_engine.pytorch.cpp_extensions.gemm": gemm_module,
                         "transformer_engine.pytorch.module.linear": linear_module}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return pytorch


def _repeated_model(pytorch):
    """One module applied twice (a repeated MTP layer): call 1 gets the armed flag."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = pytorch.Linear(4)
            self.armed = True

        def forward(self, x):
            flag, self.armed = self.armed, False
            return self.layer(self.layer(x, is_first_microbatch=flag), is_first_microbatch=False)

    return Model()


def _train(observer, model, microbatches=2, zeroed=True):
    observer.watch([("", model)])
    with observer.installed():
        observer.recording = True
        observer.start_step(zeroed=zeroed)
        for microbatch in range(microbatches):
            observer.start_microbatch(microbatch)
            model(torch.randn(3, 4)).sum().backward()
        observer.recording = False
        observer.end_step()  # as the guard's session does after the schedule returns


def test_a_repeated_module_armed_first_loses_the_other_calls_gradient(fake_te):
    torch.manual_seed(0)
    model = _repeated_model(fake_te)
    observer = LiveObserver()
    _train(observer, model)
    records = observer.seen.records()["layer"]
    assert [(r.microbatch, r.call, r.flag, r.decision, r.lossy) for r in records] == [
        (0, 1, True, "overwrite", True), (0, 2, False, "accumulate", False),
        (1, 1, False, "accumulate", False), (1, 2, False, "accumulate", False)]
    # Call 2's backward runs first (call 1 feeds it), so call 1's overwrite comes second.
    assert [r.backward_seq for r in records[:2]] == [2, 1]
    report = build_report([_part(observer)], GuardOptions())
    assert [(f.rule, f.module) for f in report.findings] == [("QA001", "layer")]
    assert report.modules[0].calls_per_microbatch == 2
    assert report.exit_code() == 1


def test_the_guard_costs_one_wrapper_per_call_and_per_write_then_nothing(fake_te, monkeypatch):
    model = _repeated_model(fake_te)
    observer = LiveObserver()
    counted = {"calls": 0, "writes": 0}
    on_call, on_write = observer.on_call, observer.on_write

    def count(name, method):
        def counting(*args, **kwargs):
            counted[name] += 1
            return method(*args, **kwargs)
        return counting

    monkeypatch.setattr(observer, "on_call", count("calls", on_call))
    monkeypatch.setattr(observer, "on_write", count("writes", on_write))
    forward = fake_te.Linear.forward
    _train(observer, model)
    assert counted == {"calls": 4, "writes": 4}  # 2 microbatches x 2 calls, one write each
    # Removed: TE's own forward and GEMM entry point are back, and a further step adds nothing.
    assert fake_te.Linear.forward is forward
    linear = sys.modules["transformer_engine.pytorch.module.linear"]
    assert linear.general_gemm is _Gemms.general_gemm
    model(torch.randn(3, 4)).sum().backward()
    assert counted == {"calls": 4, "writes": 4} and len(observer.seen.calls) == 4


def test_an_overwrite_of_a_buffer_written_by_someone_else_is_qa007(fake_te):
    """A module called once, with no armed flag, whose buffer holds gradient nobody's call of
    it wrote (another writer): its overwrite is lossy, and no modelled cause explains it."""
    torch.manual_seed(0)
    layer = fake_te.Linear(4)
    observer = LiveObserver()
    observer.watch([("", torch.nn.ModuleDict({"layer": layer}))])
    with observer.installed():
        observer.recording = True
        observer.start_step(zeroed=True)
        layer.weight.main_grad.fill_(1.0)  # an unknown writer, after the zeroing
        layer(torch.randn(3, 4), is_first_microbatch=None).sum().backward()
        # TE passes accumulate=True for None; make the writer overwrite instead:
        sys.modules["transformer_engine.pytorch.module.linear"].general_gemm(
            torch.randn(3, 4), torch.randn(3, 4), accumulate=False, out=layer.weight.main_grad)
        observer.recording = False
    assert [s.lossy for s in observer.seen.strays] == [True]
    report = build_report([_part(observer)], GuardOptions())
    assert [(f.rule, f.module) for f in report.findings] == [("QA007", "layer")]


def test_numeric_measures_what_an_overwrite_discarded(fake_te):
    torch.manual_seed(0)
    model = _repeated_model(fake_te)
    observer = LiveObserver(numeric=True)
    before = _Gemms.calls
    _train(observer, model, microbatches=1)
    checks = {(c.call, c.decision): c for c in observer.seen.numeric}
    overwrite, accumulate = checks[(1, "overwrite")], checks[(2, "accumulate")]
    assert overwrite.lost == pytest.approx(accumulate.own) and overwrite.lost > 0
    assert accumulate.before == 0 and accumulate.lost == 0
    assert max(c.residual for c in observer.seen.numeric) < 1e-6
    # One extra GEMM per write, into scratch: two writes, four GEMMs.
    assert _Gemms.calls - before == 4
    report = build_report([_part(observer)], GuardOptions(numeric=True))
    assert report.findings[0].evidence == "confirmed"
    assert "discarded a main_grad of norm" in report.findings[0].message


def test_replicas_merge_into_one_verdict_and_a_loss_on_any_rank_counts(fake_te):
    torch.manual_seed(0)
    lossy, clean = LiveObserver(), LiveObserver()
    _train(lossy, _repeated_model(fake_te))
    per_depth = _repeated_model(fake_te)
    per_depth.armed = False  # nothing armed: no overwrite anywhere
    _train(clean, per_depth)
    report = build_report([_part(clean, rank=0), _part(lossy, rank=1)], GuardOptions())
    assert [f.rule for f in report.findings] == ["QA001"]
    assert report.guard["ranks"] == 2


def _part(observer: LiveObserver, rank: int = 0, launch: str | None = None) -> dict:
    return {"rank": rank, "observation": observer.seen, "notes": [], "failed": None,
            "launch": launch, "te_version": "2.20.2",
            "config": model_config(types.SimpleNamespace(num_layers=1, hidden_size=4,
                                                         num_attention_heads=1,
                                                         mtp_use_repeated_layer=True,
                                                         mtp_num_layers=2)),
            "te": "fake", "megatron": None, "rearms": False}


@pytest.mark.parametrize("launch_kind, fix", [
    ("flags", "add --no-gradient-accumulation-fusion to the launch command"),
    ("bridge", "++model.gradient_accumulation_fusion=false"),
    (None, "set gradient_accumulation_fusion: false")])
def test_a_stop_says_what_to_do_in_the_launchs_own_syntax(fake_te, launch_kind, fix):
    """The findings grouped as `qaudit check`'s verdict, each group's fix line (Megatron-LM's
    flags, a Bridge override, else the field by name), the rule's explanation, and the
    one-line summary last."""
    from qaudit.guard.verdict import report_dict, verdict_text

    torch.manual_seed(0)
    observer = LiveObserver()
    _train(observer, _repeated_model(fake_te))
    report = build_report([_part(observer, launch=launch_kind)], GuardOptions())
    lines = verdict_text(report, True, GuardOptions())
    assert all(line.startswith("qaudit guard: ") for line in lines)
    text = "\n".join(lines)
    assert "QA001 error" in text and fix in " ".join(text.replace("qaudit guard:", "").split())
    assert lines[-2] == "qaudit guard: explain: qaudit explain QA001"
    assert lines[-1].startswith("qaudit guard: stopped before the optimizer step: 1 error(s)")
    document = report_dict(report, stopped=True)
    assert document["exit_code"] == EXIT_STOPPED
    assert document["te"]["version"] == "2.20.2" and document["te"]["source"] == "installed"


def test_a_rank_whose_guard_failed_joins_the_verdict_without_an_observation(fake_te):
    torch.manual_seed(0)
    observer = LiveObserver()
    _train(observer, _repeated_model(fake_te))
    report = build_report([_part(observer), {"rank": 1, "failed": "RuntimeError: boom"}],
                          GuardOptions(mode="warn"))
    assert [f.rule for f in report.findings if f.severity == "error"] == ["QA001"]
    assert report.guard["failed"] == ["RuntimeError: boom"]


def test_the_options_are_checked():
    with pytest.raises(ValueError):
        GuardOptions(mode="pause")
    with pytest.raises(ValueError):
        GuardOptions(steps=0)


@pytest.mark.parametrize("code, results, mode, expected", [
    (0, [{"rank": 0, "stop": False, "findings": False, "report": {}}], "stop", 0),
    (1, [{"rank": 0, "stop": True, "findings": True, "report": {}}], "stop", EXIT_STOPPED),
    (0, [{"rank": 1, "stop": False, "findings": False}], "stop", 0),  # a node without rank 0
    (130, [], "stop", 130),  # interrupted before any watched step: the shell's code
    (7, [], "stop", 7),  # the job's own failure before any watched step: its code
    (0, [], "stop", EXIT_GUARD_FAILED),  # a clean exit the guard never vouched for
    (0, [], "warn", 0),
    (0, [{"rank": 0, "failed": "boom"}], "stop", EXIT_GUARD_FAILED),
    (0, [{"rank": 0, "failed": "boom"}], "warn", 0),
    (0, [{"rank": 0, "stop": False, "findings": True, "report": {}}], "warn", 0),
])
def test_the_exit_code_is_the_jobs_except_for_the_guards_own(code, results, mode, expected):
    assert launch.decide(code, results, GuardOptions(mode=mode)).code == expected


def _qaudit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qaudit", *args], capture_output=True,
                          text=True, cwd=cwd or REPO, timeout=300)


def test_no_command_and_an_unknown_command_are_usage_errors():
    done = _qaudit("guard")
    assert done.returncode == 2 and "give the launch command after --" in done.stderr
    done = _qaudit("guard", "--", "no-such-command-qaudit")
    assert done.returncode == 2 and "no-such-command-qaudit" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_a_job_without_megatron_keeps_its_exit_code_and_is_not_vouched_for(tmp_path):
    done = _qaudit("guard", "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert done.returncode == 7
    done = _qaudit("guard", "--", sys.executable, "-c", "print('trained')")
    assert done.returncode == EXIT_GUARD_FAILED
    assert "saw no completed watched step" in done.stderr
    done = _qaudit("guard", "--mode", "warn", "--", sys.executable, "-c", "print('trained')")
    assert done.returncode == 0


class _ApexLinearFunction(torch.autograd.Function):
    """Megatron's own linear with gradient_accumulation_fusion: the weight gradient is added
    into `weight.main_grad` by APEX's kernel, whatever parameter `weight` is."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x)
        ctx.weight = weight
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        apex = sys.modules["fused_weight_gradient_mlp_cuda"]
        apex.wgrad_gemm_accum_fp32(x, grad, ctx.weight.main_grad)
        return grad @ ctx.weight, None


def _tied_model():
    """An embedding and an output layer without a weight of its own, handed the embedding's
    (share_embeddings_and_output_weights), called twice (the main head and an MTP depth)."""

    class ColumnParallelLinear(torch.nn.Module):
        gradient_accumulation_fusion = True

        def forward(self, x, weight=None):
            return _ApexLinearFunction.apply(x, weight)

    ColumnParallelLinear.__module__ = "megatron.core.tensor_parallel.layers"

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Parameter(torch.randn(4, 4))
            self.embedding.main_grad = torch.zeros(4, 4)
            self.output_layer = ColumnParallelLinear()

        def forward(self, x):
            head = self.output_layer(x, weight=self.embedding)
            return head + self.output_layer(x * 2, weight=self.embedding)

    return Model()


def test_a_tied_output_layers_writes_into_the_embeddings_buffer_are_its_calls(monkeypatch):
    """The output layer has no weight; its wgrad goes into the embedding's main_grad. Each
    write is attributed to the call that made it, and --numeric measures it."""
    def wgrad_gemm_accum_fp32(x, grad, main_grad):
        main_grad.add_(grad.t() @ x)

    apex = types.ModuleType("fused_weight_gradient_mlp_cuda")
    apex.wgrad_gemm_accum_fp32 = wgrad_gemm_accum_fp32
    monkeypatch.setitem(sys.modules, "fused_weight_gradient_mlp_cuda", apex)
    torch.manual_seed(0)
    model = _tied_model()
    observer = LiveObserver(numeric=True)
    _train(observer, model, microbatches=1)
    records = observer.seen.records()["output_layer"]
    assert [(r.call, r.decision) for r in records] == [(1, "accumulate"), (2, "accumulate")]
    assert observer.seen.strays == []
    checks = observer.seen.numeric
    assert [(c.module, c.call) for c in checks] == [("output_layer", 2), ("output_layer", 1)]
    assert all(c.own > 0 and c.residual < 1e-6 for c in checks)
    report = build_report([_part(observer)], GuardOptions(numeric=True))
    assert {row.name: row.accumulation for row in report.modules} == {"output_layer": "accumulate"}


def test_the_flags_that_cannot_run_on_a_cpu_are_named_with_why():
    from enum import Enum

    from qaudit.guard import cpu

    backend = Enum("AttnBackend", "auto flash fused unfused local")
    usual = types.SimpleNamespace(cuda_graph_impl="none", attention_backend=backend.auto,
                                  tp_comm_overlap=False, optimizer_cuda_graph=False)
    assert cpu.refusals(usual) == []
    lines = cpu.refusals(types.SimpleNamespace(cuda_graph_impl="transformer_engine",
                                               attention_backend=backend.fused,
                                               tp_comm_overlap=True, optimizer_cuda_graph=True))
    assert [line.split(" cannot run under --cpu: ")[0] for line in lines[:3]] == [
        "--cuda-graph-impl transformer_engine", "--optimizer-cuda-graph", "--tp-comm-overlap"]
    assert all("rehearse" in line for line in lines[:3])
    assert lines[3].startswith("--attention-backend fused under --cpu: TE's unfused attention")


def test_megatrons_type_name_checks_see_cuda_names_under_the_cpu_pose():
    """clip_grads.py asserts 'torch.cuda.FloatTensor' for every gradient; the BF16 optimizer
    sorts parameters by 'torch.cuda.BFloat16Tensor'. Conversions stay torch's own."""
    from qaudit.runtime.standin import boot as environment

    with environment._cuda_type_names():
        assert torch.zeros(1).type() == "torch.cuda.FloatTensor"
        assert torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16)).type() == \
            "torch.cuda.BFloat16Tensor"
        assert torch.zeros(1).type(torch.float64).dtype == torch.float64
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_the_kernel_stand_in_has_no_fused_attention_in_either_calling_convention():
    from qaudit.runtime.standin import kernels

    tex = kernels.build(with_max512_backend=False)
    none = tex.NVTE_Fused_Attn_Backend.NVTE_No_Backend
    backend, reason = tex.get_fused_attn_backend(object())  # TE 2.20: one params object
    assert backend == none and reason
    assert tex.get_fused_attn_backend(True, 1, 1, 1, 1) == none  # TE 2.8 to 2.14: the fields


def _every_stand_in_module() -> dict:
    """Every module object qaudit puts into sys.modules for a CPU run, by name."""
    from qaudit.runtime.standin import boot as environment, mamba as standin_mamba
    from qaudit.runtime.standin import te_package as standin_te
    from qaudit.runtime.standin import kernels

    modules = {**standin_te.package().modules, **standin_mamba.modules(),
               "fused_weight_gradient_mlp_cuda": environment._fused_wgrad_module(),
               "transformer_engine_torch": kernels.build(False)}
    modules.update({name: environment._kernel_module(name)
                    for name in environment.TRITON_MODULES})
    return modules


def test_every_stand_in_module_answers_find_spec(monkeypatch):
    """transformers asks importlib.util.find_spec("causal_conv1d") when CUDA looks available
    (--cpu): a stand-in without __spec__ made that a ValueError, and Bridge did not import."""
    import importlib.util

    modules = _every_stand_in_module()
    for name in ("causal_conv1d", "mamba_ssm", "fused_weight_gradient_mlp_cuda",
                 "transformer_engine_torch", "transformer_engine.pytorch"):
        assert name in modules
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    for name, module in modules.items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.name == name, name
        assert (spec.submodule_search_locations is not None) == hasattr(module, "__path__"), name


# -- a weight gradient that never reached main_grad (QA009) ------------------------------------

def _one_layer(pytorch, **attributes):
    layer = pytorch.Linear(4)
    for name, value in attributes.items():
        setattr(layer, name, value)
    return layer


def _findings(observer) -> list[tuple[str, str]]:
    report = build_report([_part(observer)], GuardOptions())
    return [(f.rule, f.module) for f in report.findings if f.severity != "info"]


def _step(observer, model, body, zeroed=True):
    """One watched step: `body()` runs the microbatches; the session's end-of-step check."""
    observer.watch([("", model)])
    with observer.installed():
        observer.recording = True
        observer.start_step(zeroed=zeroed)
        body()
        observer.recording = False
        observer.end_step()


@pytest.mark.parametrize("zeroed", [True, False])
def test_a_fused_backward_that_writes_no_weight_gradient_is_qa009(fake_te, zeroed):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"lost": _one_layer(fake_te, loses=True),
                                 "kept": _one_layer(fake_te)})

    def body():
        for microbatch in range(2):
            observer.start_microbatch(microbatch)
            model["kept"](model["lost"](torch.randn(3, 4))).sum().backward()

    observer = LiveObserver()
    _step(observer, model, body, zeroed=zeroed)
    assert [(m.module, m.microbatch, m.call) for m in observer.seen.missing] == [
        ("lost", 0, 1), ("lost", 1, 1)]
    report = build_report([_part(observer)], GuardOptions())
    assert [(f.rule, f.module) for f in report.findings] == [("QA009", "lost")]
    assert report.exit_code() == 1
    assert "no weight gradient reached main_grad" in report.findings[0].message
    assert bool(model["lost"].weight.main_grad.eq(0).all())


def test_a_single_grouped_weight_names_te_3234(fake_te):
    torch.manual_seed(0)
    layer = _one_layer(fake_te, loses=True, single_grouped_weight=True)
    model = torch.nn.ModuleDict({"experts": layer})
    observer = LiveObserver()
    _step(observer, model, lambda: layer(torch.randn(3, 4)).sum().backward())
    finding = build_report([_part(observer)], GuardOptions()).findings[0]
    assert finding.rule == "QA009" and "#3234" in finding.message and "2.19" in finding.fix


def _frozen(pytorch):
    layer = _one_layer(pytorch, loses=True)
    layer.weight.requires_grad_(False)
    return layer, lambda x: layer(x.requires_grad_()).sum().backward()


def _no_backward(pytorch):
    layer = _one_layer(pytorch, loses=True)
    return layer, lambda x: layer(x)  # ran forward with grad enabled; nothing backpropagated


def _delayed(pytorch):
    layer = _one_layer(pytorch, wgrad_store=types.SimpleNamespace(
        delay_wgrad_compute=lambda: True))
    return layer, lambda x: layer(x).sum().backward()  # backward_dw comes after the step


def _not_fused(pytorch):
    layer = pytorch.Linear(4, fuse=False)
    return layer, lambda x: layer(x).sum().backward()  # .grad set, for Megatron's DDP hook


def _unseen_writer(pytorch):
    layer = _one_layer(pytorch, loses=True)

    def run(x):
        layer(x).sum().backward()
        layer.weight.main_grad.add_(1.0)  # a writer the GEMM wrappers do not see

    return layer, run


def _no_rows(pytorch):
    layer = _one_layer(pytorch, loses=True)
    # An expert routed no tokens: its weight gradient is zero, so a GEMM skipped for it
    # (TE may skip empty ones) loses nothing.
    return layer, lambda x: layer(x[:0]).sum().backward()


def _replaced_buffer(pytorch):
    layer = _one_layer(pytorch, loses=True)

    def run(x):
        layer(x).sum().backward()
        layer.weight.main_grad = torch.zeros(4, 4)  # a new buffer (Megatron-FSDP's way)

    return layer, run


@pytest.mark.parametrize("case", [_frozen, _no_backward, _delayed, _not_fused, _unseen_writer,
                                  _replaced_buffer, _no_rows])
def test_no_qa009_where_no_write_was_due_or_one_was_made(fake_te, case):
    torch.manual_seed(0)
    layer, run = case(fake_te)
    observer = LiveObserver()
    _step(observer, torch.nn.ModuleDict({"layer": layer}), lambda: run(torch.randn(3, 4)))
    assert observer.seen.missing == []
    assert _findings(observer) == []


def test_delayed_wgrad_written_by_backward_dw_within_the_step_is_attributed(fake_te):
    torch.manual_seed(0)
    layer = _one_layer(fake_te, wgrad_store=types.SimpleNamespace(
        delay_wgrad_compute=lambda: True))
    observer = LiveObserver()

    def body():
        layer(torch.randn(3, 4)).sum().backward()
        layer.backward_dw()

    _step(observer, torch.nn.ModuleDict({"layer": layer}), body)
    assert [r.decision for r in observer.seen.calls] == ["accumulate"]
    assert observer.seen.missing == [] and _findings(observer) == []


def test_pipeline_chunks_whose_backwards_all_run_in_the_step_are_silent(fake_te):
    """Two virtual chunks, 1F1B-like order: every forward of the step before its backward,
    microbatches interleaved; each call's write arrives before the step ends."""
    torch.manual_seed(0)
    first, second = _one_layer(fake_te), _one_layer(fake_te)
    chunks = [("stage0.chunk0/", torch.nn.ModuleDict({"layer": first})),
              ("stage0.chunk1/", torch.nn.ModuleDict({"layer": second}))]
    observer = LiveObserver()
    observer.watch(chunks)
    with observer.installed():
        observer.recording = True
        observer.start_step(zeroed=True)
        outputs = []
        for microbatch in range(2):
            observer.start_microbatch(microbatch)
            outputs.append(second(first(torch.randn(3, 4))))
        for output in outputs:
            output.sum().backward()
        observer.recording = False
        observer.end_step()
    assert observer.seen.missing == [] and _findings(observer) == []
    assert {r.decision for r in observer.seen.calls} == {"accumulate"}


class _GroupedOut(torch.Tensor):
    """TE 2.19's GroupedTensor as the wgrad GEMM's output: a wrapper tensor without storage of
    its own, whose row-wise buffer is the single grouped weight's main_grad."""

    @staticmethod
    def __new__(cls, rowwise_data):
        self = torch.Tensor._make_wrapper_subclass(cls, rowwise_data.shape,
                                                   dtype=rowwise_data.dtype)
        self.rowwise_data = rowwise_data
        return self

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError("not computed with here")


def test_a_grouped_tensor_output_is_seen_as_the_main_grad_it_wraps():
    from qaudit.run import observe

    def general_grouped_gemm_for_grouped_tensor(A, B, out, *, layout="TN", accumulate=False):
        """TE 2.19's signature (transformer_engine/pytorch/cpp_extensions/gemm.py)."""

    main_grad = torch.zeros(2, 4, 4)
    out = _GroupedOut(main_grad.view(-1))
    signature = observe._signature(general_grouped_gemm_for_grouped_tensor)
    args, kwargs = (None, None, out), {"layout": "NT", "accumulate": True}
    outs, accumulate = observe._out_and_accumulate(signature, args, kwargs, False)
    assert accumulate and observe._address(outs[0]) == main_grad.data_ptr()
    # --numeric makes no scratch copy of it: a repeat would write the real buffer.
    scratch = [torch.zeros_like(outs[0])]
    assert observe._into(signature, args, kwargs, outs, scratch, False) == (None, {})


# -- open upstream threads left to the guard (QA052): planted writers of their shape ---------

class _RouterFunction(torch.autograd.Function):
    """The shape of Megatron-LM PR #6943 (open): a router's FP32 weight gradient written
    straight into main_grad through TE's `general_gemm` held by a Megatron module, adding
    unless the call's is_first_microbatch is True; a dummy gradient for DDP's hook."""

    @staticmethod
    def forward(ctx, x, weight, first):
        ctx.save_for_backward(x)
        ctx.weight, ctx.first = weight, first
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        gemm = sys.modules["megatron.core.transformer.moe.router"].general_gemm
        gemm(x, grad, accumulate=not ctx.first, layout="NT", out=ctx.weight.main_grad, grad=True)
        return grad @ ctx.weight, None, None


def _router_step(monkeypatch, calls):
    """Two microbatches through a router applied `calls` times (twice: a repeated MTP
    layer), each call's wgrad told first on the first microbatch."""
    router_module = types.ModuleType("megatron.core.transformer.moe.router")
    router_module.general_gemm = _Gemms.general_gemm
    monkeypatch.setitem(sys.modules, "megatron.core.transformer.moe.router", router_module)

    class Router(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 4))
            self.weight.main_grad = torch.zeros(4, 4)

        def forward(self, x, first):
            return _RouterFunction.apply(x, self.weight, first)

    torch.manual_seed(0)
    router = Router()
    observer = LiveObserver()

    def body():
        for microbatch in range(2):
            observer.start_microbatch(microbatch)
            hidden = torch.randn(3, 4)
            for _ in range(calls):
                hidden = router(hidden, microbatch == 0)
            hidden.sum().backward()

    _step(observer, torch.nn.ModuleDict({"router": router}), body)
    return observer


def test_a_router_wgrad_fused_through_te_gemm_that_overwrites_is_qa007(fake_te, monkeypatch):
    """PR #6943's writer in a repeated MTP layer, both calls of the first microbatch told
    first: the second call's GEMM overwrites the first's gradient. No TE module, no linear,
    no modelled cause: the guard sees the write through TE's GEMM and calls it QA007."""
    observer = _router_step(monkeypatch, calls=2)
    assert [(s.microbatch, s.decision, s.lossy) for s in observer.seen.strays] == [
        (0, "overwrite", True)]
    assert _findings(observer) == [("QA007", "router")]


def test_a_router_wgrad_fused_through_te_gemm_called_once_is_silent(fake_te, monkeypatch):
    """The same writer in a layer run once per microbatch: its overwrite lands on the zeroed
    buffer and the next microbatch adds; no record, no row, no finding."""
    observer = _router_step(monkeypatch, calls=1)
    assert observer.seen.strays == [] and "router" not in observer.seen.classes
    assert _findings(observer) == []
