"""Where the fenced worker may import upstream's code from (docs/security.md).

Without `--startup-checks` or `--cross-check`, the only Megatron imported is the one installed
in the interpreter's site-packages, and it must be imported from there: the worker's module
path is the interpreter's own (the standard library, site-packages, what their `.pth` files
add), without the PYTHONPATH entries and the working directory a pull request may control, so
a `megatron.py`, a namespace `megatron/core.py` or an `einops/` there cannot shadow it. With
the flag the user named that path, and it is kept whole. Either way, what was imported is
checked against the Megatron the report names.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from qaudit.plan.upstream.site_dirs import is_site_dir


def _real(entry: str) -> str | None:
    try:
        return os.path.realpath(entry)
    except (OSError, ValueError):
        return None


def installed_only(path: Sequence[str] | None = None,
                   environ: Mapping[str, str] | None = None) -> list[str]:
    """`path` (sys.path) without the working directory ('' and its path), the PYTHONPATH
    entries and the launching script's directory, except those that are site-packages
    themselves; qaudit's own location stays (the worker runs qaudit's code too)."""
    path = list(sys.path if path is None else path)
    environ = os.environ if environ is None else environ
    user = {_real(entry or ".") for entry in environ.get("PYTHONPATH", "").split(os.pathsep)}
    try:
        user.add(_real(os.getcwd()))
    except OSError:
        pass
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(main, str):
        user.add(_real(os.path.dirname(main) or "."))
    ours = _real(str(Path(__file__).resolve().parent.parent.parent))
    user.discard(None)
    kept = []
    for entry in path:
        if not isinstance(entry, str):
            continue
        if entry in ("", "."):
            continue
        real = _real(entry)
        if real is not None and real in user and real != ours and not is_site_dir(real):
            continue
        kept.append(entry)
    return kept


def enter(path: list[str] | None) -> None:
    """In the worker, before any upstream import: the module path becomes `path`."""
    if path is None:
        return
    sys.path[:] = path
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()


def imported_elsewhere(root: str | os.PathLike[str]) -> str | None:
    """Why the imported `megatron.core` is not the one at `root` (the report's Megatron), or
    None when it is (or none was imported)."""
    module = sys.modules.get("megatron.core")
    if module is None:
        return None
    file = getattr(module, "__file__", None)
    expected = _real(os.path.join(os.fspath(root), "megatron", "core", "__init__.py"))
    found = _real(file) if isinstance(file, str) else None
    if found is not None and found == expected:
        return None
    return (f"megatron.core was imported from {found or 'no file'}, not from "
            f"{os.fspath(root)} (a module earlier on the module path shadows it)")
