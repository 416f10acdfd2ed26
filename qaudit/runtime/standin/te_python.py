"""Transformer Engine's own Python on a CPU: the boot of qaudit's kernel stand-in.

When TE's Python package is importable but no GPU is visible, `boot()` makes
`import transformer_engine.pytorch` work in this process: it skips TE's loading of its core
library (TE's own `NVTE_PROJECT_BUILDING` switch), replaces TE's extension loader so that
`transformer_engine_torch` is qaudit's stand-in (kernels.py) instead of the compiled `.so`,
serves TE's own triton-kernel packages as empty modules (torch's CPU wheel has no triton),
and poses torch as a CUDA build (host.py). Nothing is installed and no TE file is changed;
only this process's module table and torch attributes are. With a GPU none of this runs.

docs/te-runtime.md says what runs, which TE releases, and the limits.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

from qaudit.plan.upstream.te import locate_te
from qaudit.runtime.standin import host

STAND_IN = "qaudit CPU kernel stand-in"
# TE releases whose Python the stand-in was written against and is tested with (CI fetches
# 2.8.0, 2.14.0 and 2.20.2); the releases between share the call sites it serves.
SUPPORTED = ((2, 8), (2, 20))
_TRITON_PACKAGES = ("transformer_engine.pytorch.triton", "transformer_engine.common.triton")

_booted: str | None = None


def te_version() -> str | None:
    """The importable TE's version from its distribution metadata, without importing it.
    Read by plan/upstream's bounded reader, as --te auto reads it: a METADATA that is a FIFO,
    a device or a symlink loop is no version, never a hang or a crash."""
    if importlib.util.find_spec("transformer_engine") is None:
        return None
    found = locate_te()
    return None if found is None else found[1]


def _release(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def unsupported_reason(version: str | None) -> str:
    """Why the stand-in cannot run this TE; "" when it can."""
    if version is None:
        return "Transformer Engine's Python package is not importable"
    release = _release(version)
    low, high = SUPPORTED
    if release is None or not low <= release <= high:
        return (f"the {STAND_IN} serves TE {low[0]}.{low[1]} to {high[0]}.{high[1]}; "
                f"this is TE {version}")
    return ""


def booted() -> str | None:
    """The TE version booted on the stand-in in this process, or None."""
    return _booted


class _EmptyModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise NotImplementedError(f"{self.__name__}.{name} is a triton kernel; the "
                                      f"{STAND_IN} has none")
        return unavailable


class _EmptyLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _EmptyModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


class _PatchingLoader(importlib.abc.Loader):
    """Runs TE's `transformer_engine.common`, then swaps its extension loader."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        module.load_framework_extension = _load_framework_extension


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == p or name.startswith(p + ".") for p in _TRITON_PACKAGES):
            return importlib.machinery.ModuleSpec(name, _EmptyLoader(), is_package=True)
        if name == "transformer_engine.common":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
            return spec
        return None


def _load_framework_extension(framework: str) -> None:
    if framework not in ("torch", "pytorch"):
        raise ImportError(f"the {STAND_IN} serves TE's PyTorch side only, not {framework}")
    # Set by boot(); TE's own loader would look for the compiled .so here.
    assert "transformer_engine_torch" in sys.modules


def _has_max512_backend() -> bool:
    """TE before about 2.20 still names the F16_max512_seqlen attention backend, and later
    ones assert the backend set equals theirs: read which from TE's own source."""
    spec = importlib.util.find_spec("transformer_engine")
    root = Path(next(iter(spec.submodule_search_locations)))
    for relative in ("pytorch/cpp_extensions/fused_attn.py",
                     "pytorch/attention/dot_product_attention/utils.py"):
        path = root / relative
        if path.is_file() and "F16_max512_seqlen" in path.read_text(errors="replace"):
            return True
    return False


def boot() -> str:
    """Make TE's Python importable on the stand-in; returns the TE version. Idempotent.
    Raises ImportError with one line when that cannot be done."""
    global _booted
    if _booted is not None:
        return _booted
    version = te_version()
    reason = unsupported_reason(version)
    if reason:
        raise ImportError(reason)
    if any(name == "transformer_engine" or name.startswith("transformer_engine.")
           for name in sys.modules):
        raise ImportError("Transformer Engine was imported before the stand-in booted")
    from qaudit.runtime.standin import kernels

    host.pose_as_cuda()
    sys.modules["transformer_engine_torch"] = kernels.build(_has_max512_backend())
    sys.meta_path.insert(0, _Finder())
    # TE's own switches: skip loading the core .so; delayed scaling's amax/scale update in
    # TE's Python rather than a fused kernel; TE's fused elementwise helpers run eagerly
    # instead of through torch.compile (which would trace the CUDA pose).
    os.environ["NVTE_PROJECT_BUILDING"] = "1"
    os.environ.setdefault("NVTE_UNFUSED_FP8_UPDATE", "1")
    os.environ["NVTE_TORCH_COMPILE"] = "0"
    try:
        import transformer_engine.pytorch  # noqa: F401
    finally:
        os.environ.pop("NVTE_PROJECT_BUILDING", None)
    _booted = version
    return version
