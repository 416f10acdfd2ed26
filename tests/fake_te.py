"""A stand-in `transformer_engine` package for CPU tests of qaudit's te runtime.

What it is: the public surface qaudit/runtime/te.py touches (module classes, autocast,
model-init context, recipe classes, FP8GlobalStateManager), in two flavours, `new` (TE 2.9+:
`autocast(recipe=)`, `quantized_model_init`, `pytorch.quantization`) and `old` (TE 1.x:
`fp8_autocast(fp8_recipe=)`, `fp8_model_init`, `pytorch.fp8`, DelayedScaling only).

What it is not: Transformer Engine. Its modules are qaudit's reference modules (TE's wgrad
rule as docs/semantics.md states it), they execute in high precision whatever the autocast says,
and they never call `wgrad_listener`, as real TE modules do not. Tests using it check qaudit's
mapping, feature detection and probe plumbing; only tests/test_gpu.py checks TE itself.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import types
from dataclasses import dataclass

from qaudit.runtime import reference


class Format(enum.Enum):
    E2M1 = "e2m1"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"


class Recipe:
    pass


@dataclass
class DelayedScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"


@dataclass
class Float8CurrentScaling(Recipe):
    fp8_format: Format = Format.HYBRID


@dataclass
class MXFP8BlockScaling(Recipe):
    fp8_format: Format = Format.E4M3


@dataclass
class Float8BlockScaling(Recipe):
    fp8_format: Format = Format.E4M3


@dataclass
class NVFP4BlockScaling(Recipe):
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3


class FP8GlobalStateManager:
    enabled = False
    recipe = None
    depth = 0
    resets = 0
    support = {"is_fp8_available": (True, ""), "is_mxfp8_available": (True, ""),
               "is_fp8_block_scaling_available": (True, ""), "is_nvfp4_available": (True, "")}

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return cls.enabled

    @classmethod
    def get_fp8_recipe(cls):
        return cls.recipe

    @classmethod
    def reset(cls) -> None:
        cls.enabled, cls.recipe, cls.depth = False, None, 0
        cls.resets += 1

    @classmethod
    def is_fp8_available(cls):
        return cls.support["is_fp8_available"]

    @classmethod
    def is_mxfp8_available(cls):
        return cls.support["is_mxfp8_available"]

    @classmethod
    def is_fp8_block_scaling_available(cls):
        return cls.support["is_fp8_block_scaling_available"]

    @classmethod
    def is_nvfp4_available(cls):
        return cls.support["is_nvfp4_available"]


@contextlib.contextmanager
def _enter(enabled: bool, recipe):
    state = FP8GlobalStateManager
    saved = (state.enabled, state.recipe)
    state.enabled, state.recipe = enabled, recipe if recipe is not None else DelayedScaling()
    state.depth += 1
    try:
        yield
    finally:
        state.depth -= 1
        state.enabled, state.recipe = saved


class _Quiet:
    """Real TE never calls qaudit's listener: hide it from the reference machinery."""

    def _gemm(self, x, m_splits, is_first_microbatch):
        listener = self.__dict__.pop("wgrad_listener", None)
        try:
            return super()._gemm(x, m_splits, is_first_microbatch)
        finally:
            if listener is not None:
                self.wgrad_listener = listener


CONSTRUCTED: list[dict] = []
SEEN_SPLITS: list[list[int]] = []


def _finish(module, kwargs):
    CONSTRUCTED.append({"class": type(module).__mro__[1].__name__, **kwargs,
                        "init_depth": MODEL_INIT_DEPTH[0]})
    for name, param in module.named_parameters():
        if name.startswith("weight") and kwargs.get("init_method") is not None:
            kwargs["init_method"](param.data)
    return module.to(device=kwargs.get("device", "cpu"), dtype=kwargs.get("params_dtype"))


class Linear(_Quiet, reference.Linear):
    def __init__(self, in_features, out_features, sequence_parallel=False,
                 fuse_wgrad_accumulation=False, **kwargs):
        super().__init__(in_features, out_features, fuse_wgrad_accumulation=fuse_wgrad_accumulation)
        _finish(self, {"fuse_wgrad_accumulation": fuse_wgrad_accumulation, **kwargs})


class LayerNormLinear(_Quiet, reference.LayerNormLinear):
    def __init__(self, in_features, out_features, eps=1e-5, sequence_parallel=False,
                 fuse_wgrad_accumulation=False, **kwargs):
        super().__init__(in_features, out_features, fuse_wgrad_accumulation=fuse_wgrad_accumulation)
        _finish(self, {"fuse_wgrad_accumulation": fuse_wgrad_accumulation, **kwargs})


class GroupedLinear(_Quiet, reference.GroupedLinear):
    def __init__(self, num_gemms, in_features, out_features, sequence_parallel=False,
                 fuse_wgrad_accumulation=False, **kwargs):
        super().__init__(num_gemms, in_features, out_features,
                         fuse_wgrad_accumulation=fuse_wgrad_accumulation)
        _finish(self, {"fuse_wgrad_accumulation": fuse_wgrad_accumulation, **kwargs})

    def forward(self, inp, m_splits, is_first_microbatch=None):
        SEEN_SPLITS.append(list(m_splits))
        return super().forward(inp, m_splits, is_first_microbatch)


MODEL_INIT_DEPTH = [0]
AUTOCAST_CALLS: list[tuple[str, dict]] = []


def _model_init(name):
    @contextlib.contextmanager
    def init(enabled=True, **kwargs):
        MODEL_INIT_DEPTH[0] += 1
        AUTOCAST_CALLS.append((name, {"enabled": enabled, **kwargs}))
        try:
            yield
        finally:
            MODEL_INIT_DEPTH[0] -= 1
    return init


def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
    AUTOCAST_CALLS.append(("autocast", {"enabled": enabled, "recipe": recipe}))
    return _enter(enabled, recipe)


def fp8_autocast(enabled=True, calibrating=False, fp8_recipe=None, fp8_group=None, _graph=False):
    AUTOCAST_CALLS.append(("fp8_autocast", {"enabled": enabled, "recipe": fp8_recipe}))
    return _enter(enabled, fp8_recipe)


def get_align_size_for_quantization(recipe) -> int:
    return 32 if isinstance(recipe, MXFP8BlockScaling) else 128 if isinstance(recipe, NVFP4BlockScaling) else 16


def install(monkeypatch, flavour: str = "new", version: str = "2.18.0") -> None:
    """Put the fake package into sys.modules (undone by monkeypatch)."""
    FP8GlobalStateManager.reset()
    FP8GlobalStateManager.resets = 0
    FP8GlobalStateManager.support = dict(FP8GlobalStateManager.support)
    for key in FP8GlobalStateManager.support:
        FP8GlobalStateManager.support[key] = (True, "")
    CONSTRUCTED.clear()
    SEEN_SPLITS.clear()
    AUTOCAST_CALLS.clear()
    root = types.ModuleType("transformer_engine")
    root.__version__ = version
    root.__path__ = []
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.__path__ = []
    pytorch.Linear, pytorch.LayerNormLinear, pytorch.GroupedLinear = Linear, LayerNormLinear, GroupedLinear
    common = types.ModuleType("transformer_engine.common")
    common.__path__ = []
    recipe = types.ModuleType("transformer_engine.common.recipe")
    recipe.Format, recipe.Recipe, recipe.DelayedScaling = Format, Recipe, DelayedScaling
    state = types.ModuleType("transformer_engine.pytorch.quantization" if flavour == "new"
                             else "transformer_engine.pytorch.fp8")
    state.FP8GlobalStateManager = FP8GlobalStateManager
    pytorch.fp8_autocast = fp8_autocast
    if flavour == "new":
        pytorch.autocast = autocast
        pytorch.quantized_model_init = _model_init("quantized_model_init")
        pytorch.fp8_model_init = _model_init("fp8_model_init")
        for cls in (Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling):
            setattr(recipe, cls.__name__, cls)
        state.get_align_size_for_quantization = get_align_size_for_quantization
    else:
        pytorch.fp8_model_init = _model_init("fp8_model_init")
    modules = {"transformer_engine": root, "transformer_engine.pytorch": pytorch,
               "transformer_engine.common": common, "transformer_engine.common.recipe": recipe,
               state.__name__: state}
    for name in [n for n in sys.modules if n == "transformer_engine" or n.startswith("transformer_engine.")]:
        monkeypatch.delitem(sys.modules, name)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
