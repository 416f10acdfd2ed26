"""The interpreter's own install locations, the only places a Megatron counts as installed.

A `megatron_core-*.dist-info` says nothing about who put it there: a pull request can add one
beside its tree on PYTHONPATH. What the environment installed lives in the interpreter's
site-packages (sysconfig's purelib and platlib, `site.getsitepackages()`, the user's
site-packages where Python enables it), which a checkout's files cannot become.
"""

from __future__ import annotations

import os
import site
import sysconfig


def _real(path: str) -> str | None:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return None


def site_dirs() -> frozenset[str]:
    """The resolved site-packages directories of this interpreter."""
    found = [sysconfig.get_paths().get(key) for key in ("purelib", "platlib")]
    found += list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return frozenset(real for real in map(_real, filter(None, found)) if real)


def is_site_dir(path: str | os.PathLike[str]) -> bool:
    real = _real(os.fspath(path))
    return real is not None and real in site_dirs()
