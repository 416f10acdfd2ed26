"""Which Transformer Engine the cross-check's upstream side runs Megatron on, and how the
calls of TE's own modules are recorded there.

Three sides (`TESide`), decided once in the audit process, before the worker forks:
- `standin`: no TE importable; qaudit's stand-in package (standin_te.py) is Megatron's TE.
- `te-cpu`: TE's Python is importable, no CUDA device is visible, and qaudit's CPU kernel
  stand-in serves that release (qaudit/runtime/standin): Megatron's TE wrappers subclass TE's
  own modules, which run on the kernel stand-in. Calls are recorded by `observing`.
- `real`: TE and a CUDA device: compared as built (calls are not recorded there yet).

On `te-cpu`, the recorder is fed from TE's own base-class `forward`s (patched for the run
only), i.e. at the `super().forward(x, is_first_microbatch=...)` call inside Megatron's
wrappers: what TE received, not what Megatron's wrapper was called with. Each backward's wgrad
decision is the `accumulate` flag of the GEMM that writes the weight's `main_grad`, reported
by the kernel stand-in (the te runtime's `_observe_wgrad_gemm`, qaudit/runtime/te.py); each
call's weight-cache use is read from the weight casts TE's forward ran (`_WeightCasts`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from qaudit.runtime.standin import te_package as standin_te


@dataclass(frozen=True)
class TESide:
    kind: str  # "standin" | "te-cpu" | "real"
    version: str | None = None  # TE's version for te-cpu and real
    refusal: str = ""  # te-cpu impossible here although TE is installed: why (one line)

    def describe(self) -> str:
        """The report's words for the TE Megatron ran on."""
        if self.kind == "te-cpu":
            return (f"Transformer Engine {self.version} Python on CPU (kernels: "
                    "qaudit CPU stand-in)")
        if self.kind == "real":
            return f"Transformer Engine {self.version or '(version unknown)'} on CUDA"
        return f"qaudit's stand-in transformer_engine (claims TE {standin_te.VERSION})"


def real_te_available() -> bool:
    """A real Transformer Engine is installed (checked without importing it)."""
    if standin_te.installed_standin():
        return False
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def decide() -> TESide:
    """Which TE side this machine gives, without importing TE (the audit process must stay
    free of the pose until its own runtime chooses)."""
    from qaudit.runtime.standin import te_python as te_cpu
    from qaudit.runtime.standin import host

    if not real_te_available():
        return TESide("standin")
    version = te_cpu.te_version()
    if host.real_cuda_available():
        return TESide("real", version)
    reason = te_cpu.unsupported_reason(version)
    if reason:
        return TESide("te-cpu", version, refusal=reason)
    return TESide("te-cpu", version)


def _te_classes() -> tuple[type, ...]:
    pytorch = importlib.import_module("transformer_engine.pytorch")
    return tuple(getattr(pytorch, name) for name in ("Linear", "LayerNormLinear",
                                                     "GroupedLinear") if hasattr(pytorch, name))


def _observed(forward: Any, probe: standin_te.CallProbe) -> Any:
    from qaudit.run.observe import executed_quant, flag_of
    from qaudit.runtime.te import _observe_wgrad_gemm, _WeightCasts
    from qaudit.runtime.standin import kernels

    signature = inspect.signature(forward)

    def observed_forward(self, *args: Any, **kwargs: Any) -> Any:
        name = probe.name_of(self)
        # A subclass of a TE class below this one (GroupedLinear is no Linear, but a user's
        # class may be): only the outermost TE base records.
        if name is None or getattr(self, "_qaudit_in_te_forward", False):
            return forward(self, *args, **kwargs)
        flag = flag_of(signature, self, args, kwargs)
        grad = torch.is_grad_enabled()
        self._qaudit_in_te_forward = True
        casts = _WeightCasts(self, kernels)
        try:
            out = forward(self, *args, **kwargs)
        finally:
            self._qaudit_in_te_forward = False
            cache = casts.finish()
        record = probe.recorder.on_forward(name, flag, grad, executed_quant(self),
                                           self.training, cache=cache)
        listener = probe.recorder.listener_for(record)
        # TE returns (out, bias[, ln_out]) with return_bias or return_layernorm_output: the
        # GEMM output is first; the probe rides on its backward.
        if isinstance(out, tuple):
            return (_observe_wgrad_gemm(out[0], listener, self, kernels), *out[1:])
        return _observe_wgrad_gemm(out, listener, self, kernels)

    observed_forward.__wrapped__ = forward
    return observed_forward


@contextlib.contextmanager
def observing(probe: standin_te.CallProbe) -> Iterator[None]:
    """Record every call of a named TE module while the block runs (te-cpu side only)."""
    patched = []
    for base in _te_classes():
        forward = base.__dict__["forward"]
        base.forward = _observed(forward, probe)
        patched.append((base, forward, "forward"))
    # Megatron's own linears write a Megatron-FSDP parameter's main_grad through TE's
    # general_gemm (te_general_gemm, core/tensor_parallel/layers.py): TE's GEMM runs, and
    # where it wrote and whether it added is recorded as on the stand-in side.
    extension = importlib.import_module("megatron.core.extensions.transformer_engine")
    gemm = getattr(extension, "general_gemm", None)
    if gemm is not None:
        extension.general_gemm = _recorded_gemm(gemm)
        patched.append((extension, gemm, "general_gemm"))
    try:
        yield
    finally:
        for owner, original, name in patched:
            setattr(owner, name, original)


def _recorded_gemm(gemm: Any) -> Any:
    from qaudit.runtime.standin.gemm import record_write

    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = gemm(*args, **kwargs)
        record_write(kwargs.get("out"), bool(kwargs.get("accumulate", False)))
        return result

    return recorded
