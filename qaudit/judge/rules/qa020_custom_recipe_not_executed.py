"""QA020: a module's recipe is `custom`; qaudit runs a stand-in for it."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.load.yamlio import short_repr


@rule("QA020", "info", "custom recipe not executed")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """A recipe selects `fp8_quantization_recipe: custom` (or `fp4_quantization_recipe:
    custom`) for some modules. Such a recipe is Python code: `custom_recipe_factory` names a
    quantizer factory ('pkg.module.factory') that Megatron imports and Transformer Engine calls
    for each tensor role.

    qaudit never imports it unless `--allow-import` is given: a config file must not be able
    to run code on the machine that audits it. Without the flag the factory is not imported;
    with it, the factory is imported and called once per linear-layer role to show what it
    returns. Either way the reference runtime cannot execute a TE recipe object, so those
    modules run a stand-in fake quantization (per-tensor FP8, or NVFP4 blocks for fp4), and
    their precision reads `fp8/custom (not executed)` (or `fp4/custom (not executed)`).

    The audit's verdicts still hold for them: whether a module is tracked, overwrites or
    accumulates `main_grad`, and how often it runs do not depend on the quantizer. What the
    stand-in does not reproduce is the custom recipe's numerics (`--verify` errors).
    """
    selected: dict[tuple[str, str, str], list[str]] = {}
    recipes = {}
    rows = facts.rows_by_name
    for module, (matcher, config) in facts.bindings.items():
        recipe = config.recipe_for(not facts.evaluation)
        row = rows.get(module)
        if recipe.quant is None or recipe.quant.recipe != "custom" or row is None \
                or "/custom" not in row.precision:
            continue
        key = (config.name, recipe.custom_recipe_factory or "", recipe.quant.fmt)
        selected.setdefault(key, []).append(module)
        recipes[key] = recipe
    for (name, factory, fmt), modules in selected.items():
        stand_in = "per-tensor FP8" if fmt == "fp8" else "NVFP4 (16-element blocks)"
        if facts.allow_import:
            outcome = facts.custom_factories.get(factory, "imported")
            message = (f"config '{name}': custom_recipe_factory {short_repr(factory)} was {outcome}; "
                       f"the reference runtime cannot execute it, so its {len(modules)} "
                       f"module(s) (e.g. {modules[0]}) ran {stand_in} fake quantization as a "
                       "stand-in")
            fix = "tracking and accumulation verdicts hold; numerics are the stand-in's"
        else:
            message = (f"config '{name}': custom_recipe_factory {short_repr(factory)} is Python code and "
                       f"was not imported; its {len(modules)} module(s) (e.g. {modules[0]}) ran "
                       f"{stand_in} fake quantization as a stand-in")
            fix = ("tracking and accumulation verdicts hold; pass --allow-import to import and "
                   "call the factory (runs its code)")
        yield Hit(message=message, file=facts.recipe.file if facts.recipe else None,
                  line=recipes[(name, factory, fmt)].line, fix=fix)
