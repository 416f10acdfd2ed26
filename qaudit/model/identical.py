"""Which sequential experts of one MoE layer are one observation (docs/observed-once.md).

When no value is read (the reference runtime without --verify), what a module records (its
calls, flags, precision, weight-workspace use and wgrad decisions) follows from what it is:
its classes, its recipe binding, its settings, its parameters' shapes and attributes, its
hooks, and the calls it gets. Experts of one layer that are the same in all of these are one
class: its first member runs and is observed, and the others are inferred to record what it
recorded (qaudit/run/inferred.py writes their records). Any expert that differs in anything
but its name and its weight values is a class of its own and runs itself.

The comparison is structural, not a list of known settings: every attribute of every module
of the expert and of every parameter takes part, so a setting added later (or a test that
changes one expert) splits the class without this file knowing of it.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass
from typing import Any, Hashable

import torch

# Attributes that name an audited module (its row and the name recipes match): they differ
# by construction, and what a name decides (a recipe binding, a graphed layer) is an
# attribute of its own, compared.
_NAMES = frozenset({"fqn", "match_name"})
# TE's own modules also carry `name`, TE's debug name for the module (qaudit/runtime/te_infer.py).
TE_MODULE_NAMES = _NAMES | {"name"}
_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})
_TENSOR_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")
_CONTAINERS = frozenset({dict, collections.OrderedDict, list, tuple, set, frozenset})


@dataclass(frozen=True)
class ExpertClass:
    """Experts of one layer (indices into `local_experts`) that are one observation."""

    observed: int
    inferred: tuple[int, ...]

    @property
    def members(self) -> tuple[int, ...]:
        return (self.observed, *self.inferred)


def expert_classes(experts: list[torch.nn.Module]) -> list[ExpertClass]:
    """Experts grouped by structure, each class observed through its lowest index."""
    groups: list[list[int]] = []
    for index, expert in enumerate(experts):
        for members in groups:
            if same_structure(experts[members[0]], expert):
                members.append(index)
                break
        else:
            groups.append([index])
    return [ExpertClass(members[0], tuple(members[1:])) for members in groups]


def same_structure(a: Any, b: Any, names: frozenset[str] = _NAMES) -> bool:
    """Whether `a` and `b` differ at most in module names and tensor values: the same
    classes, attributes (recursively: submodules, parameters and their attributes, recipe
    objects), hooks (by their code) and tensor shapes. The same object is the same (what
    the model shares: config, session, runtime); cycles compare as equal where they close.
    `names`: the attributes that only name an object (TE's own modules add their `name`)."""
    return _same(a, b, set(), names)


def _same(a: Any, b: Any, seen: set[tuple[int, int]], names: frozenset[str]) -> bool:
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind in _SCALARS:
        return a == b
    pair = (id(a), id(b))
    if pair in seen:
        return True
    seen.add(pair)
    if isinstance(a, torch.Tensor):
        # A tensor's values are not compared: nothing reads them in a run without values.
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device \
                or a.requires_grad != b.requires_grad:
            return False
        # A tensor's hook tables live in its C++ object, not in its __dict__.
        return all(_same(getattr(a, table), getattr(b, table), seen, names)
                   for table in _TENSOR_HOOKS) \
            and _same_attributes(a.__dict__, b.__dict__, seen, names)
    if isinstance(a, torch.nn.Module):
        return _same_attributes(a.__dict__, b.__dict__, seen, names)
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        # Hook tables (torch keeps them in OrderedDicts) are keyed by a handle number that
        # differs per module: their order and hooks matter, not the numbers.
        handles = kind is collections.OrderedDict
        return all((ka == kb or handles and isinstance(ka, int) and isinstance(kb, int))
                   and _same(va, vb, seen, names)
                   for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, seen, names) for x, y in zip(a, b))
    if isinstance(a, (set, frozenset)):
        return a == b
    if callable(a):
        return _callable_key(a) == _callable_key(b)
    if hasattr(a, "__dict__"):
        return _same_attributes(a.__dict__, b.__dict__, seen, names)
    return a == b


def _same_attributes(a: dict, b: dict, seen: set[tuple[int, int]],
                     names: frozenset[str]) -> bool:
    if a.keys() != b.keys():
        return False
    for name, value in a.items():
        other = b[name]
        if value is other or name in names:
            continue
        kind = type(value)
        # Most of a module's attributes are torch's empty hook tables: equal at a glance.
        if kind in _CONTAINERS and kind is type(other) and not value and not other:
            continue
        if not _same(value, other, seen, names):
            return False
    return True


def _callable_key(fn: Any) -> Hashable:
    """Functions by their code (hooks made by one line of code for every parameter are the
    same hook), partials and bound methods by their function."""
    if isinstance(fn, functools.partial):
        return ("partial", _callable_key(fn.func), len(fn.args), tuple(sorted(fn.keywords)))
    underlying = getattr(fn, "__func__", fn)
    code = getattr(underlying, "__code__", None)
    return ("code", code) if code is not None else ("callable", id(underlying))
