"""QA016: a config evaluates in another precision than it trains in."""

from __future__ import annotations

from typing import Iterable

from qaudit.load.precision import precision_label
from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA016", "info", "evaluation recipe differs in precision from training")
def check(facts: AuditFacts) -> Iterable[Hit]:
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
            yield Hit(message=(f"config '{config.name}' trains in {precision_label(train)} and "
                               f"evaluates in {precision_label(evaluate)}"),
                      file=facts.recipe.file if facts.recipe else None, line=config.evaluation.line,
                      fix=("check this is intended (eval recipes are not yet verified upstream "
                           "with CUDA graphs or recompute)"))
