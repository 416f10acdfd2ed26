"""What a path given on the command line is, in words, before qaudit reads or writes it.

Reading: a FIFO or a device may block forever or never end, a symlink loop or a name too long
raise OSErrors that are not "not found"; each gets its own message (exit 2, naming the file).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

KINDS = {stat.S_IFDIR: "is a directory", stat.S_IFIFO: "is a FIFO (named pipe)",
         stat.S_IFCHR: "is a character device", stat.S_IFBLK: "is a block device",
         stat.S_IFSOCK: "is a socket"}


def stat_problem(exc: BaseException, path: str) -> str:
    """An os.stat/open failure of `path` in words."""
    if isinstance(exc, ValueError):
        return "the file name contains a NUL byte"
    code = getattr(exc, "errno", None)
    if code == errno.ENAMETOOLONG:
        return "the file name is too long"
    if code == errno.ELOOP:
        return "is a symbolic link loop"
    if code == errno.ENOENT:
        if os.path.islink(path):
            return "is a symbolic link to a file that does not exist"
        return "not found"
    if code == errno.ENOTDIR:
        return "not found (a parent in the path is not a directory)"
    if code == errno.EACCES:
        return "permission denied"
    return getattr(exc, "strerror", None) or str(exc)


def kind_of(mode: int) -> str | None:
    """None for a regular file, else what it is ("is a FIFO (named pipe)")."""
    if stat.S_ISREG(mode):
        return None
    return KINDS.get(stat.S_IFMT(mode), "is not a regular file")


def unreadable(path: str) -> str | None:
    """Why `path` cannot be read as a regular file; None when it can be."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        return stat_problem(exc, path)
    kind = kind_of(mode)
    return f"{kind}, not a regular file" if kind else None


def _git_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def repo_relative(path: str, cwd: str | os.PathLike | None = None) -> str:
    """A path as CI and code review tools want it: relative to the git root containing the
    current directory (else to the current directory), with `/` separators; never absolute.
    A file outside that root is given relative to it with `..` parts."""
    here = Path(cwd) if cwd is not None else Path.cwd()
    absolute = Path(os.path.abspath(here / path))
    root = _git_root(Path(os.path.abspath(here))) or Path(os.path.abspath(here))
    try:
        relative = os.path.relpath(absolute, root)
    except ValueError:  # another drive (Windows): the name is all that is not absolute
        relative = absolute.name
    return Path(relative).as_posix()
