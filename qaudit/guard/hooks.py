"""Where the guard attaches to Megatron: its schedules (the step and the microbatch), its DDP
(the buffers' zeroing) and its models' construction walks (the recipe config each module
binds). Modules already imported are patched at once; the others when they are imported
(a finder that runs after the module's own code, so the module is always Megatron's own).
Line references: docs/guard.md.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any, Callable

from qaudit.guard.session import SCHEDULES, GuardSession, wrap


def _schedules(module: Any, session: GuardSession) -> None:
    for name in SCHEDULES:
        _wrap_attr(module, name, session.forward_backward)
    _wrap_attr(module, "forward_step", session.forward_step)
    _wrap_attr(module, "backward_step", session.backward_step)


def _ddp(module: Any, session: GuardSession) -> None:
    cls = getattr(module, "DistributedDataParallel", None)
    if cls is not None:
        _wrap_attr(cls, "zero_grad_buffer", session.zero_grad_buffer)


def _construction_walk(class_name: str) -> Callable[[Any, GuardSession], None]:
    """Wrap the model class's __init__ (one walk per model chunk built) and the
    `get_quant_config_or_none` its walk calls (the config key bound per module name)."""

    def hook(module: Any, session: GuardSession) -> None:
        cls = getattr(module, class_name, None)
        lookup = getattr(module, "get_quant_config_or_none", None)
        if cls is None or lookup is None or getattr(lookup, "__qaudit_guard__", False):
            return
        state = threading.local()

        def recording(name: str, recipe: Any) -> Any:
            result = lookup(name, recipe)
            walk = getattr(state, "walk", None)
            if walk is not None:
                walk[name] = getattr(result, "config_key", None) or "-"
            return result

        recording.__qaudit_guard__ = True
        module.get_quant_config_or_none = recording
        init = cls.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            outer, state.walk = getattr(state, "walk", None), session.binding_walk()
            try:
                init(self, *args, **kwargs)
                self.__dict__["_qaudit_bindings"] = state.walk
            finally:
                state.walk = outer

        __init__.__wrapped__ = init
        cls.__init__ = __init__

    return hook


HOOKS: dict[str, Callable[[Any, GuardSession], None]] = {
    "megatron.core.pipeline_parallel.schedules": _schedules,
    "megatron.core.distributed.distributed_data_parallel": _ddp,
    "megatron.core.models.gpt.gpt_model": _construction_walk("GPTModel"),
    "megatron.core.models.hybrid.hybrid_model": _construction_walk("HybridModel"),
}


def _wrap_attr(owner: Any, name: str, method: Callable) -> None:
    """`owner.name` routed through the session (a class's own method stays a method: the
    wrapper is a plain function, bound like the original)."""
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if original is None or getattr(original, "__qaudit_guard__", False):
        return
    setattr(owner, name, wrap(method, original))


_callbacks: dict[str, list[Callable[[Any], None]]] = {}


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """Run `callback(module)` once module `name` has executed: now when it already has."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _callbacks.setdefault(name, []).append(callback)
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Hands the loader of a module someone waits for a wrapper that runs the callbacks."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, name)
                return spec
        return None


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        for callback in _callbacks.pop(self.name, []):
            callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks
        return getattr(self.inner, name)


def attach(session: GuardSession) -> None:
    """Patch what is imported already, and the rest when it is."""
    for name, hook in HOOKS.items():
        after_import(name, lambda module, hook=hook: hook(module, session))
