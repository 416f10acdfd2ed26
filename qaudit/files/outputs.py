"""Writing report files without destroying anything.

- A path that is also an input (config, recipe, baseline, a diff side) or another output is
  refused before anything is written: `-o markdown=CONFIG.yaml` would replace the config.
- Regular files are replaced atomically (a temporary file next to the target, then a rename),
  keeping an existing file's mode (and owner, where allowed) and giving a new one the mode the
  umask allows, as `open()` would. SIGINT, SIGTERM and SIGHUP are held back while the temporary
  file exists, so a killed run leaves either the old file or the new one, never a stray
  temporary file (SIGKILL cannot be held back).
- Nothing is written through a symbolic link: a path that is one (dangling or not), or whose
  directories include one, is refused (exit 2). The directory is opened one component at a
  time with O_NOFOLLOW and the file created beside the target with O_EXCL|O_NOFOLLOW, then
  renamed over it, so a link swapped in during the run is replaced, never followed.
  `--allow-symlinked-output` resolves the path first instead (the file a link names is
  written). `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` and `/proc/self/fd/N` (symlinks
  themselves) are the exception: qaudit's own descriptors, written directly.
- FIFOs and character devices (`/dev/stdout`, `/dev/null`, a terminal) are written through, never
  replaced by a regular file; a FIFO without a reader is refused instead of blocking. Block
  devices, sockets and directories are refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
import sys
import secrets
from typing import Iterator

from qaudit.errors import InputError
from qaudit.files.paths import kind_of, stat_problem

_WRITABLE_SPECIAL = (stat.S_IFIFO, stat.S_IFCHR)
_DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                          if hasattr(signal, name))


_follow_symlinks = False


def allow_symlinked_output(allowed: bool) -> None:
    """`--allow-symlinked-output`: resolve symlinks in output paths (the old behaviour)
    instead of refusing them. Set once per command by the CLI."""
    global _follow_symlinks
    _follow_symlinks = allowed


class SymlinkRefused(OSError):
    """An output path that is, or goes through, a symbolic link."""


def _resolved(path: str) -> str:
    return os.path.realpath(path) if _follow_symlinks else path


def _open_parent(path: str) -> tuple[int, str]:
    """A descriptor of the directory that holds `path`'s last component, reached one component
    at a time with O_NOFOLLOW (a symlinked directory anywhere in the path is refused, and
    nothing swapped in later can redirect the write), and that last component."""
    directory, name = os.path.split(path)
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(os.sep if os.path.isabs(path) else ".", flags)
    try:
        for part in directory.split(os.sep):
            if part in ("", "."):
                continue
            try:
                inner = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                try:
                    linked = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    linked = False
                if linked:
                    raise SymlinkRefused(
                        errno.ELOOP, f"directory {part!r} in the path is a symbolic link; "
                        "qaudit never writes through one (--allow-symlinked-output "
                        "allows it)") from None
                raise exc
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _link_refused(name: str) -> SymlinkRefused:
    return SymlinkRefused(errno.ELOOP, f"{name!r} is a symbolic link; qaudit never writes "
                          "through one (--allow-symlinked-output allows it)")


def check_output_path(path: str, what: str) -> None:
    """Refuse, before the audit, an output path that cannot be written as a file (exit 2)."""
    if "\x00" in path:
        raise InputError(f"{what}: the file name contains a NUL byte", file=path)
    if path.endswith(("/", os.sep)) or os.path.basename(path) in ("", ".", ".."):
        raise InputError(f"{what}: names a directory; give a file name", file=path)
    if _own_descriptor(path) is not None:
        return  # /dev/stdout and the like: the documented exception
    try:
        fd, name = _open_parent(_resolved(path))
    except SymlinkRefused as exc:
        raise InputError(f"{what}: {exc.strerror}", file=path) from None
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise InputError(f"{what}: directory {os.path.dirname(path) or '.'!r} does not "
                             "exist", file=path) from None
        raise InputError(f"{what}: {stat_problem(exc, path)}", file=path) from None
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise InputError(f"{what}: {stat_problem(exc, path)}", file=path) from None
        return
    finally:
        os.close(fd)
    if stat.S_ISLNK(mode):
        raise InputError(f"{what}: {_link_refused(name).strerror}", file=path)
    kind = kind_of(mode)
    if kind and stat.S_IFMT(mode) not in _WRITABLE_SPECIAL:
        raise InputError(f"{what}: {kind}; give a file name", file=path)


def _own_descriptor(path: str) -> int | None:
    """/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N (or a symlink to one of them): the
    descriptor of this process it names, written to directly (a redirection's offset is
    shared only through the descriptor itself); else None."""
    current = os.path.abspath(path)
    for _ in range(40):
        named = {"/dev/stdout": 1, "/dev/stderr": 2}.get(current)
        if named is not None:
            return named
        for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
            number = current[len(prefix):]
            if current.startswith(prefix) and number.isdigit():
                return int(number)
        if not os.path.islink(current):
            return None
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    return None


def _identity(path: str) -> tuple | None:
    """What makes two paths the same file: device and inode when it exists (hard links and
    symlinks included), else its resolved path. None for FIFOs and devices, which writing
    cannot destroy."""
    if "\x00" in path:
        return None  # names no file; reading or writing it says so
    try:
        os.fsencode(path)
    except UnicodeError:
        return None  # a lone surrogate (from a report read back): names no file either
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    if not stat.S_ISREG(info.st_mode):
        return None
    return ("inode", info.st_dev, info.st_ino)


def check_clashes(outputs: list[tuple[str, str]], inputs: list[tuple[str, str]]) -> None:
    """`outputs` and `inputs` are (what, path) pairs, e.g. ("--output json", "r.json"),
    ("config", "cfg.yaml"). Refuse an output that is an input or another output (exit 2)."""
    seen: dict[tuple, str] = {}
    for what, path in inputs:
        identity = _identity(path)
        if identity is not None:
            seen.setdefault(identity, f"the {what} ({path})")
    for what, path in outputs:
        identity = _identity(path)
        if identity is None:
            continue
        if identity in seen:
            raise InputError(f"{what} would overwrite {seen[identity]}; choose another file",
                             file=path)
        seen[identity] = f"the file of {what}"


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold back SIGINT/SIGTERM/SIGHUP until the block ends, then deliver them (only the main
    thread can install handlers; elsewhere nothing is held)."""
    pending: list[int] = []
    saved: dict[int, object] = {}
    try:
        for signum in _DEFERRED_SIGNALS:
            saved[signum] = signal.signal(signum, lambda number, frame: pending.append(number))
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


def write_file(path: str, text: str) -> None:
    """Write `text` to `path` as described above; OSError on failure (the caller words it)."""
    data = text.encode("utf-8")
    descriptor = _own_descriptor(path) if os.path.exists(path) else None
    if descriptor is not None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        _write_all(descriptor, data)
        return
    directory, name = _open_parent(_resolved(path))
    try:
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise _link_refused(name)
        if info is not None and not stat.S_ISREG(info.st_mode):
            _write_through(directory, name, data, info.st_mode)
            return
        _replace(directory, name, data, info)
    finally:
        os.close(directory)


def _replace(directory: int, name: str, data: bytes, info: os.stat_result | None) -> None:
    """A new file beside `name` (O_EXCL|O_NOFOLLOW: never an existing file or link), then
    renamed over it: a link swapped in meanwhile is replaced, never written through."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with signals_held():
        for _ in range(100):
            # The name stays short enough for the file system whatever the target's length.
            tmp = f".{name[:100]}.{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(tmp, flags, 0o600, dir_fd=directory)
                break
            except FileExistsError:
                continue
        else:
            raise OSError(errno.EEXIST, "no free temporary name")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                if info is None:
                    os.fchmod(handle.fileno(), _new_file_mode())
                else:
                    os.fchmod(handle.fileno(), stat.S_IMODE(info.st_mode))
                    if (info.st_uid, info.st_gid) != (os.geteuid(), os.getegid()):
                        with contextlib.suppress(OSError):
                            os.fchown(handle.fileno(), info.st_uid, info.st_gid)
            os.rename(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=directory)
            raise


def _write_through(directory: int, name: str, data: bytes, mode: int) -> None:
    if stat.S_IFMT(mode) not in _WRITABLE_SPECIAL:
        raise OSError(errno.EINVAL, f"{kind_of(mode)}, not a file qaudit writes")
    flags = os.O_WRONLY | os.O_NOFOLLOW | getattr(os, "O_NOCTTY", 0)
    if stat.S_ISFIFO(mode):
        flags |= os.O_NONBLOCK  # no reader: ENXIO now instead of blocking forever
    try:
        fd = os.open(name, flags, dir_fd=directory)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO (named pipe) with no reader") from None
        raise
    try:
        if stat.S_ISFIFO(mode):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_file(path: str, text: str) -> None:
    """Append to `path` (the GitHub job summary), never blocking on a FIFO without a reader."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a FIFO (named pipe) with no reader") from None
        raise
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        _write_all(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
