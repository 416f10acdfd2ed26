"""QA013: a matcher names a config that `configs` does not define."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA013", "error", "matcher names a config missing from 'configs'")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """An enabled matcher names a config that `configs` does not define. Upstream looks the
    name up only when the matcher fires, so a matcher that matches nothing today fails the
    day the model changes (`KeyError` at model construction). A matcher that does fire is
    an input error (exit 2) right away.
    """
    if facts.recipe is None:
        return
    for matcher in facts.recipe.matchers:
        if matcher.config not in facts.recipe.configs:
            yield Hit(message=(f"matcher '{matcher.name}' names config '{matcher.config}', "
                               "which is not defined under 'configs'"),
                      file=facts.recipe.file, line=matcher.line,
                      fix="define the config or fix the name")
