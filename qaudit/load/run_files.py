"""What one run has read: each input file is read and parsed once per run.

A run (`qaudit check` of one or several configs, `qaudit diff`, one `qaudit.audit()` call)
opens `one_run()`. Inside it, a file's text and its parsed YAML node graph are kept under the
file's resolved path and identity (device, inode, size, modification time), so the sniffing
readers (Bridge dump? override file? recipe? MODEL_ARGS?) and the loader that finally reads
the file share one parse, and a file changed during the run is read afresh. Nothing is kept
outside a run, and nothing outlives it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

# (resolved path, st_dev, st_ino, st_size, st_mtime_ns)
FileKey = tuple[str, int, int, int, int]


class RunFiles:
    """Texts and parse outcomes (a node graph, or the InputError it raised) of one run."""

    def __init__(self) -> None:
        self.texts: dict[FileKey, str] = {}
        self.parsed: dict[FileKey, Any] = {}


_current: ContextVar[RunFiles | None] = ContextVar("qaudit_run_files", default=None)


@contextmanager
def one_run() -> Iterator[RunFiles]:
    """The run's files; a run opened inside another one is the outer one."""
    files = _current.get()
    if files is not None:
        yield files
        return
    token = _current.set(RunFiles())
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def current() -> RunFiles | None:
    return _current.get()


def file_key(path: os.PathLike | str, stat: os.stat_result) -> FileKey:
    return (os.path.realpath(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
