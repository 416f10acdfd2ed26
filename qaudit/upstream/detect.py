"""Find the user's Megatron (megatron-core or a Megatron-LM checkout) without importing it.

Minimal version for the cross-check branch: the integrator's fuller `detect.py` ("Audit the
Megatron the user runs") replaces it at merge; the signature and fields are the agreed ones.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

_VERSION_PART = re.compile(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*(\d+|'[^']*'|\"[^\"]*\")",
                           re.MULTILINE)


@dataclass(frozen=True)
class MegatronLocation:
    root: Path  # the sys.path entry that holds megatron/core/
    version: str | None
    kind: Literal["package", "checkout"]


def locate_megatron(search_path: Iterable[str] | None = None) -> MegatronLocation | None:
    """The first entry of `search_path` (default sys.path) holding `megatron/core/`, as
    `import megatron.core` would find it; None when there is none."""
    for entry in (sys.path if search_path is None else search_path):
        root = Path(entry or ".")
        core = root / "megatron" / "core"
        if (core / "__init__.py").is_file():
            return MegatronLocation(root.resolve(), _read_version(core), _kind_of(root))
    return None


def _read_version(core: Path) -> str | None:
    """MAJOR.MINOR.PATCH[PRE] from package_info.py, read as text (importing it runs git)."""
    try:
        text = (core / "package_info.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    parts = {name: value.strip("'\"") for name, value in _VERSION_PART.findall(text)}
    if not {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"


def _kind_of(root: Path) -> Literal["package", "checkout"]:
    """A checkout has the repository's own files beside megatron/; an installed or unpacked
    package has a megatron_core-*.dist-info (or nothing else)."""
    if (root / ".git").exists() or (root / "pretrain_gpt.py").is_file():
        return "checkout"
    return "package"
