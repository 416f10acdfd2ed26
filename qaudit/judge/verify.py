"""--verify: measure, not predict. Each audited module's gradient of the last step is compared
with a reference computed without fused accumulation (plain autograd, summed over every call
and microbatch), with the same weights, data and quantization formats: in float64 when
nothing runs quantized, else in the run's own dtype (see reference_gradients).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from qaudit.model.gpt import build_model
from qaudit.plan.policies import TrackingPolicy
from qaudit.model.session import Session
from qaudit.judge.report import Finding, ModuleRow
from qaudit.runtime import select_runtime
from qaudit.run.train import make_batches, step_gradient

# Rounding between the run and its reference stays far below this; a lost call's
# gradient is far above it.
CONFIRM_THRESHOLD = 1e-2


@dataclass(frozen=True)
class _NeverTracked(TrackingPolicy):
    """Reference runs pass None: no cached weights, every call quantized afresh."""

    name: str = "reference"
    rearm_on: tuple[str, ...] | None = ()

    def flag_to_pass(self, module, is_context_quantized: bool):
        return None


def reference_gradients(run, options) -> dict[str, torch.Tensor]:
    """Per parameter name: the last step's gradient by plain, unfused autograd.

    Always the reference runtime (TE has no float64 GEMMs), on the audited run's device."""
    # Plain autograd: no fusion, FSDP, delayed wgrad or CUDA graphs; primary quantized weights
    # change nothing here (every reference call quantizes afresh, as they do).
    config = replace(run.facts.config, gradient_accumulation_fusion=False, use_megatron_fsdp=False,
                     delay_wgrad_compute=False, cuda_graph_impl="none", enable_cuda_graph=False,
                     external_cuda_graph=False, cuda_graph_modules=None, cuda_graph_scope=None)
    session = Session(select_runtime("reference", run.session.runtime.device), _NeverTracked())
    model = build_model(config, run.model.dims, session, run.facts.recipe, seed=options.seed)
    # float64 when nothing runs quantized. A quantized run is replayed in its own dtype: the
    # same float32 inputs round to the same fp8/fp4 values, so only the summation order
    # differs; a float64 replay would flip roundings at format boundaries, which deep or MoE
    # models amplify into percent-level noise (measured: median 4% on DeepSeek-V3).
    if not any(r.quant is not None for records in run.records.values() for r in records):
        model.double()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_snapshot_value(run.snapshot, name, param))
    model.train()
    for tokens, labels in make_batches(model, options.microbatches, options.seed):
        model(tokens, labels).backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def _snapshot_value(snapshot: dict[str, torch.Tensor], name: str, param: torch.Tensor) -> torch.Tensor:
    """The audited weight for a reference parameter: TE's GroupedLinear keeps one weight per
    expert (`weight0..N-1`) where the reference stacks them in one `weight`."""
    if name in snapshot:
        return snapshot[name]
    return torch.stack([snapshot[f"{name}{i}"] for i in range(param.shape[0])])


def _reference_gradient(reference: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """The reference gradient of an audited parameter (`…weight3`: slice 3 of `…weight`)."""
    if name in reference:
        return reference[name]
    stem, digits = name.rstrip("0123456789"), name[len(name.rstrip("0123456789")):]
    stacked = reference.get(stem) if digits and stem.endswith("weight") else None
    return None if stacked is None else stacked[int(digits)]


def relative_error(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    diff = sum(float((a.double() - e).pow(2).sum()) for a, e in zip(actual, expected)) ** 0.5
    norm = sum(float(e.pow(2).sum()) for e in expected) ** 0.5
    return diff / norm if norm > 0 else diff


def _stale_forward_error(module, quant) -> float:
    """How far the cached quantized weight's output is from a freshly quantized one."""
    inner = module.inner
    param = next(inner.parameters())
    x = torch.randn(8, inner.in_features, generator=torch.Generator().manual_seed(0),
                    dtype=param.dtype).to(param.device)
    runtime = module.session.runtime
    with torch.no_grad(), runtime.autocast(quant):
        listener, inner.wgrad_listener = inner.wgrad_listener, None
        args = ([x.shape[0]] + [0] * (inner.num_gemms - 1),) if hasattr(inner, "num_gemms") else ()
        cached = inner(x, *args, is_first_microbatch=False)
        fresh = inner(x, *args, is_first_microbatch=None)
        inner.wgrad_listener = listener
    return relative_error([cached], [fresh.double()])


def verify_run(run, options, findings: list[Finding]) -> tuple[list[ModuleRow], list[Finding]]:
    if run.facts.config.freeze_all_layers:
        return run.rows, findings  # no weight gradient anywhere: nothing to measure
    reference = reference_gradients(run, options)
    names = {id(p): n for n, p in run.model.named_parameters()}
    errors: dict[str, float | None] = {}
    modules = {m.fqn: m for m in run.model.audited_modules()}
    for fqn, module in modules.items():
        weights = module.weights()
        expected = [_reference_gradient(reference, names[id(w)]) for w in weights]
        if not weights or any(e is None for e in expected):
            errors[fqn] = None
            continue
        errors[fqn] = relative_error([step_gradient(w) for w in weights], expected)
    rows = [replace(row, grad_rel_error=_rounded(errors.get(row.name))) for row in run.rows]
    checked = []
    for finding in findings:
        if finding.rule == "QA001" and errors.get(finding.module) is not None:
            error = errors[finding.module]
            finding = replace(finding, evidence=(
                f"confirmed: main_grad is off by {error:.0%} of the true gradient "
                f"(grad_rel_error {error:.2e})" if error > CONFIRM_THRESHOLD else
                f"not reproduced: grad_rel_error {error:.2e} is rounding only"))
        elif finding.rule == "QA002" and finding.module in modules:
            quant = next(r.quant for r in reversed(run.records[finding.module]) if r.quant)
            error = _stale_forward_error(modules[finding.module], quant)
            finding = replace(finding, evidence=(
                f"confirmed: output with the cached weight differs from a freshly quantized "
                f"weight by {error:.2e} (relative)" if error > 0 else
                "not reproduced: the cached weight equals a fresh quantization"))
        checked.append(finding)
    return rows, checked


def _rounded(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.3g}")
