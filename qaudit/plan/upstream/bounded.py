"""Reading what the environment holds (installed metadata, a Megatron's source, a checkout's
`.git`) without trusting it: every file read in plan/upstream goes through `read_regular`.

`PYTHONPATH` may hold a pull request's tree, so any name there can be a FIFO (opening it
blocks), a device or a symlink to one (`/dev/zero` never ends), a symlink loop, a directory, or
a path too long for the system. Only regular files are opened, never blocking, and at most
`limit` bytes are read; every failure is a `RefusedRead` with a one-line reason, which callers
turn into "no version" or "not readable" plus a note, never a crash or a hang.
"""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

_CHUNK = 64 * 1024
# Names longer than this are cut in notes (both ends kept): a path is shown, not reproduced.
_SHOWN_PATH = 160

# The system calls, as module attributes so that tests can count the bytes actually read.
_open = os.open
_read = os.read


class RefusedRead(Exception):
    """A file that is not read: missing, not a regular file, too large, or unreadable."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing  # nothing by that name: usually no problem worth a note


def shown(path: object) -> str:
    """`path` for a message: at most _SHOWN_PATH characters, both ends kept."""
    text = str(path)
    if len(text) <= _SHOWN_PATH:
        return text
    half = (_SHOWN_PATH - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def _regular_stat(path: Path) -> os.stat_result:
    try:
        info = os.stat(path)  # follows symlinks: a link to a regular file is fine
    except FileNotFoundError:
        raise RefusedRead(f"{shown(path)} is missing", missing=True) from None
    except (OSError, ValueError) as exc:
        raise RefusedRead(f"{shown(path)}: {_reason(exc)}") from None
    if not stat.S_ISREG(info.st_mode):
        raise RefusedRead(f"{shown(path)} is not a regular file ({_kind(info.st_mode)})")
    return info


def read_regular(path: Path, limit: int, *, whole: bool = False) -> bytes:
    """At most `limit` bytes from the start of the regular file `path`. With `whole`, a file
    longer than `limit` is refused rather than cut (source code must be read entire)."""
    info = _regular_stat(path)
    if whole and info.st_size > limit:
        raise RefusedRead(f"{shown(path)} is over {limit} bytes")
    try:
        # O_NONBLOCK: should the name be swapped for a FIFO after the stat, open returns.
        fd = _open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        raise RefusedRead(f"{shown(path)}: {_reason(exc)}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise RefusedRead(f"{shown(path)} is not a regular file ({_kind(opened.st_mode)})")
        wanted = limit + 1 if whole else limit  # one byte more tells a file that grew
        chunks: list[bytes] = []
        got = 0
        while got < wanted:
            chunk = _read(fd, min(_CHUNK, wanted - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise RefusedRead(f"{shown(path)}: {_reason(exc)}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if whole and len(data) > limit:
        raise RefusedRead(f"{shown(path)} is over {limit} bytes")
    return data


def read_text(path: Path, limit: int, *, whole: bool = False) -> str:
    """`read_regular`, decoded as UTF-8 with undecodable bytes replaced."""
    return read_regular(path, limit, whole=whole).decode("utf-8", errors="replace")


def is_file(path: Path) -> bool:
    """`path` is a regular file (after symlinks); False for anything that cannot be asked."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def home_expanded(spec: str, option: str) -> Path:
    """An option's path with `~` / `~user` expanded; a home that cannot be found
    (`~nosuchuser/x`, no HOME) is the user's error, exit 2."""
    from qaudit.errors import InputError

    try:
        return Path(spec).expanduser()
    except RuntimeError:
        raise InputError(f"{option} {shown(spec)}: cannot expand '~' (no such user, or no home "
                         "directory)") from None


def names_a_path(spec: str) -> bool:
    """An option value meant as a directory rather than a name: it has a separator, starts
    like a relative or home path, or is an existing directory."""
    return "/" in spec or os.sep in spec or spec.startswith((".", "~")) or is_dir(Path(spec))


def names_in(directory: Path, *, starting: str = "", ending: str = "",
             most: int = 64, scanned: int = 100_000) -> list[str]:
    """Up to `most` names in `directory` with that start and end, sorted; at most `scanned`
    entries are looked at (a site-packages holds thousands, never millions)."""
    found: list[str] = []
    try:
        with os.scandir(directory) as entries:
            for count, entry in enumerate(entries):
                if count >= scanned:
                    break
                if entry.name.startswith(starting) and entry.name.endswith(ending):
                    found.append(entry.name)
    except (OSError, ValueError):
        pass  # an unreadable directory holds nothing qaudit can use
    return sorted(found)[:most]


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def parse_python(path: Path, limit: int, unreadable: type[Exception]) -> ast.Module:
    """An upstream source file's syntax tree, read within `limit` bytes (never imported);
    `unreadable` is raised, with the reason, for a file that cannot be read or parsed."""
    try:
        source = read_regular(path, limit, whole=True)
    except RefusedRead as exc:
        raise unreadable(str(exc)) from None
    try:
        return ast.parse(source, filename=str(path))
    except (ValueError, SyntaxError, RecursionError, MemoryError) as exc:
        raise unreadable(f"cannot parse {shown(path)}: {type(exc).__name__}: "
                         f"{str(exc)[:200]}") from None
