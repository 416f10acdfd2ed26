"""The version an installed distribution declares, read from its METADATA beside the package
(never by importing it). Shared by the Megatron and the TE detection and by `qaudit env`.

Whatever the file holds, the answer is a version or None with the reason: METADATA is read
through `bounded.read_regular` (a regular file, its first 64 KiB), and a version longer than
64 characters or with characters no version has is no version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from qaudit.plan.upstream.bounded import RefusedRead, names_in, read_text, shown

METADATA_BYTES = 64 * 1024  # the headers come first; a long description may follow
MAX_VERSION_CHARS = 64
_VERSION_LINE = re.compile(r"^Version:[ \t]*(\S*)", re.MULTILINE)
# PEP 440 versions and local labels, with the few extra characters dev builds use.
_VERSION_TEXT = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]*")


@dataclass(frozen=True)
class VersionRead:
    version: str | None
    problem: str | None = None  # why there is no version, for the report's note


def plausible_version(text: str) -> str | None:
    """Why `text` is not a version qaudit will show, or None when it is one."""
    if len(text) > MAX_VERSION_CHARS:
        return f"a version of {len(text)} characters (over {MAX_VERSION_CHARS})"
    if not _VERSION_TEXT.fullmatch(text):
        return "a version with characters no version has"
    return None


def dist_info_version(root: Path, prefix: str) -> VersionRead:
    """The `Version:` of the first `<prefix>*.dist-info` under `root` that has one."""
    problems = []
    for name in names_in(root, starting=prefix, ending=".dist-info", most=16):
        try:
            metadata = read_text(root / name / "METADATA", METADATA_BYTES)
        except RefusedRead as exc:
            problems.append(str(exc))
            continue
        match = _VERSION_LINE.search(metadata)
        if not match:
            problems.append(f"{shown(root / name / 'METADATA')} has no Version")
            continue
        problem = plausible_version(match.group(1))
        if problem is None:
            return VersionRead(match.group(1))
        problems.append(f"{shown(root / name / 'METADATA')} holds {problem}")
    return VersionRead(None, "; ".join(problems[:2]) or None)


def installed_version(names: Sequence[str], search_path: Sequence[str]) -> VersionRead:
    """What `importlib.metadata.version` answers for the first of `names` found along
    `search_path`, read the bounded way (importlib reads a whole METADATA, whatever it is)."""
    problems = []
    for entry in search_path:
        if not isinstance(entry, str) or entry in ("", "."):
            continue
        for name in names:
            found = dist_info_version(Path(entry), re.sub(r"[-_.]+", "_", name) + "-")
            if found.version is not None:
                return found
            if found.problem:
                problems.append(found.problem)
    return VersionRead(None, "; ".join(problems[:2]) or None)
