"""The `te` runtime: real Transformer Engine modules and recipes on CUDA (docs/design.md).

Thin on purpose. It builds `transformer_engine.pytorch` `Linear`, `LayerNormLinear` and
`GroupedLinear` with `fuse_wgrad_accumulation`, maps qaudit's `Quant` to TE's own recipe
objects, enters and reads TE's own autocast state, and reports wgrad decisions through the
shared probe (qaudit/runtime/wgrad.py). Flags, policies, recipes per module and rules are the
shared code above the runtime seam.

TE APIs used, found by feature detection (never by parsing a version string), checked against
TE's source at tags v1.9 ... v2.18 and main (2.20.0.dev0, August 2026):
- modules: `Linear`, `LayerNormLinear` (since 1.0) and `GroupedLinear` (since 1.9) with
  `fuse_wgrad_accumulation`, `bias`, `params_dtype`, `device`, `init_method`;
  forward(inp[, m_splits], is_first_microbatch).
- autocast: `te.pytorch.autocast(enabled, recipe=...)` (2.9+), else
  `te.pytorch.fp8_autocast(enabled, fp8_recipe=...)` (all releases; deprecated in 2.9+).
- parameter init: `quantized_model_init(enabled=False)` (2.9+), else
  `fp8_model_init(enabled=False)`: weights stay high precision (qaudit does not model
  `fp8_param`), even inside a caller's quantized-init context.
- state: `FP8GlobalStateManager` from `transformer_engine.pytorch.quantization` (2.9+) or
  `transformer_engine.pytorch.fp8` (before): `is_fp8_enabled()`, `get_fp8_recipe()`, the
  `is_*_available()` checks its autocast asserts on, and `reset()`.
- recipes (`transformer_engine.common.recipe`): `DelayedScaling` (1.0+), `MXFP8BlockScaling`
  (2.0+), `Float8CurrentScaling` (2.2+), `Float8BlockScaling` (2.3+), `NVFP4BlockScaling`
  (2.8+), `Format.E4M3` / `Format.HYBRID`.

Parameters are float32 (`PARAMS_DTYPE`): the rest of the audited model (embedding, norms,
attention, loss) and the reference runtime run in float32, `main_grad` is float32 as in
Megatron, and `--verify` compares with float64 at a 1e-2 threshold that bf16 rounding of a
whole gradient can come close to. Quantized GEMMs still execute in FP8/FP4 kernels; what this
choice leaves untested is TE's BF16 (high-precision) GEMM path, which decides nothing audited.

A recipe the GPU cannot execute raises `EnvironmentProblem` (exit 3) when it is first entered,
naming the recipe, what it needs and TE's own reason. Not a per-module row: TE refuses to run
the module at all, so nothing about it (or anything after it in the forward) can be observed,
and executing it in another recipe would report a precision it does not have.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from qaudit.runtime import reference
from qaudit.errors import EnvironmentProblem
from qaudit.load.precision import Quant
from qaudit.runtime.te_infer import ClassInference, Replayed
from qaudit.runtime.wgrad import (BeforeBackward, WgradRule, documented_rule,
                                  measure_wgrad_rule, observe_wgrad, rule_differences)

PARAMS_DTYPE = torch.float32
_POSED = "10.0"
MODULE_KINDS = ("linear", "layernorm_linear", "grouped_linear")


@dataclass(frozen=True)
class RecipeSpec:
    te_class: str  # in transformer_engine.common.recipe
    since: str  # first TE release with that class (TE's git tags)
    check: str  # FP8GlobalStateManager method TE's autocast asserts on for it
    needs: str  # what the GPU needs, per TE's checks


RECIPES: dict[str, RecipeSpec] = {
    "delayed": RecipeSpec("DelayedScaling", "1.0", "is_fp8_available",
                          "compute capability 8.9+ (Ada also CUDA 12.1+)"),
    "tensorwise": RecipeSpec("Float8CurrentScaling", "2.2", "is_fp8_available",
                             "compute capability 8.9+ (Ada also CUDA 12.1+)"),
    "blockwise": RecipeSpec("Float8BlockScaling", "2.3", "is_fp8_block_scaling_available",
                            "compute capability 9.0+ and CUDA 12.9+"),
    "mxfp8": RecipeSpec("MXFP8BlockScaling", "2.0", "is_mxfp8_available",
                        "compute capability 10.0+ (recent TE: not 12.x yet)"),
    "nvfp4": RecipeSpec("NVFP4BlockScaling", "2.8", "is_nvfp4_available",
                        "compute capability 10.0+"),
}
# Rows per GEMM (per split for GroupedLinear) that quantized kernels need, when TE has no
# get_align_size_for_quantization (added in 2.12); the values are that function's.
_FALLBACK_ALIGN = {"mxfp8": 32, "nvfp4": 128}
_DEFAULT_ALIGN = 16
# Megatron TransformerConfig defaults for DelayedScaling (fp8_margin, fp8_amax_history_len,
# fp8_amax_compute_algo), as megatron/core/fp8_utils.py passes them.
_DELAYED_KWARGS = {"margin": 0, "amax_history_len": 1, "amax_compute_algo": "most_recent"}


def _import_first(*names: str):
    """The first of `names` that exists; import errors other than its absence propagate."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    raise ModuleNotFoundError(f"none of {', '.join(names)}", name=names[-1])


def _accepts(fn: Any, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class TEApi:
    """What this Transformer Engine offers, by feature detection."""

    def __init__(self, pytorch: Any, recipe: Any, quantization: Any, version: str) -> None:
        self.pytorch = pytorch
        self.recipe = recipe
        self.quantization = quantization  # the module holding FP8GlobalStateManager
        self.state = quantization.FP8GlobalStateManager
        self.version = version
        new_autocast = getattr(pytorch, "autocast", None)
        if new_autocast is not None and _accepts(new_autocast, "recipe"):
            self.autocast_api = "autocast"
            self._autocast = lambda enabled, recipe: new_autocast(enabled=enabled, recipe=recipe)
        else:
            old_autocast = pytorch.fp8_autocast
            self.autocast_api = "fp8_autocast"
            self._autocast = lambda enabled, recipe: old_autocast(enabled=enabled, fp8_recipe=recipe)
        self.model_init_api = ("quantized_model_init" if hasattr(pytorch, "quantized_model_init")
                               else "fp8_model_init" if hasattr(pytorch, "fp8_model_init") else None)

    @classmethod
    def load(cls) -> TEApi:
        te = importlib.import_module("transformer_engine")
        pytorch = importlib.import_module("transformer_engine.pytorch")
        recipe = importlib.import_module("transformer_engine.common.recipe")
        quantization = _import_first("transformer_engine.pytorch.quantization",
                                     "transformer_engine.pytorch.fp8")
        return cls(pytorch, recipe, quantization, str(getattr(te, "__version__", "?")))

    def autocast(self, enabled: bool, recipe: Any):
        return self._autocast(enabled, recipe)

    def high_precision_init(self):
        if self.model_init_api is None:
            return contextlib.nullcontext()
        return getattr(self.pytorch, self.model_init_api)(enabled=False)

    def recipe_class(self, name: str) -> type | None:
        return getattr(self.recipe, name, None)

    def fp8_format(self, name: str) -> Any:
        return getattr(self.recipe.Format, name.upper())

    def is_enabled(self) -> bool:
        return bool(self.state.is_fp8_enabled())

    def active_recipe(self) -> Any:
        return self.state.get_fp8_recipe()

    def support(self, check: str) -> tuple[bool, str] | None:
        """TE's own answer for this GPU, or None when this TE has no such check."""
        method = getattr(self.state, check, None)
        if method is None:
            return None
        ok, reason = method()
        return bool(ok), str(reason or "")

    def align_size(self, recipe: Any, quant: Quant | None) -> int:
        fn = getattr(self.quantization, "get_align_size_for_quantization", None)
        if fn is not None:
            return int(fn(recipe))
        return _FALLBACK_ALIGN.get(quant.recipe if quant else "", _DEFAULT_ALIGN)

    def reset_if_idle(self) -> None:
        reset = getattr(self.state, "reset", None)
        if reset is not None and not self.is_enabled():
            reset()


def _normal_init(weight: torch.Tensor, std: float) -> None:
    """The reference runtime's weight init, so both runtimes start from alike weights."""
    with torch.no_grad():
        weight.normal_(0.0, std)


def _first_weight(module: torch.nn.Module) -> torch.Tensor:
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) and weight.numel() else module.weight0


def _pad_rows(x: torch.Tensor, splits: Sequence[int] | None, align: int):
    """Zero rows so that every GEMM sees a multiple of `align` rows, as Megatron's Fp8Padding
    does for grouped experts. Zero rows get zero output gradient back, so they add nothing to
    any dgrad or wgrad (a LayerNormLinear turns a zero row into its LayerNorm bias, which can
    only enlarge a current-scaling amax). With the shrunk model's 16 tokens per microbatch this
    pads grouped experts always, and dense GEMMs only for MXFP8 (32) and NVFP4 (128).
    Returns (x, splits, restore) with restore=None when nothing changed."""
    width = x.shape[-1]
    if splits is None:
        rows = x.numel() // width
        pad = -rows % align
        if not pad:
            return x, None, None
        flat = x.reshape(rows, width)
        padded = torch.cat([flat, flat.new_zeros(pad, width)])
        lead = x.shape[:-1]
        return padded, None, lambda out: out[:rows].reshape(*lead, out.shape[-1])
    splits = [int(m) for m in splits]
    padded_splits = [m + (-m % align) for m in splits]
    if padded_splits == splits:
        return x, splits, None
    # Where each real row lands among the padded ones, then one scatter and one gather
    # (not a slice and a zero block per expert: 256 experts made that thousands of ops).
    rows, offset = [], 0
    for m, p in zip(splits, padded_splits):
        rows.extend(range(offset, offset + m))
        offset += p
    index = torch.tensor(rows, dtype=torch.long, device=x.device)
    padded = x.new_zeros(offset, width).index_copy_(0, index, x.reshape(-1, width))
    return padded, padded_splits, lambda out: out.index_select(0, index)


def _run(module: torch.nn.Module, base: Callable, x: torch.Tensor,
         splits: Sequence[int] | None, flag: bool | None) -> torch.Tensor:
    """Forward of one probed TE module: TE's code, or the call inferred from an identical
    module's (qaudit/runtime/te_infer.py) where the runtime infers."""
    runtime: TERuntime = module._qaudit_runtime
    if runtime.inference is None:
        return _run_te(module, base, x, splits, flag)
    # TE sees each expert's rows padded to the recipe's alignment (_pad_rows): the counts it
    # sees are what make experts differ.
    align = runtime.row_alignment() if splits is not None else None
    seen = splits if align is None else [m + (-m % align) for m in splits]
    return runtime.inference.run(module, x, splits, seen, flag, runtime.current_quant(),
                                 lambda: _run_te(module, base, x, splits, flag),
                                 lambda call: _replay(module, base, call))


def _replay(module: torch.nn.Module, base: Callable, call: Replayed) -> None:
    """Make an inferred call again with TE's code, on zeros, as it was made (precision, grad
    mode, training mode, shapes), for the module's own TE state; nothing listens."""
    runtime: TERuntime = module._qaudit_runtime
    x = torch.zeros(call.shape, dtype=call.dtype, device=_first_weight(module).device,
                    requires_grad=call.requires_grad)
    module.train(call.training)
    with runtime.autocast(call.quant), torch.set_grad_enabled(call.grad):
        _run_te(module, base, x, call.splits, call.flag)


def _run_te(module: torch.nn.Module, base: Callable, x: torch.Tensor,
            splits: Sequence[int] | None, flag: bool | None) -> torch.Tensor:
    """Pad rows if quantized, call TE, attach the probe."""
    runtime: TERuntime = module._qaudit_runtime
    align = runtime.row_alignment()
    restore = None
    if align is not None:
        x, splits, restore = _pad_rows(x, splits, align)
    casts = _watch_weight_casts(module) if runtime.kernels is not None else None
    try:
        out = base(x, splits)
    finally:
        if casts is not None:
            module.observed_cache = casts.finish()
    if restore is not None:
        out = restore(out)
    listener = module.wgrad_listener
    if listener is not None:
        if runtime.kernels is not None:
            out = _observe_wgrad_gemm(out, listener, module, runtime.kernels)
        else:
            out = observe_wgrad(out, listener, runtime.decision(module, flag))
    return out


class _WeightCasts:
    """Which casts of a module's weights one forward ran, through the stand-in's cast
    kernel: none is a reuse of TE's cached quantized weight (primary where TE stores the weight
    quantized), a cast into the buffer TE keeps in `_fp8_workspaces` (or that TE keeps
    afterwards) a refresh, any other a fresh cast."""

    def __init__(self, module: torch.nn.Module, kernels: Any) -> None:
        self.module, self.kernels = module, kernels
        self.weights = _weights_of(module)
        self.outputs: list[object] = []
        for weight in self.weights:
            kernels.watch_casts(weight, self.outputs.append)

    def finish(self) -> str | None:
        for weight in self.weights:
            self.kernels.watch_casts(weight, None)
        if not self.outputs:
            if not _is_quantized(self.module):
                return None
            # A weight TE stores quantized (quantized_model_init) has no cache to reuse.
            return "primary" if any(stored_quantized(w) for w in self.weights) else "reuse"
        from qaudit.runtime.standin.storage import buffer_addresses

        cast = set()
        for out in self.outputs:
            cast |= buffer_addresses(out)
        # Any kept workspace holding a buffer that was cast makes it a refresh: stop at the
        # first (a grouped module keeps one workspace per expert).
        for workspace in getattr(self.module, "_fp8_workspaces", {}).values():
            if not cast.isdisjoint(buffer_addresses(workspace)):
                return "refresh"
        return "fresh"


def stored_quantized(weight: torch.Tensor) -> bool:
    """A weight TE stores quantized (its QuantizedTensor subclasses, under fp8_param)."""
    return any(cls.__name__ == "QuantizedTensor" for cls in type(weight).__mro__)


def _is_quantized(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "fp8", False) or getattr(module, "fp8_calibration", False))


def _watch_weight_casts(module: torch.nn.Module) -> _WeightCasts:
    module.observed_cache = None
    return _WeightCasts(module, module._qaudit_runtime.kernels)


def _weights_of(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    # Asked two or three times per forward; a grouped module has one weight per expert.
    # Kept per module with the parameter objects it was computed from (so a module whose
    # parameters are replaced is asked again).
    params = module._parameters
    cached = module.__dict__.get("_qaudit_weights")
    if cached is not None and cached[0] == len(params) and all(
            params.get(name) is p for name, p in cached[1]):
        return [p for _, p in cached[1]]
    named = [(name, p) for name, p in module.named_parameters() if name.startswith("weight")]
    module.__dict__["_qaudit_weights"] = (len(params), named)
    return [p for _, p in named]


def _observe_wgrad_gemm(out: torch.Tensor, listener: Callable[[str], None],
                        module: torch.nn.Module, kernels: Any) -> torch.Tensor:
    if not torch.is_grad_enabled() or not out.requires_grad:
        return out
    fused = bool(module.fuse_wgrad_accumulation)

    def arm() -> None:
        weights = [w for w in _weights_of(module) if w.requires_grad]
        if not weights:
            return  # a frozen weight: TE runs no wgrad GEMM
        if not fused:
            listener("autograd")  # TE returns the wgrad to autograd: no main_grad GEMM
            return
        buffers = [w.main_grad for w in weights if getattr(w, "main_grad", None) is not None]
        if buffers:
            kernels.expect_write(buffers, lambda accumulate: listener(
                "accumulate" if accumulate else "overwrite"))

    # Runs just before the module's own backward: the next GEMM writing one of its main_grad
    # buffers is TE's own wgrad decision, taken by TE's Python.
    return BeforeBackward.apply(out, arm)


_CLASSES: dict[tuple[type, ...], dict[str, type]] = {}
# Measured wgrad rules per (TE module class, device): TE's behaviour does not change within a
# process, and --compare-policies/--suggest build several runtimes.
_RULES: dict[tuple[type, str], WgradRule] = {}


def _probed_classes(te_pytorch: Any) -> dict[str, type]:
    """TE's module classes with a forward that reports to `wgrad_listener`.

    Subclasses, not wrappers: parameter names (`weight`, `weight0..N-1`, `layer_norm_weight`)
    and attributes (`in_features`, `num_gemms`, `fuse_wgrad_accumulation`) stay TE's own.
    """
    te_linear, te_ln_linear, te_grouped = (te_pytorch.Linear, te_pytorch.LayerNormLinear,
                                           te_pytorch.GroupedLinear)
    cached = _CLASSES.get((te_linear, te_ln_linear, te_grouped))
    if cached is not None:
        return cached

    class Linear(te_linear):
        wgrad_listener = None

        def forward(self, inp, is_first_microbatch=None):
            return _run(self, lambda x, _: te_linear.forward(self, x, is_first_microbatch=is_first_microbatch),
                        inp, None, is_first_microbatch)

    class LayerNormLinear(te_ln_linear):
        wgrad_listener = None

        def forward(self, inp, is_first_microbatch=None):
            return _run(self, lambda x, _: te_ln_linear.forward(self, x, is_first_microbatch=is_first_microbatch),
                        inp, None, is_first_microbatch)

    class GroupedLinear(te_grouped):
        wgrad_listener = None

        def forward(self, inp, m_splits, is_first_microbatch=None):
            return _run(self, lambda x, splits: te_grouped.forward(
                self, x, splits, is_first_microbatch=is_first_microbatch),
                inp, list(m_splits), is_first_microbatch)

    classes = {"linear": Linear, "layernorm_linear": LayerNormLinear, "grouped_linear": GroupedLinear}
    _CLASSES[(te_linear, te_ln_linear, te_grouped)] = classes
    return classes


class TERuntime:
    """The runtime seam (docs/design.md) over Transformer Engine."""

    name = "te"

    def __init__(self, api: TEApi | None = None, device: str = "cuda",
                 kernels: Any = None) -> None:
        """`kernels`: qaudit's CPU kernel stand-in module when TE's own kernels are not
        there (qaudit/runtime/standin); None on a GPU with the real extension."""
        self.api = api if api is not None else TEApi.load()
        self.device = device
        self.kernels = kernels
        self._classes = _probed_classes(self.api.pytorch)
        self._recipes: dict[Quant, Any] = {}
        self._quant_of: dict[tuple[type, Any], Quant] = {}
        self._rules: dict[str, WgradRule] = {}
        self._recipe_classes = {name: self.api.recipe_class(spec.te_class)
                                for name, spec in RECIPES.items()}
        # Set by the audit (form_classes) for one run: TE's code for one module per class of
        # identical ones, the rest inferred; None runs TE's code for every module.
        self.inference: ClassInference | None = None
        # Delayed-scaling amax buffers of an earlier audit's modules are of no use here.
        self.api.reset_if_idle()

    @property
    def description(self) -> str:
        if self.kernels is not None:
            return (f"te (TE {self.api.version} Python on CPU, kernels: qaudit CPU stand-in; "
                    f"posing as compute capability {_POSED})")
        return f"te (CUDA, TE {self.api.version})"

    # -- inference by class (qaudit/runtime/te_infer.py) ----------------------------------

    def form_classes(self, modules: Sequence[tuple[str, torch.nn.Module]],
                     same_structure: Callable[[Any, Any], bool]) -> ClassInference:
        """Start inferring over these (name, TE module) pairs, before their first call."""
        self.inference = ClassInference()
        self.inference.form_classes(modules, same_structure)
        return self.inference

    # -- modules ------------------------------------------------------------------------

    def linear(self, in_features: int, out_features: int, *, fuse: bool) -> torch.nn.Module:
        return self._module("linear", (in_features, out_features), fuse)

    def layernorm_linear(self, in_features: int, out_features: int, *, fuse: bool) -> torch.nn.Module:
        return self._module("layernorm_linear", (in_features, out_features), fuse)

    def grouped_linear(self, num_gemms: int, in_features: int, out_features: int, *,
                       fuse: bool) -> torch.nn.Module:
        return self._module("grouped_linear", (num_gemms, in_features, out_features), fuse)

    def _module(self, kind: str, shape: tuple[int, ...], fuse: bool) -> torch.nn.Module:
        if self.kernels is None:
            # Real kernels report nothing: measure TE's behaviour once per module class.
            # On the stand-in each backward's wgrad GEMM reports its own decision.
            self.wgrad_rule(kind)
        return self._construct(kind, shape, fuse)

    def _construct(self, kind: str, shape: tuple[int, ...], fuse: bool) -> torch.nn.Module:
        in_features = shape[-2]
        with self.api.high_precision_init():
            module = self._classes[kind](
                *shape, fuse_wgrad_accumulation=fuse, bias=False, params_dtype=PARAMS_DTYPE,
                device=self.device, init_method=functools.partial(_normal_init, std=in_features ** -0.5))
        module._qaudit_runtime = self
        module._qaudit_kind = kind
        return module

    # -- wgrad decisions ----------------------------------------------------------------

    def wgrad_rule(self, kind: str) -> WgradRule:
        """TE's wgrad behaviour for one module class, measured once (qaudit/runtime/wgrad.py)."""
        key = (self._classes[kind], self.device)
        rule = self._rules.get(kind) or _RULES.get(key)
        if rule is None:
            devices = [torch.device(self.device).index or 0] if self.device.startswith("cuda") else []
            with torch.random.fork_rng(devices=devices):  # leave the model's seeded init alone
                torch.manual_seed(0)
                x = torch.randn(16, 32, device=self.device, dtype=PARAMS_DTYPE)
                if kind == "grouped_linear":
                    rule = measure_wgrad_rule(lambda fuse: self._construct(kind, (2, 32, 32), fuse),
                                              lambda m, inp, flag: m(inp, [8, 8], is_first_microbatch=flag), x)
                else:
                    rule = measure_wgrad_rule(lambda fuse: self._construct(kind, (32, 32), fuse),
                                              lambda m, inp, flag: m(inp, is_first_microbatch=flag), x)
            unknown = [k for k, decision in rule.items() if decision == "unknown"]
            if unknown:
                raise EnvironmentProblem(
                    f"--runtime te: TE {self.api.version} {kind} did neither accumulate into nor "
                    f"overwrite main_grad for (fuse, is_first_microbatch, overwrite_main_grad) in "
                    f"{unknown}; qaudit cannot report its wgrad decisions")
            _RULES[key] = rule
        self._rules[kind] = rule
        return rule

    def wgrad_rule_differences(self) -> dict[str, list[str]]:
        """Per module kind: where measured TE behaviour differs from docs/semantics.md (none expected)."""
        expected = documented_rule()
        return {kind: rule_differences(self.wgrad_rule(kind), expected) for kind in MODULE_KINDS}

    def decision(self, module: torch.nn.Module, flag: bool | None) -> str:
        """What TE's backward will do for this call, from what it saves at forward."""
        overwrite = bool(getattr(_first_weight(module), "overwrite_main_grad", False))
        key = (bool(module.fuse_wgrad_accumulation), flag, overwrite)
        return self.wgrad_rule(module._qaudit_kind)[key]

    # -- precision ----------------------------------------------------------------------

    def autocast(self, quant: Quant | None):
        if quant is None:
            # Megatron opens nothing for a high-precision layer and fp8_autocast(enabled=False)
            # to force one inside a quantized context; do the same.
            if not self.api.is_enabled():
                return contextlib.nullcontext()
            return self.api.autocast(False, None)
        return self.api.autocast(True, self.recipe_for(quant))

    def plain_gemm(self, x: torch.Tensor, weight: torch.Tensor, *, fuse: bool,
                   listener: Callable[[str], None] | None) -> torch.Tensor:
        # Megatron's own linears are not TE modules: the same plain GEMM on either runtime.
        return reference.plain_gemm(x, weight, fuse=fuse, listener=listener)

    def current_quant(self) -> Quant | None:
        if not self.api.is_enabled():
            return None
        return self.quant_of(self.api.active_recipe())

    def row_alignment(self) -> int | None:
        """Rows each quantized GEMM needs a multiple of; None in high precision."""
        if not self.api.is_enabled():
            return None
        recipe = self.api.active_recipe()
        return self.api.align_size(recipe, self.quant_of(recipe))

    def recipe_for(self, quant: Quant) -> Any:
        """TE's recipe object for `quant` (one per Quant, reused), or EnvironmentProblem."""
        recipe = self._recipes.get(quant)
        if recipe is not None:
            return recipe
        spec = RECIPES.get(quant.recipe)
        if spec is None or quant.fmt not in ("fp8", "fp4") or (quant.fmt == "fp4") != (quant.recipe == "nvfp4"):
            raise EnvironmentProblem(
                f"--runtime te: recipe {quant.label} has no Transformer Engine counterpart here "
                f"(qaudit never imports a custom quantizer factory); audit it with --runtime reference")
        cls = self._recipe_classes[quant.recipe]
        if cls is None:
            raise EnvironmentProblem(
                f"--runtime te: recipe {quant.label} needs Transformer Engine's {spec.te_class} "
                f"(TE {spec.since} or newer), and TE {self.api.version} has none; upgrade TE or "
                f"use --runtime reference")
        self._check_gpu(quant, spec)
        if quant.recipe == "nvfp4":
            recipe = cls()
        elif quant.recipe == "delayed":
            recipe = cls(fp8_format=self.api.fp8_format(quant.fp8_format), **_DELAYED_KWARGS)
        else:
            recipe = cls(fp8_format=self.api.fp8_format(quant.fp8_format))
        self._recipes[quant] = recipe
        return recipe

    def quant_of(self, recipe: Any) -> Quant:
        """qaudit's name for a TE recipe object (the inverse of `recipe_for`)."""
        fmt = getattr(recipe, "fp8_format", None)
        key = (type(recipe), fmt)
        quant = self._quant_of.get(key)
        if quant is None:
            quant = Quant("fp8", "custom")
            for name, cls in self._recipe_classes.items():
                if cls is not None and isinstance(recipe, cls):
                    quant = (Quant("fp4", "nvfp4") if name == "nvfp4"
                             else Quant("fp8", name, self._format_name(fmt)))
                    break
            self._quant_of[key] = quant
        return quant

    def _format_name(self, fmt: Any) -> str:
        if fmt is None:
            return "e4m3"
        for name in ("e4m3", "hybrid"):
            if fmt == self.api.fp8_format(name):
                return name
        return str(getattr(fmt, "name", fmt)).lower()

    def _check_gpu(self, quant: Quant, spec: RecipeSpec) -> None:
        """Ask TE the questions its autocast asserts on, and fail with one readable line."""
        for check in dict.fromkeys(("is_fp8_available", spec.check)):
            answer = self.api.support(check)
            if answer is None or answer[0]:
                continue
            raise EnvironmentProblem(
                f"--runtime te: recipe {quant.label} ({spec.te_class}) cannot run on "
                f"{_gpu_description()}: it needs {spec.needs}; Transformer Engine says: "
                f"{answer[1].strip() or check + '() is False'} Audit this config with "
                f"--runtime reference, or on a GPU that supports it.")


def _gpu_description() -> str:
    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"{torch.cuda.get_device_name()} (compute capability {major}.{minor})"
    except Exception:  # noqa: BLE001 - only used in an error message
        pass
    return "this machine"
