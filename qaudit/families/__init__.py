"""Model families beyond the GPT base (GPT dense, MoE, MLA and MTP): each family lives in its
own folder and owns its fields, flags, layers and sizes; the stages reach them only through
the registry below (docs/design.md, "Adding a model family").

A family folder holds, each a module implementing one protocol of
qaudit/families/protocols.py:
- `fields.py` (load): `FamilyFields`, what the config's fields mean for it;
- `flags.py` (load): `FamilyFlags`, its launch-script and MODEL_ARGS flags;
- `sizes.py` (plan): `FamilySizes`, the weights it builds (for --full-size and the run cost);
- `model.py` (model, optional): `FamilyModel`, its own top-level model class, where the GPT
  model's tree does not fit (T5); `layers.py` holds the layers it builds.

The registry names no type of a stage (a config is `Any` here): qaudit/load/model_config.py
uses it, so naming `ModelConfig` would be an import circle.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

# Every family beside the GPT base, by folder name. Adding a family: its folder, this line.
FAMILIES = ("hybrid", "t5")
BASE = "gpt"


def parts(kind: str) -> list[ModuleType]:
    """Every family's `kind` module ("fields", "flags", "sizes", "model"), where it has one."""
    found = (_part(name, kind) for name in FAMILIES)
    return [module for module in found if module is not None]


def family_of(config: Any) -> str:
    """The family `config` belongs to: the first that claims it, else the GPT base."""
    for name in FAMILIES:  # every family has fields.py: it says which configs are its own
        if importlib.import_module(f"{__name__}.{name}.fields").claims(config):
            return name
    return BASE


def part_of(config: Any, kind: str) -> ModuleType | None:
    """The `kind` module of `config`'s family; None for the GPT base or where it has none."""
    family = family_of(config)
    return None if family == BASE else _part(family, kind)


def _part(family: str, kind: str) -> ModuleType | None:
    name = f"{__name__}.{family}.{kind}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:  # a missing import inside the module is a bug, not an absence
            raise
        return None
