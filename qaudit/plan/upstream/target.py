"""`--megatron auto|main|VERSION|COMMIT|PATH`: the Megatron a verdict is for, and whether a
config can run on it.

`auto` audits the Megatron the audit's environment would import, with the behaviour read from
its code (qaudit/plan/upstream/detect.py); when there is none, or its code cannot be read, the
Megatron the config's writer pins when the loader knows one (`ConfigSource.assumed_megatron`,
e.g. a Megatron-Bridge dump), else the newest release qaudit knows, and every output says so.
`main`, a release number or a known commit (qaudit/plan/upstream/commits.py) names one; a
PATH names a checkout or an installed megatron-core directory, read as `auto` reads its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

from qaudit.load.config import ModelConfig
from qaudit.errors import InputError
from qaudit.plan.upstream.bounded import home_expanded, is_dir, names_a_path, shown
from qaudit.plan.upstream.commits import MAIN_LABEL, KnownCommit, commit_names, known_commit
from qaudit.plan.upstream.detect import (MegatronLocation, UnreadableMegatron, locate_megatron,
                                         megatron_at, read_behaviour)
from qaudit.plan.upstream.releases import (FIELD_SINCE, KNOWN, MAIN, NEWEST_RELEASE, RELEASES,
                                      MegatronBehaviour, yank_note)

AUTO = "auto"
CHOOSE_HINT = "pass --megatron main or --megatron VERSION for the Megatron you run"


@dataclass(frozen=True)
class MegatronTarget:
    source: str  # "installed" (read from its code), "named" (--megatron), "assumed"
    # A release number, "main", a known commit's name, a checkout's package_info number, or
    # "unknown".
    version: str
    behaviour: MegatronBehaviour
    location: str | None = None  # where the code read is (installed, or --megatron PATH)
    note: str | None = None  # why it is assumed, or how an install differs from its release
    kind: str = "package"  # "package", "checkout" or "commit" (a known commit, not on disk)
    commit: str | None = None  # the full commit id: a known commit, or a git checkout's HEAD

    def label(self) -> str:
        if self.version == MAIN:
            return MAIN_LABEL
        known = known_commit(self.commit) if self.commit else None
        if self.kind == "commit" and known is not None:
            return f"Megatron-LM {known.short} ({known.title})"
        if self.kind == "checkout":
            at = f" at {self.commit[:10]}" if self.commit else ""
            return f"Megatron-LM checkout {self.version}{at}" + (f" ({known.title})" if known else "")
        return f"megatron-core {self.version}"

    def how(self) -> str:
        """Why this Megatron: for the report header."""
        if self.source == "installed":
            return f"installed: {self.location}"
        if self.source == "named":
            return "--megatron" + (f" {self.location}" if self.location else "")
        return f"assumed: {self.note}" if self.note else "assumed"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version,
                "policy": self.behaviour.policy, "label": self.label(),
                "location": self.location, "note": self.note,
                **({"commit": self.commit} if self.commit else {})}


def newest_release(note: str | None = None) -> MegatronTarget:
    return MegatronTarget("assumed", NEWEST_RELEASE, KNOWN[NEWEST_RELEASE], note=note)


def resolve_megatron(spec: str = AUTO, search_path: Sequence[str] | None = None,
                     assumed: str | None = None) -> MegatronTarget:
    """The Megatron `--megatron SPEC` means; an unknown SPEC is an InputError (exit 2).
    `assumed` (a known commit's name) is what `auto` falls back to when it reads no Megatron:
    the Megatron the config's writer pins (Megatron-Bridge's, for its dumps)."""
    if spec == AUTO:
        return _installed_or_assumed(search_path, assumed)
    version = spec[1:] if spec[:1] in ("v", "V") and spec[1:2].isdigit() else spec
    behaviour = KNOWN.get(version)
    if behaviour is not None:
        return MegatronTarget("named", version, behaviour, note=yank_note(version))
    known = known_commit(spec)
    if known is not None:
        return _commit_target("named", known)
    if names_a_path(spec):
        return _at_path(spec)
    raise InputError(f"--megatron {spec!r}: not a Megatron qaudit knows; use auto, main, "
                     f"a megatron-core release ({', '.join(RELEASES)}), a Megatron-LM commit "
                     f"qaudit knows ({commit_names()}) or the path of a Megatron-LM checkout")


def _commit_target(source: str, known: KnownCommit, note: str | None = None) -> MegatronTarget:
    return MegatronTarget(source, known.name, known.behaviour, note=note, kind="commit",
                          commit=known.commit)


def _at_path(spec: str) -> MegatronTarget:
    path = home_expanded(spec, "--megatron")
    if not is_dir(path):
        raise InputError(f"--megatron {shown(spec)}: no such directory")
    location = megatron_at(path)
    if location is None:
        raise InputError(f"--megatron {shown(spec)}: no megatron/core/ there; give a Megatron-LM "
                         "checkout, or the directory an installed megatron/core/ is in")
    try:
        behaviour = read_behaviour(location)
    except UnreadableMegatron as exc:
        raise InputError(f"--megatron {shown(spec)}: cannot read its behaviour ({exc}); "
                         f"{CHOOSE_HINT}") from None
    return MegatronTarget("named", location.version or "unknown", behaviour,
                          location=str(location.root), note=_differences(location, behaviour),
                          kind=location.kind, commit=location.commit)


def _installed_or_assumed(search_path: Sequence[str] | None,
                          assumed: str | None) -> MegatronTarget:
    location = locate_megatron(search_path)
    if location is None:
        return _assumed(assumed, "no Megatron importable",
                        "no Megatron importable, the newest release qaudit knows")
    try:
        behaviour = read_behaviour(location)
    except UnreadableMegatron as exc:
        why = f"found {location.describe()} but could not read its behaviour ({exc})"
        return _assumed(assumed, why, why)
    return MegatronTarget("installed", location.version or "unknown", behaviour,
                          location=str(location.root), note=_differences(location, behaviour),
                          kind=location.kind, commit=location.commit)


def _assumed(assumed: str | None, why: str, newest_why: str) -> MegatronTarget:
    """The writer's pin when `assumed` names a known commit, else the newest release."""
    known = known_commit(assumed)
    if known is None:
        return newest_release(f"{newest_why}; {CHOOSE_HINT}")
    return _commit_target("assumed", known, note=(
        f"the config's writer pins it ({why}); {CHOOSE_HINT}"))


def _differences(location: MegatronLocation, behaviour: MegatronBehaviour) -> str | None:
    """How the code read differs from what its version or commit says, if it does."""
    notes = []
    if location.kind == "package" and yank_note(location.version):
        notes.append(yank_note(location.version))
    released = KNOWN.get(location.version or "")
    if location.kind == "package" and released is not None and released != behaviour:
        notes.append(f"its code differs from the released {location.version} (patched?): "
                     "audited as its code reads")
    known = known_commit(location.commit)
    if location.kind == "checkout" and known is not None and known.behaviour != behaviour:
        notes.append(f"its code differs from {known.described} {known.short} (modified?): "
                     "audited as its code reads")
    if location.version_problem:
        notes.append(f"no version ({location.version_problem})" if location.version is None
                     else f"version from package_info.py ({location.version_problem})")
    if location.via:
        notes.append(f"imported {location.via}" if location.via.startswith("via")
                     else f"imported through an {location.via}")
    return "; ".join(notes) or None


_DEFAULTS = {f.name: f.default for f in fields(ModelConfig)}


def check_config_runs_on(config: ModelConfig, target: MegatronTarget) -> None:
    """A config that sets what the target Megatron does not have cannot run there: exit 2,
    rather than a verdict about a run that cannot happen."""
    written = config.source.mapping if config.source is not None else {}
    for name in sorted(target.behaviour.missing_fields):
        # Only what the input sets: values qaudit derives (moe_ffn_hidden_size from
        # ffn_hidden_size, ...) are not settings the user's Megatron would be given.
        if name not in written or getattr(config, name) == _DEFAULTS.get(name):
            continue
        raise InputError(f"{name} is set, but {_whose(target)} has no such setting (it came in "
                         f"megatron-core {FIELD_SINCE[name]}); {CHOOSE_HINT}",
                         file=config.file, line=config.line_of(name), key=name)
    if config.quant_recipe is not None and not target.behaviour.te_recipes:
        raise InputError(f"a quant recipe is set, but {_whose(target)} cannot read TE quant "
                         f"recipes (TEQuantizationParams came in megatron-core 0.16.0); "
                         f"{CHOOSE_HINT}", file=config.file, line=config.line_of("quant_recipe"),
                         key="quant_recipe")


def _whose(target: MegatronTarget) -> str:
    if target.source == "installed":
        return f"the installed {target.label()} ({target.location})"
    if target.source == "assumed":
        return f"{target.label()} (assumed: no Megatron was read)"
    return target.label()
