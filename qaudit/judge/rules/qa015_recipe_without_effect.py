"""QA015 and QA016: recipes that do not do what they seem to."""

from __future__ import annotations

from typing import Iterable

from qaudit.load.precision import precision_label
from qaudit.judge.report import Finding
from qaudit.judge.rules import AuditFacts, rule


@rule("QA015", "warning", "recipe cannot take effect in a BF16 context")
def check_no_effect(facts: AuditFacts) -> Iterable[Finding]:
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
        yield Finding("QA015", "warning", None,
                      f"config '{name}' asks for {precision_label(recipe.quant)}, but its "
                      f"{len(modules)} module(s) (e.g. {modules[0]}) run in a BF16 context and "
                      "override_nonquantized_autocast is false: they stay bf16",
                      facts.recipe.file if facts.recipe else None, recipe.line,
                      "set override_nonquantized_autocast: true in this recipe")


@rule("QA016", "info", "evaluation recipe differs in precision from training")
def check_eval(facts: AuditFacts) -> Iterable[Finding]:
    """A config's `evaluation_recipe` executes in another precision than its
    `training_recipe`: evaluation numbers are then measured in a different precision from the
    one the model is trained in. Often deliberate; reported so that it is seen.
    """
    seen = set()
    for matcher, config in facts.bindings.values():
        if config.name in seen or config.evaluation is None:
            continue
        seen.add(config.name)
        train, evaluate = config.training.quant, config.evaluation.quant
        if train != evaluate:
            yield Finding("QA016", "info", None,
                          f"config '{config.name}' trains in {precision_label(train)} and "
                          f"evaluates in {precision_label(evaluate)}",
                          facts.recipe.file if facts.recipe else None, config.evaluation.line,
                          "check this is intended (eval recipes are not yet verified upstream "
                          "with CUDA graphs or recompute)")
