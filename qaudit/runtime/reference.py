"""The `reference` runtime: pure-PyTorch modules with TE's interface and TE's semantics.

An executable specification of docs/semantics.md §1, not a mock:
- weight workspace (§1.1): with quantized execution, `is_first_microbatch` None quantizes
  afresh and keeps nothing, True (re)quantizes into the cache, False reuses the cache as is;
  a workspace that no longer fits the active recipe is rebuilt;
- wgrad (§1.2): the flag saved at forward decides in backward: fused + True overwrites
  `main_grad`, fused + None/False accumulates, unfused returns a plain autograd `.grad`;
  `overwrite_main_grad` (read at forward) overwrites on every backward;
- §1.3: `grad_added_to_main_grad` set after a fused wgrad, with a dummy wgrad returned;
- §1.4: fused wgrad without `main_grad` fails with AttributeError in backward;
- the settings of docs/te-settings.md: a frozen weight (`requires_grad=False`) gets no weight
  gradient; a primary quantized weight (`fp8_param`) bypasses the workspace; delayed weight
  gradients queue each backward's GEMM, decision frozen, for `backward_dw()`; inside a CUDA
  graph with TE's skip flag the module sees `is_first_microbatch=False` and the workspace
  refresh follows the flag (`graph_replay`); `overwrite_main_grad` only where the TE version
  reads it, and not where that version's module reads it from a quantized copy of the weight
  (`LayerNormLinear`, `GroupedLinear` in TE 2.9 to 2.14: qaudit/plan/upstream/te.py).
"""

from __future__ import annotations

import collections
import contextlib
import functools
from typing import Callable, Collection, Iterator, Sequence

import torch
import torch.nn.functional as F

from qaudit.load.precision import Quant
from qaudit.runtime.fakequant import fake_quantize
from qaudit.runtime.protocol import WgradListener
from qaudit.runtime.te_rules import WgradPlan, weight_cache_use, wgrad_plan
from qaudit.runtime.value_free import value_free_weight


# The innermost active autocast; None means high precision.
_autocast_stack: list[Quant | None] = [None]


@contextlib.contextmanager
def autocast(quant: Quant | None) -> Iterator[None]:
    """Enter quantized execution with `quant`, or leave it when `quant` is None."""
    _autocast_stack.append(quant)
    try:
        yield
    finally:
        _autocast_stack.pop()


def current_quant() -> Quant | None:
    return _autocast_stack[-1]


# TE's skip-weight-update flag of a CUDA-graph replay: None outside graphs (or a graph
# captured without the flag), True to keep the cached quantized weight, False to refresh it.
_graph_skip_stack: list[bool | None] = [None]


@contextlib.contextmanager
def graph_replay(skip_weight_update: bool | None) -> Iterator[None]:
    """Run modules as a replay of a graph captured with TE's skip flag (TE `graph.py`,
    `make_graphed_callables(cache_quantized_params=True)` / Megatron's local graphs): the
    module sees `is_first_microbatch=False` (captured so), and a cached quantized weight is
    refreshed unless `skip_weight_update` (the device-side no-op flag of `quantize_weight`)."""
    _graph_skip_stack.append(skip_weight_update)
    try:
        yield
    finally:
        _graph_skip_stack.pop()


# Grouped GEMMs over at most this many gathered weight elements run as one batched product
# (the shrunk audit: many experts, few tokens); larger ones loop over experts.
_BATCHED_GROUPED_LIMIT = 1 << 24


def _row_experts(m_splits: Sequence[int], device: torch.device) -> torch.Tensor:
    """Each row's expert. One split serves fc1 and fc2, forward and backward: cached (the
    tensor is only read, as an index)."""
    return _row_experts_cached(tuple(m_splits), str(device))


@functools.lru_cache(maxsize=16)
def _row_experts_cached(m_splits: tuple[int, ...], device: str) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(m_splits), device=device),
                                   torch.tensor(m_splits, device=device),
                                   output_size=sum(m_splits))  # a meta tensor cannot count


def _batched(x: torch.Tensor, weights: torch.Tensor) -> bool:
    """One batched product for a grouped GEMM: small ones, and any on the meta device
    (--full-size: no storage, so gathering a weight per row costs nothing, while a loop over
    256 experts costs a meta kernel call per GEMM)."""
    return x.is_meta or x.shape[0] * weights[0].numel() <= _BATCHED_GROUPED_LIMIT


class GemmsFunction(torch.autograd.Function):
    """y = x W^T for a 2-D weight, or one GEMM per expert over row splits of `x` for a
    stacked 3-D weight [experts, out, in]; with TE's wgrad handling in backward."""

    @staticmethod
    def forward(ctx, meta: dict, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        quant: Quant | None = meta["quant"] if meta.get("numerics", True) else None
        xq = fake_quantize(x, quant, "input") if quant else x
        compute = meta["compute_weight"]
        ctx.meta, ctx.weight = meta, weight
        ctx.save_for_backward(xq, compute)
        if not meta.get("numerics", True):
            # Without --verify no value is read (the report is byte-identical either way on
            # the whole corpus): the product is left out, as in backward, and only its shape
            # is kept. A grouped product gathers a weight per row, the costliest op here.
            return xq.new_zeros(xq.shape[:-1] + (compute.shape[-2],))
        if compute.dim() == 2:
            return xq @ compute.t()
        m_splits = meta["m_splits"]
        if _batched(xq, compute):
            rows = compute[_row_experts(m_splits, x.device)]
            return torch.bmm(rows, xq.unsqueeze(-1)).squeeze(-1)
        chunks = torch.split(xq, m_splits)
        return torch.cat([chunk @ w.t() for chunk, w in zip(chunks, compute)])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        meta = ctx.meta
        xq, compute = ctx.saved_tensors
        if meta.get("numerics", True):
            quant: Quant | None = meta["quant"]
            g = fake_quantize(grad_out, quant, "grad") if quant else grad_out
            dx, dw = _gradients(g, xq, compute, meta["m_splits"])
        else:
            # Without --verify no gradient value is read: every call, flag, workspace event
            # and wgrad decision is the same, and the products are left out (most of a
            # backward's work here). dx keeps its shape so that autograd runs on as before.
            dx, dw = grad_out.new_zeros(xq.shape), None
        plan: WgradPlan = meta["plan"]
        if not meta.get("weight_requires_grad", True):
            return None, dx, None  # frozen weight: TE computes no weight gradient
        store = meta.get("wgrad_store")
        if store is not None:
            return None, dx, store.put(plan, ctx.weight, dw, meta["listener"])
        wgrad = _apply_wgrad(plan, ctx.weight, dw)
        listener = meta["listener"]
        if listener is not None:
            listener(plan.decision)
        return None, dx, wgrad


def _gradients(g: torch.Tensor, xq: torch.Tensor, compute: torch.Tensor,
               m_splits: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """dgrad and wgrad of y = x W^T, or of a grouped GEMM."""
    if compute.dim() == 2:
        return g @ compute, g.reshape(-1, g.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])
    return _grouped_grads(g, xq, compute, m_splits)


def _grouped_grads(g: torch.Tensor, xq: torch.Tensor, compute: torch.Tensor,
                   m_splits: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """dgrad and the stacked wgrad of a grouped GEMM; experts without tokens get zeros."""
    if _batched(xq, compute):
        experts = _row_experts(m_splits, g.device)
        dx = torch.bmm(g.unsqueeze(1), compute[experts]).squeeze(1)
        dw = torch.zeros_like(compute).index_add_(0, experts, g.unsqueeze(2) * xq.unsqueeze(1))
        return dx, dw
    g_chunks, x_chunks = torch.split(g, m_splits), torch.split(xq, m_splits)
    dx = torch.cat([gc @ w for gc, w in zip(g_chunks, compute)])
    dw = torch.zeros_like(compute)
    for i, (gc, xc) in enumerate(zip(g_chunks, x_chunks)):
        if gc.numel():
            dw[i] = gc.t() @ xc
    return dx, dw


def _write_main_grad(plan: WgradPlan, weight: torch.Tensor, dw: torch.Tensor | None) -> None:
    """`dw` None: a value-free backward (numerics off); main_grad is still read, so that a
    missing one fails as in TE, and the write's decision is the plan's either way."""
    main_grad = weight.main_grad  # AttributeError here when missing, as in TE
    if dw is None:
        return
    if plan.accumulate:
        main_grad.add_(dw)
    else:
        main_grad.copy_(dw)


def _autograd_wgrad(weight: torch.Tensor, dw: torch.Tensor | None) -> torch.Tensor:
    """The unfused weight gradient autograd receives (zeros from a value-free backward)."""
    return dw.to(weight.dtype) if dw is not None else torch.zeros_like(weight)


def _apply_wgrad(plan: WgradPlan, weight: torch.Tensor, dw: torch.Tensor | None):
    """Write the weight gradient as TE does; return what autograd receives."""
    if not plan.fused:
        return _autograd_wgrad(weight, dw)
    _write_main_grad(plan, weight, dw)
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True
        # TE hands autograd a dummy (an uninitialised buffer unless zero_out_wgrad); zeros
        # keep runs deterministic and are ignored by the DDP hook either way.
        return weight.new_zeros(()).expand_as(weight)
    return None


class WeightGradStore:
    """TE's `WeightGradStore` (module/_common.py) for one module: a FIFO of wgrad GEMMs queued
    by backward with their accumulate decision already taken, run by `backward_dw`."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()

    def put(self, plan: WgradPlan, weight: torch.Tensor, dw: torch.Tensor | None,
            listener: WgradListener | None):
        """Queue the GEMM; return what backward hands autograd now (TE linear.py backward):
        with fusion a dummy (and `grad_added_to_main_grad` set already), else None."""
        self.queue.append((plan, weight, dw, listener))
        if plan.fused and hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
            return weight.new_zeros(()).expand_as(weight)
        return None

    def __len__(self) -> int:
        return len(self.queue)


class _ReferenceModule(torch.nn.Module):
    """Common state of the TE-like modules: fusion switch, workspace, listener."""

    def __init__(self, fuse_wgrad_accumulation: bool, reads_overwrite_main_grad: bool = True) -> None:
        super().__init__()
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        # TE before v2.9 has no overwrite_main_grad (qaudit/plan/upstream/te.py).
        self.reads_overwrite_main_grad = reads_overwrite_main_grad
        # TE 2.9-2.14's LayerNormLinear and GroupedLinear read the attribute from the tensor
        # their GEMM used: a quantized copy lacks it (qaudit/plan/upstream/te.py).
        self.overwrite_read_from_gemm_weight = False
        # The parameter is stored quantized (fp8_param / quantized_model_init): no workspace.
        self.primary_quantized_weight = False
        self.wgrad_store: WeightGradStore | None = None
        self.wgrad_accumulation_and_reduce_hooks: list[Callable[[], None]] = []
        self._fp8_workspaces: dict[str, tuple[Quant, torch.Tensor]] = {}
        # Set by whoever observes this module; receives each backward's wgrad decision.
        self.wgrad_listener: WgradListener | None = None
        self.workspace_events: list[str] = []
        # Values on (fake quantization, products and gradients as TE would compute them) or
        # off (the same calls, flags, workspace events and wgrad decisions; zero outputs of
        # the right shapes, no products): an audit needs values only for --verify.
        self.numerics = True

    # --- delayed weight gradients (TE module/base.py) ------------------------------------
    def enable_delay_wgrad_compute(self) -> None:
        """As TE's constructor with `delay_wgrad_compute=True`: queue wgrad GEMMs, and mark
        the weights so that Megatron's DDP hooks the module instead of the parameter."""
        self.wgrad_store = WeightGradStore()
        for name, param in self.named_parameters():
            if name.startswith("weight"):
                param.skip_backward_post_hook = True

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        self.wgrad_accumulation_and_reduce_hooks.append(hook)

    def need_backward_dw(self) -> bool:
        return self.wgrad_store is not None

    def backward_dw(self) -> None:
        """Run ONE queued wgrad GEMM (FIFO), then the module's hooks. With fusion it writes
        `main_grad` with the decision taken in backward; without, it ASSIGNS `weight.grad`
        (TE v2.8+), so a second call replaces an unconsumed first one. An empty queue raises
        as TE's Linear does."""
        if not self.need_backward_dw():
            return
        if not self.wgrad_store.queue:
            raise RuntimeError("Pop empty queue. No distributed environment detected.")
        plan, weight, dw, listener = self.wgrad_store.queue.popleft()
        if plan.fused:
            _write_main_grad(plan, weight, dw)
        else:
            weight.grad = _autograd_wgrad(weight, dw)
        if listener is not None:
            listener(plan.decision)
        for hook in self.wgrad_accumulation_and_reduce_hooks:
            hook()

    def _compute_weight(self, weight: torch.Tensor, quant: Quant | None,
                        is_first_microbatch: bool | None) -> torch.Tensor:
        """The weight as the GEMM sees it (docs/semantics.md §1.1, TE module/base.py
        `quantize_weight`)."""
        if quant is None:
            return weight.detach()
        skip = _graph_skip_stack[-1]
        use = weight_cache_use(is_first_microbatch, self.primary_quantized_weight, skip)
        quantize = fake_quantize if self.numerics else (lambda w, q, role: w)
        if use in ("primary", "fresh"):
            if use == "primary":
                self.workspace_events.append("primary")
            return quantize(weight.detach(), quant, "weight")
        cached = self._fp8_workspaces.get("weight")
        fits = cached is not None and cached[0] == quant and cached[1].shape == weight.shape
        if fits and use == "reuse":
            self.workspace_events.append("reuse")
            return cached[1]
        self.workspace_events.append("refresh" if fits else "rebuild" if cached else "create")
        tensor = quantize(weight.detach(), quant, "weight")
        self._fp8_workspaces["weight"] = (quant, tensor)
        return tensor

    def _gemm(self, x: torch.Tensor, m_splits: Sequence[int] | None,
              is_first_microbatch: bool | None) -> torch.Tensor:
        if _graph_skip_stack[-1] is not None:
            is_first_microbatch = False  # TE forces it inside a capture with the skip flag
        quant = current_quant()
        weight = self.weight
        overwrite = self.reads_overwrite_main_grad and bool(getattr(weight, "overwrite_main_grad",
                                                                     False))
        if self.overwrite_read_from_gemm_weight and quant is not None \
                and not self.primary_quantized_weight:
            overwrite = False
        meta = {
            "quant": quant,
            "m_splits": list(m_splits) if m_splits is not None else None,
            "compute_weight": self._compute_weight(weight, quant, is_first_microbatch),
            # Read at forward, as TE does since PR #2549.
            "plan": wgrad_plan(self.fuse_wgrad_accumulation, is_first_microbatch, overwrite),
            "listener": self.wgrad_listener,
            # Saved at forward, as TE's weight_requires_grad.
            "weight_requires_grad": weight.requires_grad,
            "wgrad_store": self.wgrad_store,
            "numerics": self.numerics,
        }
        return gemm(x, weight, meta)


def gemm(x: torch.Tensor, weight: torch.Tensor, meta: dict) -> torch.Tensor:
    """Run `GemmsFunction`; `meta` holds quant, m_splits, compute_weight, plan, listener."""
    return GemmsFunction.apply(meta, x, weight)


def _init_weight(*shape: int, draw: bool = True) -> torch.nn.Parameter:
    """A weight drawn as TE's default init would scale it; `draw` False (no --verify: nothing
    reads a weight's value) zeros over one stored element instead, which skips the draw (most
    of a large build) and the memory (qaudit/runtime/value_free.py)."""
    if not draw:
        return value_free_weight(*shape)
    weight = torch.empty(*shape)
    torch.nn.init.normal_(weight, std=shape[-1] ** -0.5)
    return torch.nn.Parameter(weight)


class Linear(_ReferenceModule):
    """TE `Linear`: y = x W^T."""

    def __init__(self, in_features: int, out_features: int, *,
                 fuse_wgrad_accumulation: bool = False, draw_weights: bool = True) -> None:
        super().__init__(fuse_wgrad_accumulation)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _init_weight(out_features, in_features, draw=draw_weights)

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        return self._gemm(x, None, is_first_microbatch)


class LayerNormLinear(Linear):
    """TE `LayerNormLinear`: LayerNorm (high precision, autograd) then a quantizable GEMM."""

    def __init__(self, in_features: int, out_features: int, *,
                 fuse_wgrad_accumulation: bool = False, draw_weights: bool = True) -> None:
        super().__init__(in_features, out_features, fuse_wgrad_accumulation=fuse_wgrad_accumulation,
                         draw_weights=draw_weights)
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(in_features))
        self.layer_norm_bias = torch.nn.Parameter(torch.zeros(in_features))

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        normed = F.layer_norm(x, (self.in_features,), self.layer_norm_weight, self.layer_norm_bias)
        return super().forward(normed, is_first_microbatch)


class GroupedLinear(_ReferenceModule):
    """TE `GroupedLinear`: one GEMM per expert over row splits of the input.

    TE keeps one parameter per expert (`weight0..N-1`); here they are the slices of one
    stacked parameter [experts, out, in]. Every per-expert rule still holds (each slice has
    its own quantization scale, its own slice of `main_grad`; `overwrite_main_grad` is one
    setting, as TE reads it from the first weight), and a 256-expert model has one parameter
    per module instead of 256, which keeps the audit fast.
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *,
                 fuse_wgrad_accumulation: bool = False, draw_weights: bool = True) -> None:
        super().__init__(fuse_wgrad_accumulation)
        self.num_gemms = num_gemms
        self.in_features, self.out_features = in_features, out_features
        self.weight = _init_weight(num_gemms, out_features, in_features, draw=draw_weights)

    def forward(self, x: torch.Tensor, m_splits: Sequence[int],
                is_first_microbatch: bool | None = None) -> torch.Tensor:
        return self._gemm(x, m_splits, is_first_microbatch)

    def backward_dw(self) -> None:
        # TE main's GroupedLinear returns on an empty queue instead of raising.
        if self.wgrad_store is not None and not self.wgrad_store.queue:
            return
        super().backward_dw()


class ReferenceRuntime:
    """The runtime seam (docs/design.md): module factories plus the autocast state.

    `reads_overwrite_main_grad`: whether the TE version audited for has `overwrite_main_grad`
    (v2.9+, qaudit/plan/upstream/te.py); `overwrite_read_from_gemm_weight`: the module kinds
    whose backward reads it from the GEMM's (possibly quantized) weight in that version."""

    name = "reference"
    note = ""  # why an installed Transformer Engine was not used (--runtime auto)

    def __init__(self, device: str = "cpu", reads_overwrite_main_grad: bool = True,
                 numerics: bool = True,
                 overwrite_read_from_gemm_weight: Collection[str] = ()) -> None:
        self.device = device
        self.reads_overwrite_main_grad = reads_overwrite_main_grad
        self.overwrite_read_from_gemm_weight = frozenset(overwrite_read_from_gemm_weight)
        self.numerics = numerics  # values (fake quantization, gradients); off, only the semantics

    @property
    def description(self) -> str:
        note = f"; {self.note}" if self.note else ""
        return f"reference ({self.device.upper()}{note})"

    def _configured(self, module: _ReferenceModule, kind: str) -> _ReferenceModule:
        module.reads_overwrite_main_grad = self.reads_overwrite_main_grad
        module.overwrite_read_from_gemm_weight = kind in self.overwrite_read_from_gemm_weight
        module.numerics = self.numerics
        return module

    def linear(self, in_features: int, out_features: int, *, fuse: bool) -> torch.nn.Module:
        return self._configured(Linear(in_features, out_features, fuse_wgrad_accumulation=fuse,
                                       draw_weights=self.numerics), "linear")

    def layernorm_linear(self, in_features: int, out_features: int, *, fuse: bool) -> torch.nn.Module:
        return self._configured(LayerNormLinear(in_features, out_features,
                                                fuse_wgrad_accumulation=fuse,
                                                draw_weights=self.numerics), "layernorm_linear")

    def grouped_linear(self, num_gemms: int, in_features: int, out_features: int, *,
                       fuse: bool) -> torch.nn.Module:
        return self._configured(GroupedLinear(num_gemms, in_features, out_features,
                                              fuse_wgrad_accumulation=fuse,
                                              draw_weights=self.numerics), "grouped_linear")

    def autocast(self, quant: Quant | None):
        return autocast(quant)

    def graph_replay(self, skip_weight_update: bool | None):
        return graph_replay(skip_weight_update)

    def current_quant(self) -> Quant | None:
        return current_quant()

    def plain_gemm(self, x: torch.Tensor, weight: torch.Tensor, *, fuse: bool,
                   listener: WgradListener | None) -> torch.Tensor:
        return plain_gemm(x, weight, fuse=fuse, listener=listener, numerics=self.numerics)


def plain_gemm(x: torch.Tensor, weight: torch.Tensor, *, fuse: bool,
               listener: WgradListener | None, numerics: bool = True) -> torch.Tensor:
    """Megatron's own (non-TE) linear: high precision, no is_first_microbatch. With fusion its
    wgrad accumulates into main_grad, except on a Megatron-FSDP parameter, whose buffer it
    overwrites on every backward (core/tensor_parallel/layers.py; qaudit/run/fsdp.py)."""
    overwrite = hasattr(weight, "__fsdp_param__")
    meta = {"quant": None, "m_splits": None, "compute_weight": weight.detach(),
            "plan": WgradPlan(fuse, not overwrite), "listener": listener, "numerics": numerics}
    return gemm(x, weight, meta)
