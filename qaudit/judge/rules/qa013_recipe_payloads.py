"""QA013 and QA014: recipe entries upstream would reject once a module matches them."""

from __future__ import annotations

from typing import Iterable

from qaudit.errors import InputError
from qaudit.judge.report import Finding
from qaudit.judge.rules import AuditFacts, rule


@rule("QA013", "error", "matcher names a config missing from 'configs'")
def check_missing(facts: AuditFacts) -> Iterable[Finding]:
    """An enabled matcher names a config that `configs` does not define. Upstream looks the
    name up only when the matcher fires, so a matcher that matches nothing today fails the
    day the model changes (`KeyError` at model construction). A matcher that does fire is
    an input error (exit 2) right away.
    """
    if facts.recipe is None:
        return
    for matcher in facts.recipe.matchers:
        if matcher.config not in facts.recipe.configs:
            yield Finding("QA013", "error", None,
                          f"matcher '{matcher.name}' names config '{matcher.config}', which is "
                          "not defined under 'configs'", facts.recipe.file, matcher.line,
                          "define the config or fix the name")


@rule("QA014", "error", "recipe config is invalid")
def check_payloads(facts: AuditFacts) -> Iterable[Finding]:
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
            yield Finding("QA014", "error", None, f"config '{name}': {exc.message}"
                          + (f" (key '{exc.key}')" if exc.key else ""),
                          exc.file, exc.line, "fix the payload; see `qaudit explain QA014`")
