"""Keep the working directory off `sys.path` when qaudit is launched with `python -m`.

Imported by `qaudit/__init__.py` before anything else, so it uses only modules the
interpreter has loaded at startup (`os`, `sys`).
"""

import os
import sys


def _same_directory(entry: str, cwd: str) -> bool:
    if entry in ("", "."):
        return True
    try:
        return os.path.realpath(entry) == cwd
    except (OSError, ValueError):
        return False


def drop_working_directory() -> None:
    """Remove every sys.path entry naming the working directory ('' or its path)."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was deleted: '' still names it
        cwd = None
    sys.path[:] = [entry for entry in sys.path
                   if not (entry in ("", ".") or (cwd is not None and _same_directory(entry, cwd)))]
