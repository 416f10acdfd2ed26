"""A stand-in `transformer_engine` package for building the user's Megatron on CPU.

Megatron's TE wrappers (`megatron/core/extensions/transformer_engine.py`) subclass TE's
`Linear`, `LayerNormLinear`, `GroupedLinear`, `DotProductAttention`, and open TE's autocast.
This package gives them qaudit's reference runtime instead (TE's weight-cache and wgrad rules
in pure PyTorch, qaudit/runtime/reference.py), with TE's constructor keywords and parameter
names, and records what each call received: the `is_first_microbatch` Megatron passed, grad
mode, the precision it executed in, and each backward's wgrad decision.

It is put into `sys.modules` only by `qaudit.runtime.standin.boot`, only while the
cross-check builds and runs upstream's model, and never when a real TE is importable. The
package objects are made once per process: Megatron's modules keep references to them after
they are imported, so every later build must see the same objects (the recorder is swapped).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import enum
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from qaudit.runtime.standin import gemm as standin_gemm
from qaudit.load.precision import Quant
from qaudit.runtime import reference, te_rules

# The TE release the stand-in claims to be: new enough for every recipe Megatron can select
# and for the keyword arguments its wrappers pass (docs/cross-check.md).
VERSION = "2.14.0"


# The cross-check's CallProbe (qaudit/crosscheck/probe.py) while it runs upstream's model: it
# names the stand-in modules and records their calls (`name_of`, `recorder`).
_probe: Any = None


@contextlib.contextmanager
def probing(probe: Any) -> Iterator[Any]:
    global _probe
    previous, _probe = _probe, probe
    try:
        yield probe
    finally:
        _probe = previous


# --- recipes and autocast ---------------------------------------------------------------


class Format(enum.Enum):
    E2M1 = "e2m1"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    HYBRID = "hybrid"


class Recipe:
    """Base of TE's recipe classes; keyword arguments are kept, as TE's dataclasses do."""

    kind = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.fp8_format = kwargs.pop("fp8_format", Format.HYBRID)
        for key, value in kwargs.items():
            setattr(self, key, value)

    def quant(self) -> Quant:
        fmt = "hybrid" if self.fp8_format == Format.HYBRID else "e4m3"
        return Quant("fp8", self.kind, fmt)

    def delayed(self) -> bool:
        return self.kind == "delayed"


class DelayedScaling(Recipe):
    kind = "delayed"

    def __init__(self, margin: int = 0, fp8_format: Format = Format.HYBRID,
                 amax_history_len: int = 1024, amax_compute_algo: str = "max",
                 override_linear_precision: Any = (False, False, False), **kwargs: Any) -> None:
        super().__init__(fp8_format=fp8_format, margin=margin, amax_history_len=amax_history_len,
                         amax_compute_algo=amax_compute_algo,
                         override_linear_precision=override_linear_precision, **kwargs)


class Float8CurrentScaling(Recipe):
    kind = "tensorwise"


class Float8BlockScaling(Recipe):
    kind = "blockwise"

    def __init__(self, fp8_format: Format = Format.E4M3, **kwargs: Any) -> None:
        super().__init__(fp8_format=fp8_format, **kwargs)


class MXFP8BlockScaling(Recipe):
    kind = "mxfp8"

    def __init__(self, fp8_format: Format = Format.E4M3, **kwargs: Any) -> None:
        super().__init__(fp8_format=fp8_format, **kwargs)


class NVFP4BlockScaling(Recipe):
    kind = "nvfp4"

    def quant(self) -> Quant:
        return Quant("fp4", "nvfp4")


class CustomRecipe(Recipe):
    kind = "custom"


def _quant_of(recipe: Any) -> Quant:
    if isinstance(recipe, Recipe):
        return recipe.quant()
    # A custom factory's object: executed as qaudit's stand-in per-tensor FP8 (QA020).
    return Quant("fp8", "custom")


class FP8GlobalStateManager:
    """The part of TE's global FP8 state Megatron reads: is a quantized autocast open."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return reference.current_quant() is not None

    @staticmethod
    def get_fp8_recipe() -> Any:
        return None

    @staticmethod
    def is_first_fp8_module() -> bool:
        return False

    @staticmethod
    def reset() -> None:
        return None


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Any = None,
                 fp8_group: Any = None, _graph: bool = False) -> Iterator[None]:
    quant = _quant_of(fp8_recipe if fp8_recipe is not None else DelayedScaling()) if enabled else None
    with reference.autocast(quant):
        yield


@contextlib.contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Any = None,
             amax_reduction_group: Any = None, _graph: bool = False) -> Iterator[None]:
    with fp8_autocast(enabled, calibrating, recipe, amax_reduction_group, _graph):
        yield


# Whether modules built now get primary quantized weights (the innermost fp8_model_init).
_quantized_init: list[bool] = [False]


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, recipe: Any = None,
                   preserve_high_precision_init_val: bool = False) -> Iterator[None]:
    # Parameters stay high precision (quantized storage is not modelled); the modules built
    # inside only know their weight is primary, which decides their weight-cache use.
    _quantized_init.append(bool(enabled))
    try:
        yield
    finally:
        _quantized_init.pop()


quantized_model_init = fp8_model_init


# --- modules --------------------------------------------------------------------------


def _init(weight: torch.Tensor, init_method: Callable | None) -> None:
    with torch.no_grad():
        if init_method is not None:
            init_method(weight)
        else:
            torch.nn.init.normal_(weight, std=0.02)


class _Recorded(reference._ReferenceModule):
    """A reference module whose calls are recorded under the module's upstream name."""

    def __init__(self, fuse_wgrad_accumulation: bool, params_dtype: torch.dtype | None) -> None:
        super().__init__(fuse_wgrad_accumulation)
        self._dtype = params_dtype or torch.float32
        # TE 2.6+: keep the high-precision input for backward; no effect on what is audited.
        self.save_original_input = False
        self.primary_quantized_weight = _quantized_init[-1]

    def _recorded_gemm(self, x: torch.Tensor, m_splits: Any,
                       is_first_microbatch: bool | None) -> torch.Tensor:
        probe = _probe
        name = probe.name_of(self) if probe is not None else None
        listener = None
        if name is not None:  # None: not an audited module, or called outside the run
            record = probe.recorder.on_forward(
                name, is_first_microbatch, torch.is_grad_enabled(), reference.current_quant(),
                self.training, cache=te_rules.weight_cache_use(is_first_microbatch,
                                                               self.primary_quantized_weight))
            listener = probe.recorder.listener_for(record)
        # TE's wgrad rule, read at forward as TE does (qaudit/runtime/reference.py). The GEMM
        # computes no values: the cross-check compares which precision each call is in, what
        # it was passed and what its backward does, never a tensor's value, so products and
        # fake quantization would only add time (a third of DeepSeek-V3's build and run).
        meta = {"quant": None, "numerics": False,
                "m_splits": list(m_splits) if m_splits is not None else None,
                "compute_weight": self.weight.detach(),
                "plan": te_rules.wgrad_plan(
                    self.fuse_wgrad_accumulation, is_first_microbatch,
                    bool(getattr(self.weight, "overwrite_main_grad", False))),
                "listener": listener}
        return reference.gemm(x, self.weight, meta)

    def _bias_out(self, out: torch.Tensor, bias: torch.Tensor | None,
                  return_bias: bool) -> Any:
        if return_bias:
            return out, bias
        return out if bias is None else out + bias


class Linear(_Recorded):
    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Any = None, rng_tracker_name: Any = None,
                 init_method: Callable | None = None, bias: bool = True,
                 return_bias: bool = False, params_dtype: torch.dtype | None = None,
                 parallel_mode: str | None = None, device: Any = "cpu", **_te_only: Any) -> None:
        super().__init__(fuse_wgrad_accumulation, params_dtype)
        self.in_features, self.out_features = in_features, out_features
        self.parallel_mode, self.return_bias, self.use_bias = parallel_mode, return_bias, bias
        # TE keeps these, and Megatron reads them back (TELMHeadColumnParallelLinear divides
        # its output size by `self.tp_size`).
        self.tp_size, self.tp_group, self.sequence_parallel = tp_size, tp_group, sequence_parallel
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=self._dtype))
        _init(self.weight, init_method)
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=self._dtype)) if bias else None

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None,
                **_te_only: Any) -> Any:
        out = self._recorded_gemm(inp, None, is_first_microbatch)
        return self._bias_out(out, self.bias, self.return_bias)

    def backward_dw(self) -> None:
        return None


class LayerNormLinear(Linear):
    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5,
                 normalization: str = "LayerNorm", zero_centered_gamma: bool = False,
                 return_layernorm_output: bool = False, **kwargs: Any) -> None:
        super().__init__(in_features, out_features, **kwargs)
        self.eps, self.normalization = eps, normalization
        self.zero_centered_gamma = zero_centered_gamma
        self.return_layernorm_output = return_layernorm_output
        self.layer_norm_weight = torch.nn.Parameter(
            torch.full((in_features,), 0.0 if zero_centered_gamma else 1.0, dtype=self._dtype))
        self.layer_norm_bias = (torch.nn.Parameter(torch.zeros(in_features, dtype=self._dtype))
                                if normalization == "LayerNorm" else None)

    def forward(self, inp: torch.Tensor, is_first_microbatch: bool | None = None,
                **_te_only: Any) -> Any:
        gamma = self.layer_norm_weight + 1 if self.zero_centered_gamma else self.layer_norm_weight
        if self.normalization == "RMSNorm":
            normed = F.rms_norm(inp, (self.in_features,), gamma, self.eps)
        else:
            normed = F.layer_norm(inp, (self.in_features,), gamma, self.layer_norm_bias, self.eps)
        out = self._recorded_gemm(normed, None, is_first_microbatch)
        result = self._bias_out(out, self.bias, self.return_bias)
        if self.return_layernorm_output:
            return (*result, normed) if isinstance(result, tuple) else (result, normed)
        return result


class GroupedLinear(_Recorded):
    """One stacked weight [experts, out, in] (TE 2.14's `single_grouped_weight` layout): the
    per-expert rules hold per slice, and a 256-expert layer stays one parameter."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int,
                 sequence_parallel: bool = False, fuse_wgrad_accumulation: bool = False,
                 tp_group: Any = None, tp_size: int = 1, get_rng_state_tracker: Any = None,
                 rng_tracker_name: Any = None, init_method: Callable | None = None,
                 bias: bool = True, return_bias: bool = False,
                 params_dtype: torch.dtype | None = None, parallel_mode: str | None = None,
                 device: Any = "cpu", **_te_only: Any) -> None:
        super().__init__(fuse_wgrad_accumulation, params_dtype)
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.parallel_mode, self.return_bias, self.use_bias = parallel_mode, return_bias, bias
        self.tp_size, self.tp_group, self.sequence_parallel = tp_size, tp_group, sequence_parallel
        self.single_grouped_weight = self.single_grouped_bias = True
        self.weight = torch.nn.Parameter(
            torch.empty(num_gemms, out_features, in_features, dtype=self._dtype))
        # Megatron's init method on one expert only, so that the draws after it (the router
        # is Megatron's own) are what they were. The other slices are left unwritten: this
        # stand-in's GEMMs read a weight's shape, never its values, and the cross-check's
        # loop updates no weight on it (upstream_build.run_training); writing 15,000 experts
        # cost 0.6 s of DeepSeek-V3's build.
        _init(self.weight.data[0], init_method)
        self.bias = (torch.nn.Parameter(torch.zeros(num_gemms, out_features, dtype=self._dtype))
                     if bias else None)

    def forward(self, inp: torch.Tensor, m_splits: Any, is_first_microbatch: bool | None = None,
                **_te_only: Any) -> Any:
        m_splits = [int(m) for m in (m_splits.tolist() if torch.is_tensor(m_splits) else m_splits)]
        out = self._recorded_gemm(inp, m_splits, is_first_microbatch)
        bias = None
        if self.bias is not None:
            rows = torch.repeat_interleave(torch.arange(self.num_gemms), torch.tensor(m_splits))
            bias = self.bias[rows]
        return self._bias_out(out, bias, self.return_bias)

    def backward_dw(self) -> None:
        return None


class _Norm(torch.nn.Module):
    def __init__(self, normalized_shape: int | None = None, eps: float = 1e-5,
                 sequence_parallel: bool = False, params_dtype: torch.dtype | None = None,
                 zero_centered_gamma: bool = False, device: Any = "cpu", with_bias: bool = True,
                 hidden_size: int | None = None, **_te_only: Any) -> None:
        super().__init__()
        dtype = params_dtype or torch.float32
        # TE takes normalized_shape, and still hidden_size (its older name, which ModelOpt's
        # norm passes).
        hidden_size = normalized_shape if normalized_shape is not None else hidden_size
        self.hidden_size, self.eps, self.zero_centered_gamma = hidden_size, eps, zero_centered_gamma
        self.weight = torch.nn.Parameter(
            torch.full((hidden_size,), 0.0 if zero_centered_gamma else 1.0, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype)) if with_bias else None

    def _gamma(self) -> torch.Tensor:
        return self.weight + 1 if self.zero_centered_gamma else self.weight


class LayerNorm(_Norm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden_size,), self._gamma(), self.bias, self.eps)


class RMSNorm(_Norm):
    def __init__(self, normalized_shape: int | None = None, **kwargs: Any) -> None:
        super().__init__(normalized_shape, with_bias=False, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.hidden_size,), self._gamma(), self.eps)


class DotProductAttention(torch.nn.Module):
    """Softmax attention in TE's `sbhd` layout (grouped-query heads repeated), no dropout."""

    def __init__(self, num_attention_heads: int, kv_channels: Any, num_gqa_groups: int | None = None,
                 attention_dropout: float = 0.0, attn_mask_type: str = "causal",
                 softmax_scale: float | None = None, **_te_only: Any) -> None:
        super().__init__()
        self.heads = num_attention_heads
        self.attn_mask_type, self.softmax_scale = attn_mask_type, softmax_scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Any = None, attn_mask_type: str | None = None,
                **_te_only: Any) -> torch.Tensor:
        causal = "causal" in (attn_mask_type or self.attn_mask_type)
        s, b = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if k.shape[1] != q.shape[1]:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=self.softmax_scale)
        return ctx.permute(2, 0, 1, 3).reshape(s, b, -1)


class Fp8Padding(torch.nn.Module):
    """TE pads each expert's rows to the quantized GEMM's alignment with zero rows; the
    stand-in's GEMMs need no alignment, so rows pass unchanged (zero rows change no call,
    flag or wgrad decision)."""

    def __init__(self, num_gemms: int, align_size: int | None = None) -> None:
        super().__init__()
        self.num_gemms = num_gemms

    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, list[int]]:
        return inp, list(m_splits)


class Fp8Unpadding(Fp8Padding):
    def forward(self, inp: torch.Tensor, m_splits: list[int]) -> torch.Tensor:  # type: ignore[override]
        return inp


class CudaRNGStatesTracker:
    """TE's RNG tracker: named states; forking runs under the default generator on CPU."""

    def __init__(self) -> None:
        self.states: dict[str, Any] = {}

    def reset(self) -> None:
        self.states = {}

    def get_states(self) -> dict[str, Any]:
        return dict(self.states)

    def set_states(self, states: dict[str, Any]) -> None:
        self.states = dict(states)

    def add(self, name: str, seed: int) -> None:
        self.states[name] = seed

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        yield


def checkpoint(function: Callable, *args: Any, distribute_saved_activations: bool = False,
               get_rng_state_tracker: Any = None, tp_group: Any = None,
               use_reentrant: bool = True, **kwargs: Any) -> Any:
    """TE's activation checkpoint (`distributed.checkpoint`): a no-grad forward now, and in
    backward a grad-producing recompute under the autocast that was in force at the forward
    (TE saves and restores it). Torch's reentrant checkpoint does the rest, with two
    adjustments: it takes positional inputs only, so keyword arguments (Megatron passes
    `padding_mask=`) are bound to the function; and a parameter the function returns as is
    (a TE module's bias with return_bias) is handed back outside the checkpoint, since
    returning it from the checkpoint's autograd Function would make that Function the
    parameter's grad_fn, and the recompute's backward would then re-enter it without end."""
    import torch.utils.checkpoint as torch_checkpoint

    quant = reference.current_quant()
    passed_through: dict[int, torch.Tensor] = {}

    def run(*inputs: Any) -> Any:
        with reference.autocast(quant):
            out = function(*inputs, **kwargs)
        items = out if isinstance(out, tuple) else (out,)
        kept = []
        for index, item in enumerate(items):
            if isinstance(item, torch.Tensor) and item.is_leaf and item.requires_grad:
                passed_through[index] = item
                item = None
            kept.append(item)
        return tuple(kept) if isinstance(out, tuple) else kept[0]

    result = torch_checkpoint.checkpoint(run, *args, use_reentrant=True)
    if not passed_through:
        return result
    if not isinstance(result, tuple):
        return passed_through[0]
    return tuple(passed_through.get(index, item) for index, item in enumerate(result))


@contextlib.contextmanager
def activation_recompute_forward(activation_recompute: bool = False,
                                 recompute_phase: bool = False) -> Iterator[None]:
    yield


def get_cpu_offload_context(enabled: bool = False, *args: Any, **kwargs: Any):
    return contextlib.nullcontext(), (lambda tensor: tensor)


def get_dummy_wgrad(shape: list[int], dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


class NotOnCPU(RuntimeError):
    """A TE kernel the stand-in does not provide was called: the feature that called it runs
    on a GPU only, so the cross-check covers its construction only."""


def _cuda_kernel(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotOnCPU(f"{name} (a CUDA kernel)")
    kernel.__name__ = name
    return kernel


class QuantizedTensor(torch.Tensor):
    """Never instantiated: parameters stay high precision (isinstance checks say no)."""


# --- the package ---------------------------------------------------------------------


@dataclass
class StandIn:
    modules: dict[str, types.ModuleType]


_PACKAGE: StandIn | None = None


def package() -> StandIn:
    """The stand-in's module objects, made once per process (see the module docstring)."""
    global _PACKAGE
    if _PACKAGE is None:
        _PACKAGE = StandIn(_make_modules())
    return _PACKAGE


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name, "qaudit's stand-in for Transformer Engine (CPU cross-check)")
    module.__dict__.update(attrs)
    module.__qaudit_standin__ = True
    # importlib.util.find_spec(name) reads it (transformers does, for optional packages).
    module.__spec__ = importlib.machinery.ModuleSpec(name, None,
                                                     is_package=hasattr(module, "__path__"))
    return module


def _make_modules() -> dict[str, types.ModuleType]:
    recipe = _module("transformer_engine.common.recipe", Format=Format, Recipe=Recipe,
                     DelayedScaling=DelayedScaling, Float8CurrentScaling=Float8CurrentScaling,
                     Float8BlockScaling=Float8BlockScaling, MXFP8BlockScaling=MXFP8BlockScaling,
                     NVFP4BlockScaling=NVFP4BlockScaling, CustomRecipe=CustomRecipe)
    common = _module("transformer_engine.common", recipe=recipe)
    fp8 = _module("transformer_engine.pytorch.fp8", FP8GlobalStateManager=FP8GlobalStateManager,
                  fp8_autocast=fp8_autocast, fp8_model_init=fp8_model_init)
    distributed = _module("transformer_engine.pytorch.distributed",
                          CudaRNGStatesTracker=CudaRNGStatesTracker, checkpoint=checkpoint,
                          activation_recompute_forward=activation_recompute_forward)
    cpu_offload = _module("transformer_engine.pytorch.cpu_offload",
                          get_cpu_offload_context=get_cpu_offload_context)
    base = _module("transformer_engine.pytorch.module.base", get_dummy_wgrad=get_dummy_wgrad)
    module_pkg = _module("transformer_engine.pytorch.module", base=base, Linear=Linear,
                         LayerNormLinear=LayerNormLinear, GroupedLinear=GroupedLinear)
    tensor = _module("transformer_engine.pytorch.tensor", QuantizedTensor=QuantizedTensor)
    cpp_extensions = _module("transformer_engine.pytorch.cpp_extensions",
                             general_gemm=standin_gemm.general_gemm)
    router = _module("transformer_engine.pytorch.router", **{
        name: _cuda_kernel(name) for name in (
            "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss",
            "fused_topk_with_score_function")})
    kernels = {  # fused kernels: present (TransformerConfig checks), never run (docs/cross-check.md)
        "transformer_engine.pytorch.permutation": (
            "moe_permute", "moe_permute_with_probs", "moe_sort_chunks_by_index",
            "moe_sort_chunks_by_index_with_probs", "moe_unpermute",
            "moe_permute_and_pad_with_probs"),
        "transformer_engine.pytorch.attention.rope": ("apply_rotary_pos_emb",),
        "transformer_engine.pytorch.cross_entropy": ("parallel_cross_entropy",),
    }
    extra = {name: _module(name, **{k: _cuda_kernel(k) for k in names})
             for name, names in kernels.items()}
    attention = _module("transformer_engine.pytorch.attention",
                        rope=extra["transformer_engine.pytorch.attention.rope"])
    pytorch = _module(
        "transformer_engine.pytorch", Linear=Linear, LayerNormLinear=LayerNormLinear,
        GroupedLinear=GroupedLinear, LayerNorm=LayerNorm, RMSNorm=RMSNorm,
        DotProductAttention=DotProductAttention, Fp8Padding=Fp8Padding,
        Fp8Unpadding=Fp8Unpadding, fp8=fp8, fp8_autocast=fp8_autocast,
        fp8_model_init=fp8_model_init, autocast=autocast, quantized_model_init=quantized_model_init,
        distributed=distributed, cpu_offload=cpu_offload, module=module_pkg, tensor=tensor,
        router=router, attention=attention, cpp_extensions=cpp_extensions,
        permutation=extra["transformer_engine.pytorch.permutation"],
        cross_entropy=extra["transformer_engine.pytorch.cross_entropy"],
        FP8GlobalStateManager=FP8GlobalStateManager, __version__=VERSION)
    top = _module("transformer_engine", pytorch=pytorch, common=common, __version__=VERSION)
    modules = {m.__name__: m for m in (top, common, recipe, pytorch, fp8, distributed,
                                       cpu_offload, module_pkg, base, tensor,
                                       cpp_extensions, router,
                                       attention, *extra.values())}
    for name, module in modules.items():
        # Packages need a __path__ for `from transformer_engine.pytorch.x import y` to look
        # up submodules; nothing is ever found on disk there.
        if any(other.startswith(name + ".") for other in modules):
            module.__path__ = []
            module.__spec__.submodule_search_locations = []
    return modules


def is_standin(module: Any) -> bool:
    return bool(getattr(module, "__qaudit_standin__", False))


def installed_standin() -> bool:
    return is_standin(sys.modules.get("transformer_engine"))
