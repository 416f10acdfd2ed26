"""QA010: a matcher without `enabled: true` is silently skipped upstream."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA010", "warning", "recipe matcher is not enabled")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Megatron's recipe matchers default to `enabled: false`: a matcher that does not say
    `enabled: true` is skipped without a word, and the modules it was meant for keep their
    ambient precision. A matcher written with an explicit `enabled: false` is taken as
    deliberate and not reported.
    """
    if facts.recipe is None:
        return
    for matcher in facts.recipe.disabled_matchers:
        if not matcher.explicit:
            yield Hit(message=(f"matcher '{matcher.name}' has no 'enabled: true' and is ignored "
                               "(matchers are disabled by default)"),
                      file=facts.recipe.file, line=matcher.line,
                      fix=(f"add 'enabled: true' to '{matcher.name}', or 'enabled: false' if "
                           "it is parked on purpose"))
