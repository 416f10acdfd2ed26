"""The launch command as qaudit's child, interrupted as it would be without qaudit.

The job runs in a process group of its own, so a signal for qaudit's group (the terminal's
Ctrl-C, `kill -INT -PGID`) reaches qaudit only, and qaudit passes it to the job's whole group
once: the job's KeyboardInterrupt handler runs once, not once per copy. Where qaudit holds the
terminal's foreground, the job's group gets it for its run (the job may read the terminal,
and Ctrl-C then goes to the job directly), and qaudit takes it back after. If qaudit itself is
killed, the kernel sends the job's leader SIGTERM (PR_SET_PDEATHSIG, Linux), which torchrun
passes to its workers, and a reaper process (qaudit/guard/reaper.py), which sees qaudit's end
of a pipe close, sends SIGTERM to the job's whole group: a shell wrapper that does not pass
it on (bash waiting on torchrun) leaves nothing running either. A job ended by signal N gives
the shell's exit code, 128 + N.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from qaudit.errors import EnvironmentProblem, printable

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_PR_SET_PDEATHSIG = 1


def run_job(argv: list[str], env: dict[str, str]) -> int:
    terminal = _foreground_terminal()
    parent = os.getpid()
    try:
        child = subprocess.Popen(argv, env=env, process_group=0,
                                 preexec_fn=_in_the_child(parent))
    except OSError as exc:
        raise EnvironmentProblem(f"qaudit guard: cannot start {printable(argv[0])}: "
                                 f"{exc.strerror}") from None
    try:
        os.setpgid(child.pid, child.pid)  # also here: no race with the child's own call
    except OSError:
        pass
    reaper = _start_reaper(child.pid)
    if terminal is not None:
        _hand_terminal(terminal, child.pid)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(child.pid, signum)
        except OSError:
            pass

    # A signal qaudit was started ignoring (nohup, `&`) stays ignored, as the job inherits.
    previous = {s: signal.signal(s, forward) for s in FORWARDED
                if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        code = child.wait()  # a forwarded signal's handler runs; the wait goes on
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if terminal is not None:
            _hand_terminal(terminal, os.getpgrp())
        _dismiss(reaper)
    return 128 - code if code < 0 else code


REAPER = Path(__file__).resolve().with_name("reaper.py")


def _start_reaper(group: int) -> tuple[subprocess.Popen, int] | None:
    """The reaper of the job's group, on a pipe whose write end only this process holds (the
    job does not inherit it: Popen closes every other descriptor)."""
    if not sys.platform.startswith("linux") and sys.platform != "darwin":
        return None
    read, write = os.pipe()
    try:
        reaper = subprocess.Popen([sys.executable, "-I", "-S", str(REAPER), str(group)],
                                  stdin=read, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(write)
        return None  # PR_SET_PDEATHSIG still ends the job's first process
    finally:
        os.close(read)
    return reaper, write


def _dismiss(reaper: tuple[subprocess.Popen, int] | None) -> None:
    """The job has ended under qaudit's eyes: the reaper leaves without a signal."""
    if reaper is None:
        return
    process, write = reaper
    try:
        os.write(write, b"x")
    except OSError:
        pass
    finally:
        os.close(write)
    process.wait()


def _in_the_child(parent: int) -> Callable[[], None]:
    prctl = _prctl()

    def setup() -> None:  # between fork and exec: kept to the one call it needs
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # qaudit died before the call took effect
                os._exit(128 + signal.SIGTERM)

    return setup


def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _foreground_terminal() -> int | None:
    """stdin's terminal, when qaudit's process group is its foreground group."""
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except (AttributeError, OSError, ValueError):
        pass
    return None


def _hand_terminal(fd: int, group: int) -> None:
    """Make `group` the terminal's foreground; a background caller must not be stopped."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, group)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, previous)
