"""The guard inside one training process: Megatron's schedules mark the steps, the observer
(qaudit/run/observe.py) records the watched steps, and at the end of the last one the ranks
agree on one verdict (qaudit/guard/verdict.py) before any optimizer step runs.

Megatron's training loop calls its forward-backward function once per step, then the
optimizer (megatron/training/training.py `train_step`; Bridge's loop does the same). The
guard wraps the schedule functions `get_forward_backward_func()` returns, so the verdict is
reached when the step's last backward has run and nothing has been updated yet; in `stop`
mode every rank ends there. After the watched steps every hook and wrapper is removed; the
schedule wrappers stay in place (the loop may hold them) and only pass through.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import Any, Callable

from qaudit.errors import printable
from qaudit.guard.codes import EXIT_GUARD_FAILED, EXIT_STOPPED  # noqa: F401 (re-exported)
from qaudit.guard.options import GuardOptions  # noqa: F401 (re-exported)
from qaudit.run.observe import LiveObserver

# The schedule functions get_forward_backward_func() hands out
# (megatron/core/pipeline_parallel/schedules.py).
SCHEDULES = ("forward_backward_no_pipelining", "forward_backward_pipelining_without_interleaving",
             "forward_backward_pipelining_with_interleaving")


class GuardSession:
    """One process's guard: installed on Megatron's schedules, active for the watched steps."""

    def __init__(self, options: GuardOptions) -> None:
        self.options = options
        self.observer = LiveObserver(numeric=options.numeric)
        self.watched = 0
        self.done = False
        self.failed: str | None = None
        self.peer_lost = False  # the failure was the gather losing another rank of the job
        self.gathered = False  # this rank took its part in the ranks' gather
        # --mode warn, several ranks, failed before the gather: the other ranks will wait in
        # it, so this rank still joins it at the end of the watched steps.
        self.owes_gather = False
        self.zeroed = False  # Megatron's DDP zeroed its buffers since the last step
        self._installed = None
        self._outputs: dict[int, int] = {}  # id(output tensor) -> its microbatch
        self._bindings: list[dict[str, str]] = []
        self.notes: list[str] = []

    # -- Megatron's hooks (qaudit/guard/hooks.py calls these) ---------------------------

    def forward_backward(self, original: Callable, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("forward_only") or (self.done and not self.owes_gather):
            return original(*args, **kwargs)
        if self.done:  # failed earlier: the watched steps are still counted, for the gather
            result = original(*args, **kwargs)
            self._count_for_the_gather()
            return result
        try:
            self._begin_step(kwargs.get("model", args[2] if len(args) > 2 else None))
        except Exception as exc:  # noqa: BLE001 - the guard's own failure, reported as such
            self._fail(exc)
            result = original(*args, **kwargs)
            self._count_for_the_gather()
            return result
        self.observer.recording = True
        try:
            result = original(*args, **kwargs)
        finally:
            self.observer.recording = False
        try:
            self.observer.end_step()  # the step's backwards have run: what never arrived
        except Exception as exc:  # noqa: BLE001 - the guard's own failure, reported as such
            self._fail(exc)
            self._count_for_the_gather()
            return result
        self.watched += 1
        if self.watched >= self.options.steps:
            self._finish()
        return result

    def _count_for_the_gather(self) -> None:
        if not self.owes_gather:
            return
        self.watched += 1
        if self.watched >= self.options.steps:
            self.owes_gather = False
            from qaudit.guard import verdict

            try:
                verdict.join_failed(self)
            except Exception:  # noqa: BLE001 - already failed and said so; the job runs on
                pass

    def forward_step(self, original: Callable, *args: Any, **kwargs: Any) -> Any:
        if self.observer.recording and kwargs.get("current_microbatch") is not None:
            self.observer.start_microbatch(int(kwargs["current_microbatch"]))
        result = original(*args, **kwargs)
        if self.observer.recording:
            output = result[0] if isinstance(result, tuple) else result
            first = output[0] if isinstance(output, list) and output else output
            self._outputs[id(first)] = self.observer.microbatch
        return result

    def backward_step(self, original: Callable, *args: Any, **kwargs: Any) -> Any:
        if self.observer.recording:
            output = args[1] if len(args) > 1 else kwargs.get("output_tensor")
            first = output[0] if isinstance(output, list) and output else output
            microbatch = self._outputs.pop(id(first), None)
            if microbatch is not None:  # recomputed calls belong to this microbatch
                self.observer.microbatch = microbatch
        return original(*args, **kwargs)

    def zero_grad_buffer(self, original: Callable, *args: Any, **kwargs: Any) -> Any:
        self.zeroed = True
        return original(*args, **kwargs)

    def binding_walk(self) -> dict[str, str]:
        """A model's construction walk begins: the recipe configs it binds, by module name."""
        walk: dict[str, str] = {}
        self._bindings.append(walk)
        return walk

    # -- the watched steps -------------------------------------------------------------

    def _begin_step(self, model: Any) -> None:
        if self._installed is None:
            chunks = model if isinstance(model, (list, tuple)) else [model]
            self.observer.watch(_prefixed(chunks))
            self._installed = self.observer.installed()
            self._installed.__enter__()
        self._outputs.clear()
        self.observer.start_step(zeroed=self.zeroed)
        self.zeroed = False

    def _finish(self) -> None:
        self.done = True
        self._uninstall()
        from qaudit.guard import verdict

        try:
            outcome = verdict.conclude(self)
        except Exception as exc:  # noqa: BLE001 - the guard's own failure
            self._fail(exc)
            return
        if outcome.stop and self.options.mode == "stop":
            _flush_and_exit(EXIT_STOPPED)

    def _uninstall(self) -> None:
        if self._installed is not None:
            installed, self._installed = self._installed, None
            installed.__exit__(None, None, None)

    def _fail(self, exc: BaseException) -> None:
        """The guard itself failed: never a clean verdict. `warn` lets the job run on; `stop`
        ends it (the guard can no longer vouch for the step)."""
        self.done = True
        self.observer.recording = False
        try:
            self._uninstall()
        except Exception:  # noqa: BLE001 - already failing; the message below says so
            pass
        where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
        self.failed = printable(f"{type(exc).__name__}: {exc}{at}")
        from qaudit.guard import verdict

        self.peer_lost = isinstance(exc, verdict.PeerLost)
        self.owes_gather = (self.options.mode == "warn" and not self.gathered
                            and verdict.several_ranks())

        verdict.record_failure(self)
        if self.options.mode == "stop":
            _flush_and_exit(EXIT_GUARD_FAILED)


def _prefixed(chunks: list[Any]) -> list[tuple[str, Any]]:
    """qaudit's row prefixes: none without pipelining, `stage{r}/` per pipeline stage and
    `stage{r}.chunk{c}/` per virtual chunk (the rank's stage from Megatron's parallel_state)."""
    stage, stages = 0, 1
    state = sys.modules.get("megatron.core.parallel_state")
    if state is not None:
        try:
            stages = int(state.get_pipeline_model_parallel_world_size() or 1)
            stage = int(state.get_pipeline_model_parallel_rank() or 0)
        except (AssertionError, AttributeError, RuntimeError, TypeError):
            stage, stages = 0, 1
    if stages == 1 and len(chunks) == 1:
        return [("", chunks[0])]
    if len(chunks) == 1:
        return [(f"stage{stage}/", chunks[0])]
    return [(f"stage{stage}.chunk{index}/", chunk) for index, chunk in enumerate(chunks)]


def _flush_and_exit(code: int) -> None:
    """End the process now: no optimizer step, no checkpoint, no exit handler of the job's."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_session: GuardSession | None = None


def current() -> GuardSession | None:
    return _session


def start(options: GuardOptions) -> GuardSession:
    """The process's guard session (one per process)."""
    global _session
    if _session is None:
        _session = GuardSession(options)
    return _session


def wrap(session_method: Callable, original: Callable) -> Callable:
    """`original` routed through the session (a schedule, forward_step, ...)."""

    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        return session_method(original, *args, **kwargs)

    guarded.__qaudit_guard__ = True
    return guarded


