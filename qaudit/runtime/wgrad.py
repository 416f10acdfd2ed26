"""Observing wgrad decisions of modules that do not report them (Transformer Engine's).

The reference runtime calls its `wgrad_listener` from inside its own backward, with the
decision it just executed. TE's modules call nothing of ours, so a runtime wrapping them uses
two runtime-independent pieces from here:

- `measure_wgrad_rule`: runs a module class a few times on tiny inputs and reads `main_grad`
  before and after each backward, for every (fusion, `is_first_microbatch`,
  `overwrite_main_grad`) combination. The answer is what the installed library *does*
  (accumulate, overwrite, or leave `main_grad` alone and return an autograd `.grad`), not
  what docs/semantics.md says it should do; `documented_rule` is the latter, for comparison.
- `observe_wgrad`: an identity autograd Function placed on a module's output. Its backward
  runs immediately before the module's own backward and reports the decision that the
  measured rule gives for the flag, fusion and `overwrite_main_grad` seen at forward (TE
  saves exactly these at forward, docs/semantics.md §1.2-1.3).

Why not read `main_grad` around every real backward instead: that needs a copy of every
weight's `main_grad` per call, and telling "overwrite" from "accumulate" on a buffer that
already holds a value also needs the call's own dW, i.e. a second wgrad GEMM per call. The
measurement does that once per module class on a 32x32 problem; `--verify` then checks the
gradient outcome of the real run against float64 autograd.

Nothing here imports Transformer Engine.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable

import torch

from qaudit.runtime.te_rules import wgrad_plan

Flag = bool | None
RuleKey = tuple[bool, Flag, bool]  # (fuse_wgrad_accumulation, is_first_microbatch, overwrite_main_grad)
WgradRule = dict[RuleKey, str]

FLAGS: tuple[Flag, ...] = (None, True, False)
RULE_KEYS: tuple[RuleKey, ...] = tuple(itertools.product((True, False), FLAGS, (False, True)))


def documented_rule() -> WgradRule:
    """docs/semantics.md §1.2-1.3, as the reference runtime implements it."""
    return {key: wgrad_plan(*key).decision for key in RULE_KEYS}


def rule_differences(measured: WgradRule, expected: WgradRule | None = None) -> list[str]:
    """One line per combination where `measured` differs from `expected` (documented)."""
    expected = expected or documented_rule()
    out = []
    for key in RULE_KEYS:
        if measured.get(key) != expected[key]:
            fuse, flag, overwrite = key
            out.append(f"fuse_wgrad_accumulation={fuse} is_first_microbatch={flag} "
                       f"overwrite_main_grad={overwrite}: measured {measured.get(key)}, "
                       f"documented {expected[key]}")
    return out


def _weights(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for name, p in module.named_parameters() if name.startswith("weight")]


def measure_wgrad_rule(make: Callable[[bool], torch.nn.Module],
                       call: Callable[[torch.nn.Module, torch.Tensor, Flag], torch.Tensor],
                       x: torch.Tensor, keys: Iterable[RuleKey] = RULE_KEYS) -> WgradRule:
    """What a module class does with its weight gradient, per (fuse, flag, overwrite).

    `make(fuse)` builds a module (on x's device), `call(module, x, flag)` runs its forward.
    Each combination runs forward+backward twice with the same input and output gradient:
    once with `main_grad` zeroed (giving dW, whatever the decision), once with `main_grad`
    filled with a large constant F. Then `main_grad - F == dW` means accumulate,
    `main_grad == dW` overwrite, `main_grad == F` with a real `.grad` autograd; anything
    else is reported as `unknown`.
    """
    generator = torch.Generator(device=x.device).manual_seed(1234)
    modules = {fuse: make(fuse) for fuse in (True, False)}
    grad_out: torch.Tensor | None = None
    rule: WgradRule = {}
    for fuse, flag, overwrite in keys:
        module = modules[fuse]
        weights = _weights(module)
        for weight in weights:
            if not hasattr(weight, "main_grad"):
                weight.main_grad = torch.zeros_like(weight, dtype=torch.float32)
            if overwrite:
                weight.overwrite_main_grad = True
            elif hasattr(weight, "overwrite_main_grad"):
                del weight.overwrite_main_grad

        def run(fill: float) -> tuple[list[torch.Tensor], list[bool]]:
            nonlocal grad_out
            for weight in weights:
                weight.main_grad.fill_(fill)
                weight.grad = None
                weight.grad_added_to_main_grad = False
            out = call(module, x, flag)
            if grad_out is None:
                grad_out = torch.randn(out.shape, generator=generator, device=out.device,
                                       dtype=out.dtype)
            out.backward(grad_out)
            got_grad = [w.grad is not None and not w.grad_added_to_main_grad for w in weights]
            return [w.main_grad.detach().clone() for w in weights], got_grad

        zeroed, _ = run(0.0)
        scale = max(float(t.abs().max()) for t in zeroed) + 1.0
        fill = 8.0 * scale
        filled, got_grad = run(fill)
        decisions = set()
        for dw, after, autograd_grad in zip(zeroed, filled, got_grad):
            tol = 1e-3 * scale
            if torch.allclose(after, torch.full_like(after, fill), rtol=0, atol=tol) and autograd_grad:
                decisions.add("autograd")
            elif torch.allclose(after - fill, dw, rtol=0, atol=tol):
                decisions.add("accumulate")
            elif torch.allclose(after, dw, rtol=0, atol=tol):
                decisions.add("overwrite")
            else:
                decisions.add("unknown")
        rule[(fuse, flag, overwrite)] = decisions.pop() if len(decisions) == 1 else "unknown"
        for weight in weights:
            weight.grad = None
    return rule


class BeforeBackward(torch.autograd.Function):
    """Identity on a module's output; its backward calls back just before the module's own
    (the reference runtime reports its decision there, the te runtime arms its GEMM probe)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, report: Callable[[], None]) -> torch.Tensor:
        ctx.report = report
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.report()
        return grad, None


def observe_wgrad(out: torch.Tensor, listener: Callable[[str], None] | None,
                  decision: str) -> torch.Tensor:
    """Report `decision` to `listener` when the backward of `out` reaches the module.

    No-op when nobody listens or the forward produces no gradient (no_grad, or the first
    pass of reentrant activation recompute): such calls have no backward to report.
    """
    if listener is None or not torch.is_grad_enabled() or not out.requires_grad:
        return out
    return BeforeBackward.apply(out, lambda: listener(decision))
