"""Where the user's Megatron runs during `--cross-check`, fenced off from qaudit
(docs/security.md, "The cross-check worker").

Whatever upstream's code does (exit(), sys.exit(1), KeyboardInterrupt, GeneratorExit, any
BaseException, os._exit, printing, forking, hanging, exhausting memory), qaudit's exit code is
never upstream's: the outcome is a value handed back, or `EnvironmentProblem` (exit 3, one
escaped line).

On Linux and macOS the work runs in a forked child (`ForkedWorker`):
- it has a wall-clock deadline (`--cross-check-timeout`, default `DEFAULT_TIMEOUT_S`) after
  which its whole process group is killed;
- its address space may grow by `--cross-check-memory` MiB (default `DEFAULT_MEMORY_MIB`)
  over what it inherits from qaudit (RLIMIT_AS): an allocation past that raises MemoryError
  inside upstream's code, or the kernel kills the child; either is exit 3;
- it dies with qaudit: PR_SET_PDEATHSIG (Linux) and a watchdog thread reading a pipe only
  qaudit holds the other end of (EOF: qaudit is gone, on any platform);
- its stdin is /dev/null and its stdout and stderr are a pipe qaudit drains (the last lines
  are quoted in the exit-3 line), so nothing upstream prints reaches qaudit's stdout (which
  may be JSON), and a child outliving qaudit never holds the job's stdout/stderr open;
- processes upstream forks share its process group and are killed with it;
- it is fenced off at the OS level where the OS allows (crosscheck/fence.py): qaudit not
  dumpable while it lives, its own session, no inherited descriptor but its channel, no
  capabilities, a seccomp filter against ptrace, signals outside its group and leaving it;
- it imports from the module path it is given (crosscheck/import_path.py): the interpreter's
  own, without PYTHONPATH and the working directory, unless the user asked by flag.

Where the work stays in this process (no fork, or a GPU build: CUDA cannot be used in a forked
child), `run_in_process` redirects fds 1 and 2 to a temporary file for the duration, catches
every BaseException, and on the main thread of a Unix process enforces the same deadline with
SIGALRM; no memory limit is applied there.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from qaudit.crosscheck import fence
from qaudit.crosscheck import import_path as import_path_module
from qaudit.crosscheck import plain
from qaudit.errors import EnvironmentProblem, InputError, printable

DEFAULT_TIMEOUT_S = 900.0
DEFAULT_MEMORY_MIB = 16384
_OUTPUT_TAIL_BYTES = 8192
_HEADER = struct.Struct("!Q")


@dataclass(frozen=True)
class WorkerLimits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mib: int | None = DEFAULT_MEMORY_MIB  # None: no limit


def _last_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    return printable(lines[-1][:300]) if lines else ""


def describe_exception(exc: BaseException) -> str:
    """One escaped line for anything upstream's code raised (SystemExit and the like included)."""
    if isinstance(exc, SystemExit):
        return f"its code called exit({printable(repr(exc.code))[:100]})"
    if isinstance(exc, KeyboardInterrupt):
        return "its code raised KeyboardInterrupt"
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    name = type(exc).__name__
    return printable(f"{name}: {first[:300]}" if first else name)


def _problem(prefix: str, what: str, output: bytes = b"") -> EnvironmentProblem:
    last = _last_line(output)
    return EnvironmentProblem(printable(f"{prefix}: {what}" + (f" (its last output: {last})"
                                                               if last else "")))


# ---------------------------------------------------------------------------- the child side


def _die_with_parent(parent: int, lifeline: int) -> None:
    """Never outlive qaudit: the kernel's parent-death signal where there is one, and a thread
    that ends the process when the lifeline pipe reaches EOF (qaudit's end closed)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # qaudit died before the signal was armed
        os._exit(70)

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline, 1):
                pass
        os._exit(70)

    threading.Thread(target=watch, name="qaudit-lifeline", daemon=True).start()


def _limit_memory(memory_mib: int | None) -> None:
    if memory_mib is None:
        return
    with contextlib.suppress(Exception):
        import resource

        with open("/proc/self/statm", "rb") as handle:
            inherited = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = inherited + memory_mib * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _isolate_streams(output: int) -> None:
    """stdin from /dev/null; fds 1 and 2 (and sys.stdout/sys.stderr) into qaudit's pipe."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    sys.stdin = open(0, "r", closefd=False, errors="replace")
    sys.stdout = open(1, "w", closefd=False, errors="backslashreplace", buffering=1)
    sys.stderr = open(2, "w", closefd=False, errors="backslashreplace", buffering=1)


def _error_fields(exc: InputError | EnvironmentProblem) -> dict[str, Any]:
    """A qaudit error as plain fields: whatever class upstream's code derived from it, only
    qaudit's own class crosses, rebuilt on the other side (never the sender's)."""
    def text(value: Any) -> str | None:
        return value if type(value) is str else None

    if isinstance(exc, InputError):
        line = exc.line if type(exc.line) is int else None
        return {"class": "InputError", "message": text(exc.message) or "(no message)",
                "file": text(exc.file), "line": line, "key": text(exc.key)}
    message = exc.args[0] if exc.args and type(exc.args[0]) is str else describe_exception(exc)
    return {"class": "EnvironmentProblem", "message": message}


def _rebuilt_error(fields: Any) -> Exception:
    if type(fields) is not dict or type(fields.get("message")) is not str:
        raise plain.NotPlain("an error without a message")
    if fields.get("class") == "InputError":
        line = fields.get("line")
        return InputError(fields["message"], line=line if type(line) is int else None,
                          **{key: fields[key] for key in ("file", "key")
                             if type(fields.get(key)) is str})
    return EnvironmentProblem(fields["message"])


def _failure(exc: BaseException) -> list:
    """The outcome for an exception: qaudit's own error classes cross as their fields; any
    other class, a subclass of qaudit's included (upstream's code can define one), is a
    failure described in one line."""
    try:
        if type(exc) in (InputError, EnvironmentProblem):
            return ["qaudit", _error_fields(exc)]
        return ["raised", describe_exception(exc)]
    except BaseException as inner:  # noqa: BLE001 - a hostile exception's own methods
        return ["raised", f"{type(exc).__name__} (describing it raised "
                          f"{type(inner).__name__})"]


def _outcome(function: Callable[..., Any], arguments: tuple, kinds: tuple[type, ...]) -> bytes:
    try:
        value: list = ["value", function(*arguments)]
    except BaseException as exc:  # noqa: BLE001 - whatever upstream raised, as a value
        value = _failure(exc)
    try:
        payload = plain.encode(value, kinds)
    except BaseException as exc:  # noqa: BLE001 - a result that is not plain is upstream's doing
        reason = _failure(exc)[1] if type(exc) is not plain.NotPlain else str(exc)
        return plain.encode(["raised", f"its result could not be handed back: {reason}"], ())
    if len(payload) > plain.MAX_RESULT_BYTES:
        return plain.encode(["raised", f"its result ({len(payload)} bytes) is over the "
                             f"{plain.MAX_RESULT_BYTES} bytes a result may have"], ())
    return payload


def _child(function: Callable[..., Any], arguments: tuple, limits: WorkerLimits, parent: int,
           pipes: dict[str, tuple[int, int]], kinds: tuple[type, ...],
           import_path: list[str] | None) -> None:
    """Runs in the forked child; never returns (os._exit)."""
    code = 0
    try:
        os.close(pipes["result"][0])
        os.close(pipes["output"][0])
        os.close(pipes["lifeline"][1])
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # qaudit's own interrupt decides
        _isolate_streams(pipes["output"][1])
        # Its own session (what upstream forks is killed with it, and cannot leave it), only
        # its channel open, no capabilities, the seccomp filter: before any thread starts,
        # since capabilities and the filter hold per thread (crosscheck/fence.py).
        fence.fence_worker({pipes["result"][1], pipes["lifeline"][0]})
        _die_with_parent(parent, pipes["lifeline"][0])
        _limit_memory(limits.memory_mib)
        import_path_module.enter(import_path)
        worker = os.getpid()
        payload = _outcome(function, arguments, kinds)
        if os.getpid() != worker:  # a process upstream forked came back through here
            os._exit(0)
        result = pipes["result"][1]
        view = memoryview(_HEADER.pack(len(payload)) + payload)
        while view:
            view = view[os.write(result, view):]
    except BaseException:  # noqa: BLE001 - the parent reports a worker that sent nothing
        code = 71
    finally:
        os._exit(code)


# --------------------------------------------------------------------------- the parent side


class ForkedWorker:
    """`function(*arguments)` in a forked child, started now; `result()` collects it. A thread
    drains the child's pipes from the start, so the child never waits on qaudit (its output
    or a large result would fill a pipe while qaudit runs its own audit) and the deadline
    measures the child's own time."""

    def __init__(self, function: Callable[..., Any], arguments: tuple, limits: WorkerLimits,
                 describe: str, kinds: tuple[type, ...] = (),
                 import_path: list[str] | None = None) -> None:
        """`kinds`: the dataclasses the result may hold (crosscheck/plain.py); nothing else
        comes back. `import_path`: the worker's sys.path (crosscheck/import_path.py), None to
        keep qaudit's."""
        self.limits = limits
        self.kinds = kinds
        self.describe = describe  # "--cross-check: Megatron 0.19.2 at /x", for messages
        pipes = {name: os.pipe() for name in ("result", "output", "lifeline")}
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        parent = os.getpid()
        self.started = time.monotonic()
        # What exists now is frozen out of the cyclic collector across the fork: a collection
        # in the child would otherwise write into every inherited object's header, copying
        # each page of qaudit's and torch's heap into the child (copy-on-write).
        gc.freeze()
        fence.parent_fenced()  # not dumpable while the worker lives: no ptrace, no /proc fds
        self._fenced = True
        try:
            pid = os.fork()
            if pid == 0:
                _child(function, arguments, limits, parent, pipes, kinds, import_path)
        except BaseException:
            self._fenced = False
            fence.parent_unfenced()
            raise
        finally:
            gc.unfreeze()  # in qaudit (the child never returns from _child)
        self.pid: int | None = pid
        self.group: int | None = pid  # killed when done: what upstream forked dies too
        self._status: int | None = None
        os.close(pipes["result"][1])
        os.close(pipes["output"][1])
        os.close(pipes["lifeline"][0])
        self._result_fd = pipes["result"][0]
        self._output_fd = pipes["output"][0]
        self._lifeline = pipes["lifeline"][1]
        # The child makes its own session (group = its pid); until it has, a kill of its group
        # misses, and `_kill` signals the child itself too.
        self._payload, self._output = bytearray(), bytearray()
        self._done, self._stop = threading.Event(), threading.Event()
        self._drainer = threading.Thread(target=self._drain, name="qaudit-worker-pipes",
                                         daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        open_fds = {self._result_fd, self._output_fd}
        try:
            while open_fds and not self._stop.is_set():
                try:
                    ready, _, _ = select.select(list(open_fds), [], [], 0.2)
                except InterruptedError:
                    continue
                for fd in ready:
                    self._read(fd, open_fds)
                if self._complete(self._payload) or self._oversized(self._payload):
                    self._done.set()
        except (OSError, ValueError):
            pass
        finally:
            self._done.set()  # complete, or every pipe at EOF, or stopped

    def _read(self, fd: int, open_fds: set[int]) -> None:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            open_fds.discard(fd)
        elif fd == self._output_fd:
            self._output += chunk
            del self._output[:-_OUTPUT_TAIL_BYTES]
        else:
            self._payload += chunk

    def _stop_draining(self) -> None:
        self._stop.set()
        if self._drainer.is_alive():
            self._drainer.join(2.0)

    def _kill(self) -> None:
        if self.group is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.group, signal.SIGKILL)
            self.group = None
        if self.pid is None:
            return
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, 0)
        self.pid = None

    def _close(self) -> None:
        if self._drainer.is_alive():
            return  # never close a descriptor the thread may still select on
        for fd in (self._result_fd, self._output_fd, self._lifeline):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._result_fd = self._output_fd = self._lifeline = -1

    def cancel(self) -> None:
        self._kill()
        self._stop_draining()
        self._close()
        if self._fenced:  # the worker and its group are gone (SIGKILL'd, reaped)
            self._fenced = False
            fence.parent_unfenced()

    def result(self) -> Any:
        try:
            return self._collect()
        finally:
            self.cancel()

    def _collect(self) -> Any:
        deadline = self.started + self.limits.timeout_s
        while not self._done.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
            # A process upstream forked may hold the pipes open after the worker ended.
            if self._exited():
                self._done.wait(0.5)  # what the worker wrote before it ended
                break
            if time.monotonic() >= deadline:
                self._kill()
                self._stop_draining()
                raise _problem(self.describe, f"the build did not finish within "
                               f"--cross-check-timeout {self.limits.timeout_s:g} s; the worker "
                               "was killed", bytes(self._output))
        status = self._wait()
        self._stop_draining()
        payload, output = bytes(self._payload), bytes(self._output)
        if self._oversized(payload):
            raise _problem(self.describe, "the worker sent a result over the "
                           f"{plain.MAX_RESULT_BYTES} bytes a result may have", output)
        if not self._complete(payload):
            raise _problem(self.describe, self._ended(status), output)
        size = _HEADER.unpack_from(payload)[0]
        try:
            outcome = plain.decode(payload[_HEADER.size:_HEADER.size + size], self.kinds)
            if type(outcome) is not list or len(outcome) != 2:
                raise plain.NotPlain("not an outcome")
            kind, value = outcome
            if kind == "qaudit":
                value = _rebuilt_error(value)
            elif kind == "raised" and type(value) is not str:
                raise plain.NotPlain("a failure without a message")
            elif kind not in ("value", "raised"):
                raise plain.NotPlain("an outcome of no known kind")
        except plain.NotPlain as exc:
            raise _problem(self.describe, f"the worker sent something that is not qaudit's "
                           f"plain data ({exc})", output) from None
        if kind == "value":
            return value
        if kind == "qaudit":
            last = _last_line(output)
            if isinstance(value, EnvironmentProblem) and last:
                raise EnvironmentProblem(f"{value} (its last output: {last})")
            raise value
        raise _problem(self.describe, value, output)

    @staticmethod
    def _oversized(payload: bytes | bytearray) -> bool:
        """The header announces more than a result may have: nothing more is read."""
        return (len(payload) >= _HEADER.size
                and _HEADER.unpack_from(payload)[0] > plain.MAX_RESULT_BYTES)

    @staticmethod
    def _complete(payload: bytes | bytearray) -> bool:
        return (len(payload) >= _HEADER.size
                and len(payload) >= _HEADER.size + _HEADER.unpack_from(payload)[0])

    def _exited(self) -> bool:
        if self.pid is None:
            return True
        with contextlib.suppress(ChildProcessError):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return False
            self._status = status
        self.pid = None
        return True

    def _wait(self) -> int | None:
        """The child's exit status: it has sent its result (or closed the pipe) and ends at
        once; a child that does not is killed."""
        if self.pid is None:
            return self._status
        for _ in range(50):
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.pid = None
                    return status
            time.sleep(0.02)
        self._kill()
        return None

    def _ended(self, status: int | None) -> str:
        if status is None:
            return "the worker stopped sending its result"
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ \
                else str(number)
            hint = " (out of memory?)" if number == signal.SIGKILL else ""
            return f"the worker was killed by {name}{hint}"
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
        return f"its code ended the worker (os._exit({code})) before the build finished"


# ------------------------------------------------------------------------- in this process


class Deadline(BaseException):
    """Raised by SIGALRM inside upstream's code: a BaseException so that upstream's own
    `except Exception` cannot swallow it."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    usable = (hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expired(number, frame):  # noqa: ARG001
        raise Deadline()

    saved = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, saved)


@contextlib.contextmanager
def _captured_streams() -> Iterator[Any]:
    """fds 1 and 2 (and sys.stdout/sys.stderr) into a temporary file while upstream runs."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    capture = tempfile.TemporaryFile()
    saved_fds = []
    try:
        for fd in (1, 2):
            try:
                saved_fds.append((fd, os.dup(fd)))
                os.dup2(capture.fileno(), fd)
            except OSError:
                pass
        text = open(capture.fileno(), "w", closefd=False, errors="backslashreplace")
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            try:
                yield capture
            finally:
                with contextlib.suppress(Exception):
                    text.flush()
    finally:
        for fd, saved in saved_fds:
            os.dup2(saved, fd)
            os.close(saved)


def _tail(capture: Any) -> bytes:
    with contextlib.suppress(Exception):
        capture.seek(max(0, os.fstat(capture.fileno()).st_size - _OUTPUT_TAIL_BYTES))
        return capture.read()
    return b""


def run_in_process(function: Callable[..., Any], arguments: tuple, limits: WorkerLimits,
                   describe: str) -> Any:
    """`function(*arguments)` here, with the same guarantees where this process allows."""
    with _captured_streams() as capture:
        try:
            with _alarm(limits.timeout_s):
                return function(*arguments)
        except (InputError, EnvironmentProblem) as exc:
            if type(exc) in (InputError, EnvironmentProblem):
                raise
            # A subclass defined by upstream's code is upstream's failure, not qaudit's verdict.
            raise _problem(describe, _failure(exc)[1], _tail(capture)) from None
        except Deadline:
            raise _problem(describe, f"the build did not finish within --cross-check-timeout "
                           f"{limits.timeout_s:g} s", _tail(capture)) from None
        except BaseException as exc:  # noqa: BLE001 - never upstream's exit code or interrupt
            raise _problem(describe, describe_exception(exc), _tail(capture)) from None
