"""How the calls of TE's own modules are recorded on the cross-check's `te-cpu` side (which
side a machine gives is decided by the room, qaudit/runtime/standin/side.py).

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
import inspect
from typing import Any, Iterator

import torch

from qaudit.crosscheck.probe import CallProbe


def _te_classes() -> tuple[type, ...]:
    pytorch = importlib.import_module("transformer_engine.pytorch")
    return tuple(getattr(pytorch, name) for name in ("Linear", "LayerNormLinear",
                                                     "GroupedLinear") if hasattr(pytorch, name))


def _observed(forward: Any, probe: CallProbe) -> Any:
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
def observing(probe: CallProbe) -> Iterator[None]:
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
