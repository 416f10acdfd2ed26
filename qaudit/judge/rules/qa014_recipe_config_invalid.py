"""QA014: a config under `configs` upstream would reject once a module matches it."""

from __future__ import annotations

from typing import Iterable

from qaudit.errors import InputError
from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA014", "error", "recipe config is invalid")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """A config under `configs` is not a valid `TEQuantizationParams` payload: an unknown or
    rejected recipe name (`delayed` scaling in a per-module recipe, fp8 and fp4 in one recipe,
    `custom` without `custom_recipe_factory`), an unknown field, a wrong type. Upstream checks
    a payload only when a module matches it; a payload that a module matches is an input
    error (exit 2), one that nothing matches yet is reported here.
    """
    if facts.recipe is None:
        return
    for name in facts.recipe.configs:
        try:
            facts.recipe.parse_config(name)
        except InputError as exc:
            yield Hit(message=(f"config '{name}': {exc.message}"
                               + (f" (key '{exc.key}')" if exc.key else "")),
                      file=exc.file, line=exc.line,
                      fix="fix the payload; see `qaudit explain QA014`")
