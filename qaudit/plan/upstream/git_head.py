"""The commit a Megatron-LM checkout has checked out, read from its `.git` without running git.

git is not run: it may be missing, it reads the user's git config (which can run programs),
and the checkout may be a pull request's. The few files that name HEAD's commit are read
through `bounded.read_regular`:

- `.git` is a directory, or a file `gitdir: PATH` (a submodule such as Megatron-Bridge's
  `3rdparty/Megatron-LM`, or a worktree), PATH relative to the checkout;
- a worktree's gitdir names the shared repository in `commondir`;
- `HEAD` is a commit id (detached, as submodules are) or `ref: refs/...`, found as a loose
  ref file, else in `packed-refs`; a ref naming another ref is followed a few times.
Anything else (no `.git`, an odd file, a ref not found) is no commit.
"""

from __future__ import annotations

import re
from pathlib import Path

from qaudit.plan.upstream.bounded import RefusedRead, is_dir, read_text

_SMALL = 4096  # HEAD, a loose ref, a `.git` file, commondir: one short line each
_PACKED_REFS = 16 * 1024 * 1024  # tens of thousands of refs in a large repository
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 object names
_REF = re.compile(r"refs/[A-Za-z0-9._/+-]{1,200}")
_FOLLOWED = 5


def checkout_commit(root: Path) -> str | None:
    """The full commit id `root`'s checkout has at HEAD, or None."""
    gitdir = _gitdir(root)
    if gitdir is None:
        return None
    common = _common_dir(gitdir)
    head = _first_line(gitdir / "HEAD")
    for _ in range(_FOLLOWED):
        if head is None:
            return None
        if _COMMIT.fullmatch(head):
            return head
        if not head.startswith("ref:"):
            return None
        ref = head[4:].strip()
        if not _REF.fullmatch(ref) or ".." in ref:
            return None
        head = (_first_line(gitdir / ref) or _first_line(common / ref)
                or _packed(common / "packed-refs", ref))
    return None


def _gitdir(root: Path) -> Path | None:
    dotgit = root / ".git"
    if is_dir(dotgit):
        return dotgit
    line = _first_line(dotgit)
    if line is None or not line.startswith("gitdir:"):
        return None
    target = Path(line[len("gitdir:"):].strip())
    gitdir = target if target.is_absolute() else root / target
    return gitdir if is_dir(gitdir) else None


def _common_dir(gitdir: Path) -> Path:
    line = _first_line(gitdir / "commondir")
    if not line:
        return gitdir
    common = Path(line)
    common = common if common.is_absolute() else gitdir / common
    return common if is_dir(common) else gitdir


def _first_line(path: Path) -> str | None:
    try:
        text = read_text(path, _SMALL)
    except RefusedRead:
        return None
    lines = text.splitlines()
    return lines[0].strip() if lines else None


def _packed(path: Path, ref: str) -> str | None:
    """The commit `packed-refs` gives `ref`: lines `<id> <ref>`, `^<id>` peeling tags."""
    try:
        text = read_text(path, _PACKED_REFS)
    except RefusedRead:
        return None
    for line in text.splitlines():
        commit, _, name = line.partition(" ")
        if name == ref and _COMMIT.fullmatch(commit):
            return commit
    return None
