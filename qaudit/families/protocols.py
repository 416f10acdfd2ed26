"""The hooks a family folder implements, one protocol per stage (qaudit/families/__init__.py
lists the folders). Apart from the registry: the hooks take the config and the flag
translator's state, whose modules use the registry, so naming them there would be a circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from qaudit.load.model_config import ModelConfig
    from qaudit.load.sources.flag_state import FlagState


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
    def apply(self, t: FlagState) -> None:
        """Turn the family's command-line flags into config fields."""


class FamilySizes(Protocol):
    def stack_params(self, config: ModelConfig) -> int | None:
        """Weights of the layer stacks it builds; None: GPT's decoder (a config not of it)."""

    def mtp_layer_params(self, config: ModelConfig) -> int | None:
        """Weights of one MTP depth's layers; None: GPT's."""


class FamilyModel(Protocol):
    MODEL: type  # built with (config, dims, session), as GPTModel
