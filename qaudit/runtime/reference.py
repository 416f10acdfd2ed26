"""The `reference` runtime: pure-PyTorch modules with TE's interface and TE's semantics.

An executable specification of semantics.md §1, not a mock:
- weight workspace (§1.1): with quantized execution, `is_first_microbatch` None quantizes
  afresh and keeps nothing, True (re)quantizes into the cache, False reuses the cache as is;
  a workspace that no longer fits the active recipe is rebuilt;
- wgrad (§1.2): the flag saved at forward decides in backward: fused + True overwrites
  `main_grad`, fused + None/False accumulates, unfused returns a plain autograd `.grad`;
  `overwrite_main_grad` (read at forward) overwrites on every backward;
- §1.3: `grad_added_to_main_grad` set after a fused wgrad, with a dummy wgrad returned;
- §1.4: fused wgrad without `main_grad` fails with AttributeError in backward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from qaudit.precision import Quant
from qaudit.runtime.fakequant import fake_quantize

WgradListener = Callable[[str], None]

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


@dataclass(frozen=True)
class WgradPlan:
    """What backward will do with the weight gradient, decided at forward as TE does."""

    fused: bool
    accumulate: bool

    @property
    def decision(self) -> str:
        if not self.fused:
            return "autograd"
        return "accumulate" if self.accumulate else "overwrite"


def wgrad_plan(fuse_wgrad_accumulation: bool, is_first_microbatch: bool | None,
               overwrite_main_grad: bool) -> WgradPlan:
    if not fuse_wgrad_accumulation:
        return WgradPlan(False, False)
    if overwrite_main_grad:
        return WgradPlan(True, False)
    if is_first_microbatch is None:
        return WgradPlan(True, True)
    return WgradPlan(True, not is_first_microbatch)


# Grouped GEMMs over at most this many gathered weight elements run as one batched product
# (the shrunk audit: many experts, few tokens); larger ones loop over experts.
_BATCHED_GROUPED_LIMIT = 1 << 24


def _row_experts(m_splits: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(m_splits), device=device),
                                   torch.tensor(m_splits, device=device))


class GemmsFunction(torch.autograd.Function):
    """One or more GEMMs over row splits of `x`, with TE's wgrad handling."""

    @staticmethod
    def forward(ctx, meta: dict, x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        quant: Quant | None = meta["quant"]
        xq = fake_quantize(x, quant, "input") if quant else x
        compute_weights = meta["compute_weights"]
        ctx.meta, ctx.weights = meta, weights
        ctx.batched = len(weights) > 1 and xq.shape[0] * compute_weights[0].numel() <= _BATCHED_GROUPED_LIMIT
        if len(weights) == 1:
            out = xq @ compute_weights[0].t()
            ctx.save_for_backward(xq, compute_weights[0])
        elif ctx.batched:
            stacked = torch.stack(compute_weights)
            rows = stacked[_row_experts(meta["m_splits"], x.device)]
            out = torch.bmm(rows, xq.unsqueeze(-1)).squeeze(-1)
            ctx.save_for_backward(xq, stacked)
        else:
            chunks = torch.split(xq, meta["m_splits"])
            out = torch.cat([chunk @ w.t() for chunk, w in zip(chunks, compute_weights)])
            ctx.save_for_backward(xq, *compute_weights)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        meta = ctx.meta
        quant: Quant | None = meta["quant"]
        g = fake_quantize(grad_out, quant, "grad") if quant else grad_out
        m_splits = meta["m_splits"]
        if len(ctx.weights) == 1:
            xq, weight = ctx.saved_tensors
            dx = g @ weight
            dws = [g.reshape(-1, g.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])]
        elif ctx.batched:
            xq, stacked = ctx.saved_tensors
            experts = _row_experts(m_splits, g.device)
            dx = torch.bmm(g.unsqueeze(1), stacked[experts]).squeeze(1)
            per_row = g.unsqueeze(2) * xq.unsqueeze(1)
            dw_all = torch.zeros_like(stacked).index_add_(0, experts, per_row)
            dws = [dw_all[i] if n else None for i, n in enumerate(m_splits)]
        else:
            xq, *compute_weights = ctx.saved_tensors
            g_chunks, x_chunks = torch.split(g, m_splits), torch.split(xq, m_splits)
            dx = torch.cat([gc @ w for gc, w in zip(g_chunks, compute_weights)])
            dws = [gc.t() @ xc if gc.numel() else None for gc, xc in zip(g_chunks, x_chunks)]
        plan: WgradPlan = meta["plan"]
        wgrads = [_apply_wgrad(plan, weight, dw) for weight, dw in zip(ctx.weights, dws)]
        listener = meta["listener"]
        if listener is not None:
            listener(plan.decision)
        return (None, dx, *wgrads)


def _apply_wgrad(plan: WgradPlan, weight: torch.Tensor, dw: torch.Tensor | None):
    """Write one weight's gradient as TE does; return what autograd receives.

    `dw` None means a zero gradient (an expert that got no tokens).
    """
    if not plan.fused:
        return torch.zeros_like(weight) if dw is None else dw.to(weight.dtype)
    main_grad = weight.main_grad  # AttributeError here when missing, as in TE
    if plan.accumulate:
        if dw is not None:
            main_grad.add_(dw)
    elif dw is None:
        main_grad.zero_()
    else:
        main_grad.copy_(dw)
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True
        # TE hands autograd a dummy (an uninitialised buffer unless zero_out_wgrad); zeros
        # keep runs deterministic and are ignored by the DDP hook either way.
        return weight.new_zeros(()).expand_as(weight)
    return None


class _ReferenceModule(torch.nn.Module):
    """Common state of the TE-like modules: fusion switch, workspaces, listener."""

    def __init__(self, fuse_wgrad_accumulation: bool) -> None:
        super().__init__()
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self._fp8_workspaces: dict[str, tuple[Quant, torch.Tensor]] = {}
        # Set by whoever observes this module; receives each backward's wgrad decision.
        self.wgrad_listener: WgradListener | None = None
        self.workspace_events: list[str] = []

    def _compute_weights(self, keys: Sequence[str], weights: Sequence[torch.Tensor],
                         quant: Quant | None, is_first_microbatch: bool | None) -> list[torch.Tensor]:
        """The weights as the GEMMs see them (semantics.md §1.1)."""
        if quant is None:
            return [w.detach() for w in weights]
        if is_first_microbatch is None:
            return _quantize_all(weights, quant)
        stale = [i for i, key in enumerate(keys)
                 if is_first_microbatch or not self._workspace_fits(key, weights[i], quant)]
        if stale:
            if any(keys[i] in self._fp8_workspaces and not self._workspace_fits(keys[i], weights[i], quant)
                   for i in stale):
                event = "rebuild"
            elif all(keys[i] in self._fp8_workspaces for i in stale):
                event = "refresh"
            else:
                event = "create"
            fresh = _quantize_all([weights[i] for i in stale], quant)
            for i, tensor in zip(stale, fresh):
                self._fp8_workspaces[keys[i]] = (quant, tensor)
            self.workspace_events.append(event)
        else:
            self.workspace_events.append("reuse")
        return [self._fp8_workspaces[key][1] for key in keys]

    def _workspace_fits(self, key: str, weight: torch.Tensor, quant: Quant) -> bool:
        cached = self._fp8_workspaces.get(key)
        return cached is not None and cached[0] == quant and cached[1].shape == weight.shape

    def _gemms(self, x: torch.Tensor, weights: Sequence[torch.nn.Parameter], keys: Sequence[str],
               m_splits: Sequence[int], is_first_microbatch: bool | None) -> torch.Tensor:
        quant = current_quant()
        overwrite = bool(getattr(weights[0], "overwrite_main_grad", False))
        meta = {
            "quant": quant,
            "m_splits": list(m_splits),
            "compute_weights": self._compute_weights(keys, weights, quant, is_first_microbatch),
            "plan": wgrad_plan(self.fuse_wgrad_accumulation, is_first_microbatch, overwrite),
            "listener": self.wgrad_listener,
        }
        return gemms(x, weights, meta)


def _quantize_all(weights: Sequence[torch.Tensor], quant: Quant) -> list[torch.Tensor]:
    """Fake-quantize each weight on its own scale; equal shapes go through in one pass."""
    if len(weights) == 1:
        return [fake_quantize(weights[0].detach(), quant, "weight")]
    stacked = torch.stack([w.detach() for w in weights])
    return list(fake_quantize(stacked, quant, "weight").unbind(0))


def gemms(x: torch.Tensor, weights: Sequence[torch.Tensor], meta: dict) -> torch.Tensor:
    """Run `GemmsFunction`; `meta` holds quant, m_splits, compute_weights, plan, listener."""
    return GemmsFunction.apply(meta, x, *weights)


def _init_weight(out_features: int, in_features: int) -> torch.nn.Parameter:
    weight = torch.empty(out_features, in_features)
    torch.nn.init.normal_(weight, std=in_features ** -0.5)
    return torch.nn.Parameter(weight)


class Linear(_ReferenceModule):
    """TE `Linear`: y = x W^T."""

    def __init__(self, in_features: int, out_features: int, *,
                 fuse_wgrad_accumulation: bool = False) -> None:
        super().__init__(fuse_wgrad_accumulation)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _init_weight(out_features, in_features)

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        return self._gemms(x, [self.weight], ["weight"], [x.shape[0]], is_first_microbatch)


class LayerNormLinear(Linear):
    """TE `LayerNormLinear`: LayerNorm (high precision, autograd) then a quantizable GEMM."""

    def __init__(self, in_features: int, out_features: int, *,
                 fuse_wgrad_accumulation: bool = False) -> None:
        super().__init__(in_features, out_features, fuse_wgrad_accumulation=fuse_wgrad_accumulation)
        self.layer_norm_weight = torch.nn.Parameter(torch.ones(in_features))
        self.layer_norm_bias = torch.nn.Parameter(torch.zeros(in_features))

    def forward(self, x: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        normed = F.layer_norm(x, (self.in_features,), self.layer_norm_weight, self.layer_norm_bias)
        return super().forward(normed, is_first_microbatch)


class GroupedLinear(_ReferenceModule):
    """TE `GroupedLinear`: one GEMM per expert over row splits, weights `weight0..N-1`."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int, *,
                 fuse_wgrad_accumulation: bool = False) -> None:
        super().__init__(fuse_wgrad_accumulation)
        self.num_gemms = num_gemms
        self.in_features, self.out_features = in_features, out_features
        for i in range(num_gemms):
            self.register_parameter(f"weight{i}", _init_weight(out_features, in_features))

    def forward(self, x: torch.Tensor, m_splits: Sequence[int],
                is_first_microbatch: bool | None = None) -> torch.Tensor:
        weights = [getattr(self, f"weight{i}") for i in range(self.num_gemms)]
        keys = [f"weight{i}" for i in range(self.num_gemms)]
        return self._gemms(x, weights, keys, m_splits, is_first_microbatch)


class ReferenceRuntime:
    """The runtime seam (design.md): module factories plus the autocast state."""

    name = "reference"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    @property
    def description(self) -> str:
        return f"reference ({self.device.upper()})"

    def linear(self, in_features: int, out_features: int, *, fuse: bool) -> torch.nn.Module:
        return Linear(in_features, out_features, fuse_wgrad_accumulation=fuse)

    def layernorm_linear(self, in_features: int, out_features: int, *, fuse: bool) -> torch.nn.Module:
        return LayerNormLinear(in_features, out_features, fuse_wgrad_accumulation=fuse)

    def grouped_linear(self, num_gemms: int, in_features: int, out_features: int, *,
                       fuse: bool) -> torch.nn.Module:
        return GroupedLinear(num_gemms, in_features, out_features, fuse_wgrad_accumulation=fuse)

    def autocast(self, quant: Quant | None):
        return autocast(quant)

    def current_quant(self) -> Quant | None:
        return current_quant()
