"""Stage 1, load: input files become a ModelConfig and a QuantRecipe (no torch)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, Sequence

from qaudit.errors import InputError
from qaudit.load.bridge.mixed_precision import RecipeTable
from qaudit.load.config import ModelConfig, load_model_config
from qaudit.load.recipe import QuantRecipe, load_recipe
from qaudit.load.sources import load_source_config


def load_files(config_path: str, recipe_path: str | None = None,
                variables: Mapping[str, str] | None = None,
                overrides: Sequence[str] = (),
                recipe_table: Callable[[], RecipeTable] | None = None
                ) -> tuple[ModelConfig, QuantRecipe | None]:
    """Load the model config and its recipe (`--recipe` wins over `quant_recipe`).

    The config is a bash launch script (`.sh` or a shell shebang), a functional-test YAML with
    `MODEL_ARGS`, a Megatron-Bridge ConfigContainer YAML (with `overrides`: override files and
    `a.b=c` arguments, qaudit/load/bridge/) or a TransformerConfig YAML (see
    `qaudit.load.sources`). `recipe_table` gives the Bridge named-recipe table when a dump
    names one (qaudit's own by default).
    """
    from qaudit.load.run_files import one_run

    with one_run():  # each file read and parsed once, however many readers look at it
        return _load_files(config_path, recipe_path, variables, overrides, recipe_table)


def _load_files(config_path: str, recipe_path: str | None, variables: Mapping[str, str] | None,
                overrides: Sequence[str], recipe_table: Callable[[], RecipeTable] | None
                ) -> tuple[ModelConfig, QuantRecipe | None]:
    from qaudit.load import bridge

    path = Path(config_path)
    if bridge.is_bridge_file(path, config_path):
        config, recipe = bridge.load_bridge(path, config_path, overrides, recipe_table)
        if recipe_path is None:
            return config, recipe
    elif overrides:
        first = overrides[0]
        raise InputError(f"overrides ({getattr(first, 'label', first)}) apply to a "
                         "Megatron-Bridge ConfigContainer YAML only; this file is not one (no "
                         "top-level _target_ naming a ConfigContainer)", file=config_path)
    else:
        bridge.refuse_override_file(path, config_path)
        config = load_source_config(path, config_path, variables)
        if config is None:  # not a launch script nor MODEL_ARGS: a YAML of fields, or a recipe
            _refuse_recipe_file(path, config_path)
            config = load_model_config(path, config_path)
    if recipe_path is not None:
        config.quant_recipe = recipe_path
        return config, load_recipe(Path(recipe_path), recipe_path)
    if config.quant_recipe is None:
        return config, None
    # Relative to the config file, as a user reading the config expects.
    display = os.path.normpath(os.path.join(os.path.dirname(config_path), config.quant_recipe))
    if not os.path.isfile(display):  # False (not OSError) for a name too long or with a NUL
        raise InputError(f"recipe file {display!r} not found (paths are relative to the config file)",
                         file=config.file, line=config.line_of("quant_recipe"), key="quant_recipe")
    return config, load_recipe(Path(display), display)


def _refuse_recipe_file(path: Path, display: str) -> None:
    """A quant recipe (`configs` + `matchers`, e.g. Bridge's te_quant.cfg) given as the config."""
    from qaudit.load.yamlio import YamlMap, load_yaml

    try:
        document = load_yaml(path, display)
    except InputError:
        return
    if isinstance(document, YamlMap) and document and set(document) <= {"configs", "matchers"}:
        raise InputError("a quant recipe file (configs + matchers), not a model config: pass it "
                         "with --recipe beside the model config, or as the config's "
                         "quant_recipe", file=display, line=document.line_of(next(iter(document))),
                         key=str(next(iter(document))))
