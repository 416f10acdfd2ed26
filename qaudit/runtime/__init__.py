"""Runtimes: the one seam between CPU and GPU (design.md). Only `reference` exists so far."""

from __future__ import annotations

import importlib.util

from qaudit.errors import EnvironmentProblem
from qaudit.runtime.reference import ReferenceRuntime

RUNTIME_CHOICES = ("auto", "reference", "te")


def te_unavailable_reason() -> str:
    if importlib.util.find_spec("transformer_engine") is None:
        return "Transformer Engine is not installed (pip install \"qaudit[te]\" on a CUDA machine)"
    import torch

    if not torch.cuda.is_available():
        return "Transformer Engine needs CUDA, and no CUDA device is visible"
    return "the te runtime is not implemented in this version of qaudit yet"


def select_runtime(name: str):
    if name in ("auto", "reference"):
        # `auto` will prefer te once that runtime exists; today it always means reference.
        return ReferenceRuntime()
    if name == "te":
        raise EnvironmentProblem(f"--runtime te: {te_unavailable_reason()}")
    raise ValueError(f"unknown runtime {name!r}")
