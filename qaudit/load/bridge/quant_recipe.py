"""`model.quant_recipe` as Bridge serializes a RecipeConfig, read as Megatron matches it.

Bridge's YAML writer (`training/utils/config_utils.py`) turns Megatron's `RecipeConfig` into
`{_target_: ...RecipeConfig, matchers: [{_target_: ...GlobMatcher, pattern, config_key}, ...],
config_dict: {name: TEQuantizationParams payload}}`: the matchers keep their order (the first
match wins) but lose their names and `enabled` keys (only enabled ones were built). That is
turned into the `configs` + `matchers` form of `--te-precision-config-file` and handed to the
one recipe parser (qaudit/load/recipe.py), so payload checks and the recipe lints QA010-QA019
work and point at the dump's lines.
"""

from __future__ import annotations

from typing import Any

from qaudit.errors import InputError
from qaudit.load.bridge.nodes import plain, short_name, target_of
from qaudit.load.recipe import QuantRecipe, RecipeNote, recipe_from_document
from qaudit.load.yamlio import YamlList, YamlMap, did_you_mean, short_repr, type_name

_MATCHER_KEYS = ("_target_", "pattern", "config_key")
_RECIPE_KEYS = ("_target_", "matchers", "config_dict")


def recipe_from_node(node: Any, file: str, line: int | None) -> QuantRecipe:
    def fail(message: str, at: int | None, key: str) -> InputError:
        return InputError(message, file=file, line=at, key=key)

    if isinstance(node, str):
        raise fail("a recipe file path here is not what Bridge writes (it serializes the "
                   "loaded RecipeConfig); pass the file with --recipe instead", line,
                   "model.quant_recipe")
    if not isinstance(node, YamlMap) or short_name(target_of(node) or "") != "RecipeConfig":
        raise fail(f"expected a serialized RecipeConfig (_target_ ...RecipeConfig with matchers "
                   f"and config_dict), got {type_name(node)} {short_repr(node)}", line,
                   "model.quant_recipe")
    notes: list[RecipeNote] = []
    notes.extend(_unknown_fields(node, _RECIPE_KEYS, "RecipeConfig",
                                 "Megatron's recipe matching does not read it"))
    configs = node.get("config_dict")
    if configs is None:
        configs = YamlMap(line=node.line_of("config_dict"))
    if not isinstance(configs, YamlMap):
        raise fail(f"expected a mapping of config names to TEQuantizationParams, got "
                   f"{type_name(configs)}", node.line_of("config_dict"),
                   "model.quant_recipe.config_dict")
    matchers = node.get("matchers")
    if matchers is None:
        matchers = YamlList(line=node.line_of("matchers"))
    if not isinstance(matchers, list):
        raise fail(f"expected a list of GlobMatcher, got {type_name(matchers)}",
                   node.line_of("matchers"), "model.quant_recipe.matchers")
    document = YamlMap(line=node.line)
    document["configs"] = plain(configs)
    document.key_lines["configs"] = node.line_of("config_dict")
    table = YamlMap(line=node.line_of("matchers"))
    for index, item in enumerate(matchers):
        name = f"matchers[{index}]"
        at = item.line if isinstance(item, YamlMap) else getattr(matchers, "line", line)
        if not isinstance(item, YamlMap):
            raise fail(f"expected a GlobMatcher mapping, got {type_name(item)} "
                       f"{short_repr(item)}", at, f"model.quant_recipe.{name}")
        kind = short_name(target_of(item) or "")
        if kind != "GlobMatcher":
            raise fail(f"matcher class {short_repr(target_of(item))} is not supported: "
                       "Megatron's recipe matching has GlobMatcher only", item.line_of("_target_"),
                       f"model.quant_recipe.{name}._target_")
        notes.extend(_unknown_fields(item, _MATCHER_KEYS, name, "Megatron ignores it"))
        body = YamlMap(line=at)
        for ours, theirs in (("type", None), ("pattern", "pattern"), ("config", "config_key"),
                             ("enabled", None)):
            body[ours] = {"type": "glob", "enabled": True}.get(ours) if theirs is None \
                else item.get(theirs)
            body.key_lines[ours] = item.line_of(theirs) if theirs else at
            if theirs is not None and theirs not in item:
                raise fail("GlobMatcher lacks required field", at,
                           f"model.quant_recipe.{name}.{theirs}")
        table[name] = body
        table.key_lines[name] = at
    document["matchers"] = table
    document.key_lines["matchers"] = node.line_of("matchers")
    return recipe_from_document(document, file, notes=notes)


def _unknown_fields(node: YamlMap, known, owner: str, consequence: str) -> list[RecipeNote]:
    """A QA019 note for each key of `node` that Megatron's RecipeConfig / GlobMatcher lacks."""
    return [RecipeNote("QA019", f"{owner}: unknown field {short_repr(str(key))}"
                       f"{did_you_mean(str(key), known)}; {consequence}", node.line_of(key),
                       "remove it, or fix its name") for key in node if key not in known]
