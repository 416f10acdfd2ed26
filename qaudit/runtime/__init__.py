"""Runtimes: the one seam between CPU and GPU (docs/design.md): `reference` (pure PyTorch, CPU or
CUDA) and `te` (Transformer Engine, CUDA; qaudit/runtime/te.py, imported only when chosen)."""

from __future__ import annotations

import importlib.util

from qaudit.errors import EnvironmentProblem, InputError
from qaudit.runtime.reference import ReferenceRuntime

RUNTIME_CHOICES = ("auto", "reference", "te")
DEVICE_CHOICES = ("cpu", "cuda")


def te_unavailable_reason() -> str:
    """Why the te runtime cannot run here, in one line; "" when it can."""
    if importlib.util.find_spec("transformer_engine") is None:
        return ("Transformer Engine is not installed (on a machine with an NVIDIA GPU and CUDA: "
                "pip install \"megatron-qaudit[te]\"; see docs/gpu.md)")
    import torch

    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (a CPU-only torch build)"
        return ("Transformer Engine is installed but needs CUDA, and no CUDA device is visible "
                f"(torch {torch.__version__}, CUDA build {build})")
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"Transformer Engine does not import: {type(exc).__name__}: {detail}"
    return ""


def select_runtime(name: str, device: str | None = None, reads_overwrite_main_grad: bool = True):
    """The runtime `name` on `device` (None: te on CUDA, reference on CPU).

    `auto` is te when Transformer Engine imports and CUDA is visible (and --device is not cpu),
    else reference; the report's runtime line says which. te without TE or CUDA is an
    EnvironmentProblem (exit 3); te with --device cpu is bad usage (exit 2).
    """
    if name not in RUNTIME_CHOICES:
        raise ValueError(f"unknown runtime {name!r}")
    if device is not None and device not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {device!r}")
    if name == "auto":
        name = "te" if device != "cpu" and not te_unavailable_reason() else "reference"
    if name == "te":
        if device == "cpu":
            raise InputError("--runtime te runs on CUDA only; --device cpu is for the reference "
                             "runtime")
        reason = te_unavailable_reason()
        if reason:
            raise EnvironmentProblem(f"--runtime te: {reason}")
        from qaudit.runtime.te import TERuntime

        try:
            return TERuntime()
        except (ImportError, AttributeError) as exc:
            raise EnvironmentProblem(f"--runtime te: this Transformer Engine lacks an API qaudit "
                                     f"needs: {type(exc).__name__}: {exc}") from exc
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EnvironmentProblem("--device cuda: no CUDA device is visible to torch "
                                     f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")
    return ReferenceRuntime(device or "cpu", reads_overwrite_main_grad)
