"""`--megatron auto|main|VERSION`: the Megatron a verdict is for, and whether a config can run on it.

`auto` audits the Megatron the audit's environment would import, with the behaviour read from
its code (qaudit/plan/upstream/detect.py); when there is none, or its code cannot be read, the newest
release qaudit knows, and every output says so. `main` and a release number name one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

from qaudit.load.config import ModelConfig
from qaudit.errors import InputError
from qaudit.plan.upstream.detect import UnreadableMegatron, locate_megatron, read_behaviour
from qaudit.plan.upstream.releases import (FIELD_SINCE, KNOWN, MAIN, NEWEST_RELEASE, RELEASES,
                                      MegatronBehaviour)

AUTO = "auto"
CHOOSE_HINT = "pass --megatron main or --megatron VERSION for the Megatron you run"


@dataclass(frozen=True)
class MegatronTarget:
    source: str  # "installed" (read from its code), "named" (--megatron), "assumed"
    version: str  # a release number, "main", a checkout's package_info number, or "unknown"
    behaviour: MegatronBehaviour
    location: str | None = None  # where the installed code is
    note: str | None = None  # why it is assumed, or how an install differs from its release
    kind: str = "package"  # "package" or "checkout"

    def label(self) -> str:
        if self.version == MAIN:
            return "Megatron-LM main"
        if self.kind == "checkout":
            return f"Megatron-LM checkout {self.version}"
        return f"megatron-core {self.version}"

    def how(self) -> str:
        """Why this Megatron: for the report header."""
        if self.source == "installed":
            return f"installed: {self.location}"
        if self.source == "named":
            return "--megatron"
        return f"assumed: {self.note}" if self.note else "assumed"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version,
                "policy": self.behaviour.policy, "label": self.label(),
                "location": self.location, "note": self.note}


def newest_release(note: str | None = None) -> MegatronTarget:
    return MegatronTarget("assumed", NEWEST_RELEASE, KNOWN[NEWEST_RELEASE], note=note)


def resolve_megatron(spec: str = AUTO, search_path: Sequence[str] | None = None) -> MegatronTarget:
    """The Megatron `--megatron SPEC` means; an unknown SPEC is an InputError (exit 2)."""
    if spec == AUTO:
        return _installed_or_assumed(search_path)
    version = spec[1:] if spec[:1] in ("v", "V") and spec[1:2].isdigit() else spec
    behaviour = KNOWN.get(version)
    if behaviour is None:
        raise InputError(f"--megatron {spec!r}: not a Megatron qaudit knows; use auto, main or "
                         f"a megatron-core release: {', '.join(RELEASES)}")
    return MegatronTarget("named", version, behaviour)


def _installed_or_assumed(search_path: Sequence[str] | None) -> MegatronTarget:
    location = locate_megatron(search_path)
    if location is None:
        return newest_release(f"no Megatron importable, the newest release qaudit knows; "
                              f"{CHOOSE_HINT}")
    try:
        behaviour = read_behaviour(location)
    except UnreadableMegatron as exc:
        return newest_release(f"found {location.describe()} but could not read its behaviour "
                              f"({exc}); {CHOOSE_HINT}")
    note = None
    released = KNOWN.get(location.version or "")
    if location.kind == "package" and released is not None and released != behaviour:
        note = (f"its code differs from the released {location.version} (patched?): "
                "audited as its code reads")
    return MegatronTarget("installed", location.version or "unknown", behaviour,
                          location=str(location.root), note=note, kind=location.kind)


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
