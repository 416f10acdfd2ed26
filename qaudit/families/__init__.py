"""Model families beyond the GPT base (GPT dense, MoE, MLA and MTP): each family lives in its
own folder and owns its fields, flags, layers and sizes; the stages reach them only through
the hooks below (docs/design.md, "Adding a model family").

A family folder holds, each a module implementing one protocol:
- `fields.py` (load): `FamilyFields`, what the config's fields mean for it;
- `flags.py` (load): `FamilyFlags`, its launch-script and MODEL_ARGS flags;
- `sizes.py` (plan): `FamilySizes`, the weights it builds (for --full-size and the run cost);
- `model.py` (model, optional): `FamilyModel`, its own top-level model class, where the GPT
  model's tree does not fit (T5); `layers.py` holds the layers it builds.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from qaudit.load.config import ModelConfig
    from qaudit.load.sources.translate import Translator

# Every family beside the GPT base, by folder name. Adding a family: its folder, this line.
FAMILIES = ("hybrid", "t5")
BASE = "gpt"


class FamilyFields(Protocol):
    CHECKS: dict[str, Callable[[str, Any], Any]]  # its fields (declared in ModelConfig), checked

    def claims(self, config: ModelConfig) -> bool:
        """Whether `config` is a model of this family."""

    def counts_layers(self, values: dict[str, Any]) -> bool:
        """Whether the given fields set the layer count themselves (num_layers not needed)."""

    def resolve(self, config: ModelConfig, given: set[str]) -> None:
        """Derive fields from the family's own (defaults that differ from GPT's, counts)."""

    def validate(self, config: ModelConfig, fail: Callable[[str, str], None]) -> None:
        """Refuse, at the offending key, what upstream refuses for this family."""


class FamilyFlags(Protocol):
    def apply(self, t: Translator) -> None:
        """Turn the family's command-line flags into config fields."""


class FamilySizes(Protocol):
    def stack_params(self, config: ModelConfig) -> int | None:
        """Weights of the layer stacks it builds; None: GPT's decoder (a config not of it)."""

    def mtp_layer_params(self, config: ModelConfig) -> int | None:
        """Weights of one MTP depth's layers; None: GPT's."""


class FamilyModel(Protocol):
    MODEL: type  # built with (config, dims, session), as GPTModel


def parts(kind: str) -> list[ModuleType]:
    """Every family's `kind` module ("fields", "flags", "sizes", "model"), where it has one."""
    found = (_part(name, kind) for name in FAMILIES)
    return [module for module in found if module is not None]


def family_of(config: ModelConfig) -> str:
    """The family `config` belongs to: the first that claims it, else the GPT base."""
    for name in FAMILIES:  # every family has fields.py: it says which configs are its own
        if importlib.import_module(f"{__name__}.{name}.fields").claims(config):
            return name
    return BASE


def part_of(config: ModelConfig, kind: str) -> ModuleType | None:
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
