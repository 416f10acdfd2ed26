"""Runtimes: the one seam between CPU and GPU (docs/design.md): `reference` (pure PyTorch, CPU or
CUDA) and `te` (Transformer Engine's own modules: on CUDA with its kernels, or on the CPU with
qaudit's kernel stand-in, qaudit/runtime/standin; qaudit/runtime/te.py, imported only when
chosen)."""

from __future__ import annotations

import importlib.util
from typing import Collection

from qaudit.errors import EnvironmentProblem, InputError
from qaudit.runtime.reference import ReferenceRuntime

RUNTIME_CHOICES = ("auto", "reference", "te")
DEVICE_CHOICES = ("cpu", "cuda")


def te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def te_unavailable_reason(device: str | None = None) -> str:
    """Why the te runtime cannot run here, in one line; "" when it can. With a visible CUDA
    device (and --device not cpu) TE runs on its own kernels; without one, TE's Python runs
    on qaudit's CPU kernel stand-in (qaudit/runtime/standin, docs/te-runtime.md) when the
    stand-in serves that TE release."""
    if not te_installed():
        # qaudit is installed from a clone (not on the package index): the extra is the
        # clone's own.
        return ("Transformer Engine is not installed (on a machine with an NVIDIA GPU and CUDA, "
                "in your clone of qaudit: pip install \".[te]\"; without one, TE's pure-Python "
                "package runs on qaudit's CPU kernel stand-in; see docs/te-runtime.md)")
    if _uses_stand_in(device):
        from qaudit.runtime.standin import boot, te_python
        from qaudit.runtime.standin.side import TESide

        version = te_python.te_version()
        reason = te_python.unsupported_reason(version)
        if reason:
            return f"no CUDA device is visible, and {reason}"
        try:
            boot.enter(TESide("te-cpu", version))
        except boot.NotBooted as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
            return f"Transformer Engine does not import on the {te_python.STAND_IN}: {_first_line(exc)}"
        return ""
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
        return f"Transformer Engine does not import: {_first_line(exc)}"
    return ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _uses_stand_in(device: str | None) -> bool:
    """TE's kernels are stood in when no real CUDA device is visible or the CPU is asked for."""
    from qaudit.runtime.standin import host

    return device == "cpu" or not host.real_cuda_available()


def select_runtime(name: str, device: str | None = None, reads_overwrite_main_grad: bool = True,
                   fallback_note: str = "", overwrite_read_from_gemm_weight: Collection[str] = ()):
    """The runtime `name` on `device` (None: te on CUDA, or on the CPU stand-in).

    `auto` is te when Transformer Engine's Python imports (on CUDA, or on the CPU stand-in for
    a release it serves), else reference; when TE is installed but not used, the reference's
    runtime line says why. te that cannot run is an EnvironmentProblem (exit 3).
    """
    if name not in RUNTIME_CHOICES:
        raise ValueError(f"unknown runtime {name!r}")
    if device is not None and device not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {device!r}")
    if name == "auto":
        if te_installed():
            reason = te_unavailable_reason(device)
            if reason:
                fallback_note = fallback_note or f"te not used: {reason}"
            else:
                name = "te"
        if name == "auto":
            name = "reference"
    if name == "te":
        reason = te_unavailable_reason(device)
        if reason:
            raise EnvironmentProblem(f"--runtime te: {reason}")
        from qaudit.runtime.te import TERuntime

        try:
            if _uses_stand_in(device):
                from qaudit.runtime.standin import kernels

                return TERuntime(device="cpu", kernels=kernels)
            return TERuntime()
        except (ImportError, AttributeError) as exc:
            raise EnvironmentProblem(f"--runtime te: this Transformer Engine lacks an API qaudit "
                                     f"needs: {type(exc).__name__}: {exc}") from exc
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise EnvironmentProblem("--device cuda: no CUDA device is visible to torch "
                                     f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")
    runtime = ReferenceRuntime(device or "cpu", reads_overwrite_main_grad,
                               overwrite_read_from_gemm_weight=overwrite_read_from_gemm_weight)
    if fallback_note and te_installed():
        runtime.note = fallback_note
    return runtime
