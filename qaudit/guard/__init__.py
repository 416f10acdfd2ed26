"""The guard: qaudit's verdict observed inside the user's own training run (docs/guard.md).

    from qaudit.guard import guard
    guard()                           # before the model is built and the loop starts
    pretrain(config, forward_step)    # Megatron-Bridge's entry point, or any Megatron loop

`qaudit guard -- torchrun ... pretrain_gpt.py ARGS` installs the same guard in every Python
process of the launch command without a line of the script changed (qaudit/guard/launch.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qaudit.guard.codes import EXIT_STOPPED  # noqa: F401 (the API's)
from qaudit.guard.options import GuardOptions

if TYPE_CHECKING:
    from qaudit.guard.session import GuardSession


def __getattr__(name: str) -> Any:
    # The session (and torch, which it needs) is imported when used: `qaudit guard`'s
    # launcher imports this package and never runs a session itself.
    if name == "GuardSession":
        from qaudit.guard.session import GuardSession

        return GuardSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def guard(model: Any = None, *, mode: str = "stop", steps: int = 1, report: str | None = None,
          numeric: bool = False, fail_on: str = "error") -> GuardSession:
    """Watch the first `steps` training steps through Megatron's schedules: the model chunks
    each step runs are the ones watched. Call it before the loop asks for
    `get_forward_backward_func()`; before the model is built, the recipe config each module
    binds is observed too. `model` (optional): the chunks already built, checked to be torch
    modules. `mode` "stop" ends the process before the optimizer step of a step that lost
    gradients (exit code EXIT_STOPPED), "warn" prints and runs on. `report`: rank 0 writes
    the JSON report there. `numeric`: measure every write into main_grad against the call's
    own weight gradient."""
    from qaudit.guard import hooks, session as sessions

    if model is not None:
        chunks = model if isinstance(model, (list, tuple)) else [model]
        if not chunks or not all(hasattr(chunk, "named_modules") for chunk in chunks):
            raise TypeError("guard(model): pass the model chunks (a torch module or a list "
                            "of them), or nothing")
    current = sessions.start(GuardOptions(mode=mode, steps=steps, report=report,
                                          numeric=numeric, fail_on=fail_on))
    if model is not None:
        current.notes.append("installed after the model was built: the recipe configs "
                             "modules bind were not observed")
    hooks.attach(current)
    return current


__all__ = ["EXIT_STOPPED", "GuardOptions", "guard"]
