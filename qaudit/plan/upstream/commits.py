"""Megatron-LM commits qaudit knows by name, and what `main` means.

A release number is not enough for everyone: Megatron-Bridge vendors Megatron-LM as a git
submodule pinned to a commit between releases. Each row here was read from that commit's
own code by qaudit's source reader (`scripts/megatron-releases check-commits`, which extracts
the commit's files with `git archive` and fails when the result differs from this table).

`main` is not a commit that was read whole: it is Megatron-LM main at `MAIN_READ_AT` (the
code qaudit's facts about main were read in) with PR #6965 applied, which was merged after
that commit and which changes what the TE wrappers pass (docs/megatron-releases.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qaudit.plan.upstream.releases import MegatronBehaviour

MAIN_READ_AT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"  # 2026-08-22, package 0.20.0
MAIN_ADDS = ("#6965",)  # merged after MAIN_READ_AT; #7353 (open) is not in main
MAIN_LABEL = f"Megatron-LM main ({MAIN_READ_AT[:8]} + PR {', '.join(MAIN_ADDS)})"
_SHORTEST_PREFIX = 7

# Both commits below read exactly as megatron-core 0.19.2 does: after #5642 (a quant_recipe
# re-arms), before #6965 (BF16 configs still get the flag).
_LEGACY = MegatronBehaviour(policy="legacy", passing="legacy",
                            rearm_on=("fp8", "fp4", "use_kitchen", "quant_recipe"),
                            te_recipes=True, will_execute_quantized=True)


@dataclass(frozen=True)
class KnownCommit:
    name: str  # what --megatron takes
    commit: str  # the full commit id
    date: str  # its commit date
    title: str  # what it is, short, for labels: "Megatron-Bridge v0.6.0's pin"
    described: str  # the same as a noun for notes: "Megatron-Bridge v0.6.0's pinned Megatron-LM"
    package_version: str  # megatron/core/package_info.py at that commit
    behaviour: MegatronBehaviour

    @property
    def short(self) -> str:
        return self.commit[:10]


COMMITS: tuple[KnownCommit, ...] = (
    KnownCommit("bridge-v0.6.0", "cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54", "2026-07-25",
                "Megatron-Bridge v0.6.0's pin", "Megatron-Bridge v0.6.0's pinned Megatron-LM",
                "0.19.0", _LEGACY),
    KnownCommit("d98e8a64", MAIN_READ_AT, "2026-08-22",
                "main as read, before PR #6965", "Megatron-LM main as read, before PR #6965",
                "0.20.0", _LEGACY),
)


def known_commit(spec: str | None) -> KnownCommit | None:
    """The commit `spec` names: its name, or a prefix of its id (at least 7 hex digits)."""
    if not spec:
        return None
    text = spec.strip().lower()
    for known in COMMITS:
        if text == known.name:
            return known
    if re.fullmatch(r"[0-9a-f]{%d,64}" % _SHORTEST_PREFIX, text):
        for known in COMMITS:
            if known.commit.startswith(text):
                return known
    return None


def commit_names() -> str:
    """`bridge-v0.6.0 (cd4afffa64), d98e8a64` for messages."""
    return ", ".join(known.name if known.commit.startswith(known.name)
                     else f"{known.name} ({known.short})" for known in COMMITS)
