"""Which Transformer Engine a process runs the user's Megatron on: the side every user of
the room that runs Megatron asks for first (the cross-check's worker, the guard's --cpu).

Three sides (`TESide`), decided without importing TE (the cross-check decides once in the
audit process, before its worker forks):
- `standin`: no TE importable; qaudit's stand-in package (te_package.py) is Megatron's TE.
- `te-cpu`: TE's Python is importable, no CUDA device is visible, and the kernel stand-in
  serves that release (te_python.py): Megatron's TE wrappers subclass TE's own modules, which
  run on the kernel stand-in.
- `real`: TE and a CUDA device: nothing is stood in for TE or CUDA.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from qaudit.runtime.standin import te_package as standin_te


@dataclass(frozen=True)
class TESide:
    kind: str  # "standin" | "te-cpu" | "real"
    version: str | None = None  # TE's version for te-cpu and real
    refusal: str = ""  # te-cpu impossible here although TE is installed: why (one line)

    def describe(self) -> str:
        """The report's words for the TE Megatron ran on."""
        if self.kind == "te-cpu":
            return (f"Transformer Engine {self.version} Python on CPU (kernels: "
                    "qaudit CPU stand-in)")
        if self.kind == "real":
            return f"Transformer Engine {self.version or '(version unknown)'} on CUDA"
        return f"qaudit's stand-in transformer_engine (claims TE {standin_te.VERSION})"


def real_te_available() -> bool:
    """A real Transformer Engine is installed (checked without importing it)."""
    if standin_te.installed_standin():
        return False
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def decide() -> TESide:
    """Which TE side this machine gives, without importing TE (the audit process must stay
    free of the pose until its own runtime chooses)."""
    from qaudit.runtime.standin import host, te_python

    if not real_te_available():
        return TESide("standin")
    version = te_python.te_version()
    if host.real_cuda_available():
        return TESide("real", version)
    reason = te_python.unsupported_reason(version)
    if reason:
        return TESide("te-cpu", version, refusal=reason)
    return TESide("te-cpu", version)
