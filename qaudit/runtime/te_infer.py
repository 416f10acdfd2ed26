"""TE's own code for one module per class, the others inferred (docs/te-inference.md).

What the te runtime records of a TE module call (its weight-cache use and its backward's wgrad
decision) is TE's answer to what the module is and to the calls it has had: TE's decisions
read flags, recipes, shapes and attributes, not the values of the tensors (the claim the
case matrix and the configs check with inference on and off: tests/test_te_standin.py).
So modules that are structurally identical (qaudit/model/identical.py, passed in by the run
stage: same TE class, shapes, settings, parameter attributes and hooks) are one class, and a
member's call is inferred from the first member that made the same call after the same
history of calls: TE's code is not run for it, its output is zeros of the right shape, and
its records are the ones TE's code produced for that member. A grouped module's call is keyed
by the distinct (padded) row counts of its experts, not by which expert got which count:
experts with the same count are identical.

A member that was inferred has no TE state of its own (no weight workspace): if it later
makes a call no member made after the same history, TE's code first makes its earlier calls
again (on zeros, records dropped), then runs this one and every later one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch


@dataclass(frozen=True)
class Replayed:
    """An inferred call, as TE's code must make it again (`ClassInference._replay`)."""

    flag: bool | None
    quant: Any
    grad: bool
    training: bool
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    splits: tuple[int, ...] | None


@dataclass
class _Outcome:
    """TE's answer to one call of one class member: what later members' same calls copy."""

    representative: str
    cache: str | None = None
    decision: str | None = None
    waiting: list[Callable[[str], None]] = field(default_factory=list)

    def resolve(self, decision: str) -> None:
        if self.decision is None:
            self.decision = decision
            waiting, self.waiting = self.waiting, []
            for listener in waiting:
                listener(decision)

    def deliver(self, listener: Callable[[str], None]) -> None:
        # A later member's backward usually runs before the representative's (backward runs
        # the model in reverse): its decision is delivered when TE's arrives.
        if self.decision is not None:
            listener(self.decision)
        else:
            self.waiting.append(listener)


_PLAIN = frozenset({bool, int, float, str, type(None)})


def _attribute_key(value: Any) -> Hashable:
    if type(value) in _PLAIN:
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if callable(value):
        return ("callable", getattr(value, "__qualname__", type(value).__qualname__))
    return ("object", type(value).__qualname__)


def _parameter_key(param: torch.nn.Parameter) -> Hashable:
    # Attributes Megatron's DDP and the audit set between calls (main_grad, overwrite_main_grad,
    # grad_added_to_main_grad, ...): read per call, since they can change after the classes form.
    # Asked for every parameter at every call (a grouped module has hundreds): no sorting (an
    # attribute set in another order only makes a call run TE's code), plain values as they are.
    return (param.requires_grad, tuple([(name, value if type(value) in _PLAIN
                                         else _attribute_key(value))
                                        for name, value in param.__dict__.items()]))


def _parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The module's named parameters, kept with the module (asked at every call and every
    inferred backward; TE's modules have hundreds in a grouped one, and never replace them)."""
    cached = module.__dict__.get("_qaudit_parameters")
    if cached is None or len(cached[0]) != len(module._parameters):
        cached = (dict(module._parameters), list(module.named_parameters()))
        module.__dict__["_qaudit_parameters"] = cached
    return cached[1]


def _delays_wgrad(module: torch.nn.Module) -> bool:
    store = getattr(module, "wgrad_store", None)
    delayed = getattr(store, "delay_wgrad_compute", None)
    return bool(delayed()) if callable(delayed) else False


class ClassInference:
    """The classes of one audit's TE modules, and every call's answer by class and history."""

    def __init__(self) -> None:
        self._class_of: dict[int, int] = {}
        self._name_of: dict[int, str] = {}
        self._history: dict[int, tuple] = {}
        self._memo: dict[tuple, _Outcome] = {}
        self._ran: set[str] = set()
        self._inferred: dict[str, set[str]] = {}  # module -> the members its calls copied
        self._calls: dict[int, list[Replayed]] = {}  # an inferred module's calls, to replay

    def form_classes(self, modules: Sequence[tuple[str, torch.nn.Module]],
                     same_structure: Callable[[Any, Any], bool]) -> None:
        """Group (name, TE module) pairs, before any call, by `same_structure`; a module that
        delays its weight gradients (TE's own queue, emptied by backward_dw) is left alone."""
        representatives: dict[Hashable, list[tuple[int, torch.nn.Module]]] = {}
        count = 0
        for name, module in modules:
            self._name_of[id(module)] = name
            if _delays_wgrad(module):
                continue
            quick = (type(module), tuple((n, tuple(p.shape)) for n, p in module.named_parameters()),
                     bool(getattr(module, "fuse_wgrad_accumulation", False)))
            candidates = representatives.setdefault(quick, [])
            for index, rep in candidates:
                if same_structure(rep, module):
                    self._class_of[id(module)] = index
                    break
            else:
                candidates.append((count, module))
                self._class_of[id(module)] = count
                count += 1

    def run(self, module: torch.nn.Module, x: torch.Tensor, splits: Sequence[int] | None,
            seen_splits: Sequence[int] | None, flag: bool | None, current_quant: Any,
            run_te: Callable[[], torch.Tensor],
            replay: Callable[[Replayed], None]) -> torch.Tensor:
        """One call: TE's code where no member made it first, else the inferred copy.
        `seen_splits`: a grouped module's rows per expert as TE sees them (padded), whose
        distinct counts key the call; `replay` makes one earlier call again with TE's code,
        its records dropped."""
        own = id(module)
        name = self._name_of.get(own, "")
        klass = self._class_of.get(own)
        if klass is None:
            self._ran.add(name)
            return run_te()
        call = (flag, current_quant, torch.is_grad_enabled(), module.training,
                module.wgrad_listener is not None, tuple(x.shape), x.dtype, x.requires_grad,
                None if seen_splits is None
                else (len(seen_splits), tuple(sorted(set(seen_splits)))),
                tuple([_parameter_key(p) for _, p in _parameters(module)]))
        history = self._history.get(own, ())
        self._history[own] = (*history, call)
        key = (klass, history, call)
        outcome = self._memo.get(key)
        if outcome is None:
            if name in self._inferred:
                # Its calls so far were inferred, so it has no TE state of its own: TE's code
                # makes them again first, on zeros, their records dropped (the same records,
                # by the claim inference rests on), then this call runs as any other.
                self._replay(module, replay)
                del self._inferred[name]
            outcome = self._memo[key] = _Outcome(name)
            self._ran.add(name)
            return self._run_representative(module, outcome, run_te)
        if name in self._ran:
            # Ran TE's code before: it keeps doing so, with TE's state of its own.
            return run_te()
        self._calls.setdefault(own, []).append(Replayed(
            flag, current_quant, call[2], module.training, tuple(x.shape), x.dtype,
            x.requires_grad, None if splits is None else tuple(splits)))
        self._inferred.setdefault(name, set()).add(outcome.representative)
        object.__setattr__(module, "observed_cache", outcome.cache)
        return _inferred_output(module, x, outcome)

    def _replay(self, module: torch.nn.Module, replay: Callable[[Replayed], None]) -> None:
        listener = module.wgrad_listener
        object.__setattr__(module, "wgrad_listener", None)
        training = module.training
        try:
            for call in self._calls.pop(id(module), []):
                replay(call)
        finally:
            object.__setattr__(module, "wgrad_listener", listener)
            module.train(training)

    @staticmethod
    def _run_representative(module: torch.nn.Module, outcome: _Outcome,
                            run_te: Callable[[], torch.Tensor]) -> torch.Tensor:
        listener = module.wgrad_listener

        def heard(decision: str) -> None:
            listener(decision)
            outcome.resolve(decision)

        object.__setattr__(module, "wgrad_listener", heard if listener is not None else None)
        try:
            out = run_te()
        finally:
            object.__setattr__(module, "wgrad_listener", listener)
        outcome.cache = getattr(module, "observed_cache", None)
        return out

    def summary(self, order: Sequence[str]) -> dict | None:
        """What the report says: how many modules ran TE's code and how many were inferred,
        and per representative, in model order, the modules inferred from it. None when
        nothing was inferred."""
        if not self._inferred:
            return None
        position = {name: index for index, name in enumerate(order)}
        by_representative: dict[str, list[str]] = {}
        for name, sources in self._inferred.items():
            by_representative.setdefault(min(sources, key=lambda s: position.get(s, 0)),
                                         []).append(name)
        classes = [{"representative": rep,
                    "inferred": sorted(names, key=lambda n: position.get(n, 0))}
                   for rep, names in sorted(by_representative.items(),
                                            key=lambda item: position.get(item[0], 0))]
        return {"modules_run": len(self._ran), "modules_inferred": len(self._inferred),
                "classes": classes}


class _Inferred(torch.autograd.Function):
    """A call TE's code did not run: zeros forward; in backward the representative's wgrad
    decision, and what TE's backward does for each parameter. `params`: the parameters whose
    gradient autograd gets a tensor for; a fused weight with `grad_added_to_main_grad` is not
    among them (TE hands autograd a dummy that Megatron's DDP hook skips: a grouped module has
    hundreds), only marked as TE marks it."""

    @staticmethod
    def forward(ctx, module: torch.nn.Module, outcome: _Outcome,
                listener: Callable[[str], None] | None, marked: list[torch.nn.Parameter],
                weights: tuple[bool, ...], x: torch.Tensor, *params: torch.Tensor
                ) -> torch.Tensor:
        ctx.module, ctx.outcome, ctx.listener, ctx.marked = module, outcome, listener, marked
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.params, ctx.weights = params, weights
        width = int(module.out_features)
        return x.new_zeros(tuple(x.shape[:-1]) + (width,))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.listener is not None:
            ctx.outcome.deliver(ctx.listener)
        for param in ctx.marked:
            param.main_grad  # noqa: B018 - TE reads it: missing fails as TE's backward does
            param.grad_added_to_main_grad = True
        fused = bool(getattr(ctx.module, "fuse_wgrad_accumulation", False))
        grads = []
        for param, weight, needed in zip(ctx.params, ctx.weights, ctx.needs_input_grad[6:]):
            if not needed:
                grads.append(None)
            elif fused and weight:
                param.main_grad  # noqa: B018 - as above
                if hasattr(param, "grad_added_to_main_grad"):
                    param.grad_added_to_main_grad = True
                    grads.append(_dummy(param))  # TE's dummy
                else:
                    grads.append(None)
            else:
                grads.append(_dummy(param))
        x_grad = (grad.new_zeros(ctx.x_shape, dtype=ctx.x_dtype) if ctx.needs_input_grad[5]
                  else None)
        return (None, None, None, None, None, x_grad, *grads)


def _dummy(param: torch.Tensor) -> torch.Tensor:
    """Zeros of a parameter's shape over one stored element: an inferred call's gradient
    values are never read."""
    return param.new_zeros(()).expand_as(param)


def _inferred_output(module: torch.nn.Module, x: torch.Tensor, outcome: _Outcome) -> torch.Tensor:
    fused = bool(getattr(module, "fuse_wgrad_accumulation", False))
    marked, params, weights = [], [], []
    grad = torch.is_grad_enabled()
    for name, param in _parameters(module):
        weight = name.startswith("weight")
        if grad and weight and fused and param.requires_grad \
                and hasattr(param, "grad_added_to_main_grad"):
            marked.append(param)
        else:
            params.append(param)
            weights.append(weight)
    if marked and not x.requires_grad and not any(p.requires_grad for p in params):
        # Nothing else makes the output need a gradient: one weight stays an input (with TE's
        # dummy), so that the backward runs as TE's would.
        params.append(marked.pop())
        weights.append(True)
    return _Inferred.apply(module, outcome, module.wgrad_listener, marked, tuple(weights), x,
                           *params)
