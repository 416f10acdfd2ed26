"""QA015: a recipe that cannot take effect in the BF16 context of its modules."""

from __future__ import annotations

from typing import Iterable

from qaudit.load.precision import precision_label
from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA015", "warning", "recipe cannot take effect in a BF16 context")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """A recipe names an fp8/fp4 format, but the modules it is bound to run in a BF16 ambient
    context (no global fp8/fp4 there, or a first/last BF16 layer) and the recipe leaves
    `override_nonquantized_autocast` at its default, false. The recipe is then not applied:
    those modules stay in high precision.

    Fix: set `override_nonquantized_autocast: true` in the recipe, or set the global fp8/fp4.
    """
    affected: dict[str, list[str]] = {}
    for module, (matcher, config) in facts.bindings.items():
        recipe = config.recipe_for(not facts.evaluation)
        records = facts.records.get(module, [])
        if (recipe.quant is not None and not recipe.override_nonquantized_autocast and records
                and all(r.ambient is None for r in records)):
            affected.setdefault(config.name, []).append(module)
    for name, modules in affected.items():
        config = facts.bindings[modules[0]][1]
        recipe = config.recipe_for(not facts.evaluation)
        yield Hit(message=(f"config '{name}' asks for {precision_label(recipe.quant)}, but its "
                           f"{len(modules)} module(s) (e.g. {modules[0]}) run in a BF16 context "
                           "and override_nonquantized_autocast is false: they stay bf16"),
                  file=facts.recipe.file if facts.recipe else None, line=recipe.line,
                  fix="set override_nonquantized_autocast: true in this recipe")
