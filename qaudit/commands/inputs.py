"""The inputs of `check` and `diff`, loaded and planned without torch, so that a missing,
empty or malformed file is refused before the heavy imports."""

from __future__ import annotations

from typing import Mapping, Sequence

from qaudit.errors import InputError
from qaudit.load import load_files
from qaudit.load.bridge import locate_error
from qaudit.load.config import ModelConfig
from qaudit.load.recipe import QuantRecipe
from qaudit.plan import check_plan


def load_inputs(config_path: str, recipe_path: str | None = None,
                variables: Mapping[str, str] | None = None,
                overrides: Sequence[str] = (), megatron: object = "auto"
                ) -> tuple[ModelConfig, QuantRecipe | None]:
    """The inputs, loaded (qaudit/load) and checked against what the plan needs (a pipeline
    split Megatron would reject is refused here). `megatron` (`--megatron`'s spec or target)
    also says where a Bridge's named-recipe table is read from."""
    from qaudit.plan.upstream.bridge_recipes import recipe_table_for

    config, recipe = load_files(config_path, recipe_path, variables, overrides,
                                lambda: recipe_table_for(megatron))
    try:
        check_plan(config)
    except InputError as exc:
        raise locate_error(exc, config.source) from None
    return config, recipe
