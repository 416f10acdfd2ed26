"""TE's documented rules as pure functions (docs/semantics.md §1.1-1.3): what a call does with
the cached quantized weight, and what its backward does with `main_grad`. The reference runtime
executes them, the wrappers record the weight-cache one, and `wgrad` compares TE's measured
behaviour against them."""

from __future__ import annotations

from dataclasses import dataclass


def weight_cache_use(is_first_microbatch: bool | None, primary: bool = False,
                     skip_weight_update: bool | None = None) -> str:
    """What TE's `quantize_weight` does with a quantized module's weight at one call:
    "primary" (the parameter is already quantized: no workspace), "fresh" (None: quantized
    anew, nothing kept), "refresh" (True, or a graph replay that does not skip the update)
    or "reuse". A cache miss creates the workspace whatever the flag; the audit's models keep
    one from the first call on, so a miss is counted as a refresh."""
    if primary:
        return "primary"
    if skip_weight_update is not None:
        return "reuse" if skip_weight_update else "refresh"
    if is_first_microbatch is None:
        return "fresh"
    return "refresh" if is_first_microbatch else "reuse"


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
