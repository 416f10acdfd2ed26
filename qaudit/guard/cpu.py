"""`qaudit guard --cpu`: a real Megatron training script on a machine without a GPU, for
tests and demonstrations (docs/guard.md). The process gets, for its whole life, what the
cross-check's worker gets around one build (qaudit/crosscheck/environment.py): Transformer
Engine's own Python on qaudit's CPU kernel stand-in, torch.cuda's answers for a CPU process,
the stand-ins for Megatron's CUDA-only calls, and gloo for any process group the script
starts (a CPU has no NCCL).

Armed lazily: the first import of `megatron` or `transformer_engine` boots it, so the other
Python processes of the launch command (torchrun's agent, helpers) pay nothing.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from typing import Any

_ROOTS = ("megatron", "transformer_engine")
_stack: contextlib.ExitStack | None = None


class _BootFirst(importlib.abc.MetaPathFinder):
    """Boots the CPU environment just before Megatron or TE is first imported, then lets the
    import proceed as usual."""

    def __init__(self) -> None:
        self.booting = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in _ROOTS and not self.booting and _stack is None:
            self.booting = True
            try:
                boot()
            finally:
                self.booting = False
        return None


def arm() -> None:
    if not any(isinstance(finder, _BootFirst) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BootFirst())


def boot() -> None:
    """Enter the CPU environment for the rest of the process (idempotent)."""
    global _stack
    if _stack is not None:
        return
    from qaudit.crosscheck import environment, te_side
    from qaudit.errors import EnvironmentProblem

    side = te_side.decide()
    if side.kind != "te-cpu" or side.refusal:
        raise EnvironmentProblem(
            "qaudit guard --cpu runs Megatron on Transformer Engine's own Python on qaudit's "
            "CPU kernel stand-in: " + (side.refusal or ("a CUDA device is present: drop --cpu"
                                                        if side.kind == "real" else
                                                        "no Transformer Engine is importable: "
                                                        "fetch its Python with scripts/fetch-te "
                                                        "and put it on PYTHONPATH "
                                                        "(docs/guard.md)")))
    stack = contextlib.ExitStack()
    environment.process_stand_ins(side, stack)
    stack.enter_context(_gloo_process_groups())
    _stack = stack
    _after_megatron(lambda: environment.megatron_stand_ins(side, stack, allow_import=False))


def _after_megatron(callback: Any) -> None:
    """Megatron's own modules get their stand-ins once `megatron.core` has been imported."""
    from qaudit.guard.hooks import after_import

    after_import("megatron.core", lambda module: callback())


@contextlib.contextmanager
def _gloo_process_groups():
    import torch.distributed as dist

    init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["backend"] = "gloo"
        args = args[1:] if args else args  # backend is the first positional argument
        return init(*args, **kwargs)

    dist.init_process_group = init_process_group
    try:
        yield
    finally:
        dist.init_process_group = init
