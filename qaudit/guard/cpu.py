"""`qaudit guard --cpu`: a real Megatron training script on a machine without a GPU, for
tests and demonstrations (docs/guard.md). The process enters the room of CPU stand-ins
through its one boot (qaudit/runtime/standin/boot.py, `enter`) and keeps, for its whole life,
what the cross-check's worker gets around one build: Transformer Engine's own Python on
qaudit's CPU kernel stand-in, torch.cuda's answers for a CPU process, the stand-ins for
Megatron's CUDA-only calls; and gloo for any process group the script starts (a CPU has no
NCCL).

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
    from qaudit.errors import EnvironmentProblem
    from qaudit.guard.hooks import after_import
    from qaudit.runtime.standin import boot as room, side as sides

    side = sides.decide()
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
    # Megatron's own modules get their stand-ins once `megatron.core` has been imported.
    try:
        room.enter(side, stack, megatron=True, when_imported=after_import)
    except room.NotBooted as exc:
        raise EnvironmentProblem(f"qaudit guard --cpu: {exc}") from None
    stack.enter_context(_gloo_process_groups())
    _stack = stack
    # A Megatron-LM launch's parsed flags are looked at once its arguments module is.
    after_import("megatron.training.arguments", _name_cpu_refusals)
    after_import("transformer_engine.pytorch.attention.dot_product_attention.utils",
                 room.unfused_attention_only)


# Launch flags that cannot run on a CPU, each with why and what to rehearse with instead
# (docs/guard.md lists them). Read from Megatron's parsed arguments (`args.<dest>`).
REFUSED_ON_CPU: tuple[tuple[str, str, Any, str], ...] = (
    ("cuda_graph_impl", "--cuda-graph-impl", lambda v: v not in (None, "none"),
     "CUDA graph capture needs a GPU; rehearse with --cuda-graph-impl none (the modules a "
     "graph replays are not observed on a GPU either: docs/guard.md)"),
    ("optimizer_cuda_graph", "--optimizer-cuda-graph", bool,
     "CUDA graph capture needs a GPU; rehearse without it"),
    ("tp_comm_overlap", "--tp-comm-overlap", bool,
     "TE's userbuffers communication overlap needs CUDA; rehearse without it"),
)


# Launch flags that run differently under --cpu, with what runs instead.
REPLACED_ON_CPU: tuple[tuple[str, str, Any, str], ...] = (
    ("attention_backend", "--attention-backend",
     lambda v: getattr(v, "name", v) in ("flash", "fused"),
     "TE's unfused attention runs instead (flash and cuDNN fused attention are GPU kernels; "
     "core attention has no linear module, so the verdict is the same)"),
)


def refusals(args: Any) -> list[str]:
    """One line per flag of the parsed launch that cannot run, or runs otherwise, under
    --cpu."""
    lines = []
    for table, verb in ((REFUSED_ON_CPU, "cannot run under --cpu: "),
                        (REPLACED_ON_CPU, "under --cpu: ")):
        for dest, flag, applies, why in table:
            value = getattr(args, dest, None)
            if value is not None and applies(value):
                shown = getattr(value, "name", value)
                named = flag if isinstance(shown, bool) else f"{flag} {shown}"
                lines.append(f"{named} {verb}{why}")
    return lines


def _name_cpu_refusals(module: Any) -> None:
    """Wrap Megatron's `validate_args` (megatron/training/arguments.py, called by
    `parse_and_validate_args` before initialisation): rank 0 prints, before anything is
    built or trained, one line per flag that cannot run on this CPU."""
    validate = getattr(module, "validate_args", None)
    if validate is None or getattr(validate, "__qaudit_guard__", False):
        return

    def validate_args(args: Any, *rest: Any, **kwargs: Any) -> Any:
        result = validate(args, *rest, **kwargs)
        if int(getattr(args, "rank", 0) or 0) == 0:
            from qaudit.errors import printable

            for line in refusals(args):
                print(f"qaudit guard: {printable(line)}", file=sys.stderr, flush=True)
        return result

    validate_args.__qaudit_guard__ = True
    validate_args.__wrapped__ = validate
    module.validate_args = validate_args


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
