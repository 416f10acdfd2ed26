"""QA017: recipe patterns with layer numbers break under pipeline parallelism."""

from __future__ import annotations

import re
from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule

_LAYER_NUMBER = re.compile(r"layers\.(\d|\[[0-9])")


@rule("QA017", "warning", "layer-number pattern under pipeline parallelism")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Module names use the layer's position inside its pipeline stage (or virtual chunk),
    not its global layer number: with `pipeline_model_parallel_size > 1`,
    `decoder.layers.0.…` exists once per stage. A pattern naming a layer number then matches
    one layer in every stage, not one layer of the model.

    Fix: use `first_last_layers_bf16` with `num_layers_at_start_in_bf16` /
    `num_layers_at_end_in_bf16` for the first/last layers, or patterns without numbers.
    """
    if facts.recipe is None or facts.config.pipeline_model_parallel_size <= 1:
        return
    for matcher in facts.recipe.matchers:
        if _LAYER_NUMBER.search(matcher.pattern):
            yield Hit(message=(f"matcher '{matcher.name}' (pattern {matcher.pattern!r}) names "
                               "a layer number, but with pipeline_model_parallel_size="
                               f"{facts.config.pipeline_model_parallel_size} module names use "
                               "stage-local layer indices"),
                      file=facts.recipe.file, line=matcher.line,
                      fix="use first_last_layers_bf16 or a pattern without layer numbers")
