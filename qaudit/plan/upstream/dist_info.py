"""The version an installed distribution declares, read from its METADATA beside the package
(never by importing it). Shared by the Megatron and the TE detection."""

from __future__ import annotations

import re
from pathlib import Path

_VERSION = re.compile(r"^Version:\s*(\S+)", re.MULTILINE)


def dist_info_version(root: Path, prefix: str) -> str | None:
    """The `Version:` of the first `<prefix>*.dist-info` under `root` that has one."""
    try:
        candidates = sorted(root.glob(f"{prefix}*.dist-info"))
    except OSError:
        return None
    for info in candidates:
        try:
            metadata = (info / "METADATA").read_text(errors="replace")[:65536]
        except OSError:
            continue
        match = _VERSION.search(metadata)
        if match:
            return match.group(1)
    return None
