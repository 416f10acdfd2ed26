"""QA012: a matcher that matches modules but never wins them."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA012", "warning", "recipe matcher is shadowed by an earlier one")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Matchers are tried in order and the first enabled match wins, with no fall-through. A
    matcher whose every matching module is already taken by earlier matchers can never take
    effect.
    """
    if facts.recipe is None:
        return
    for index, matcher in enumerate(facts.recipe.matchers):
        matched = [name for name in facts.te_match_names() if matcher.matches(name)]
        if not matched:
            continue
        winners = {facts.recipe.match(name) for name in matched}
        if matcher in winners:
            continue
        earlier = sorted({w.name for w in winners if w is not None})
        yield Hit(message=(f"matcher '{matcher.name}' never wins: all {len(matched)} module(s) "
                           f"it matches are taken by earlier matcher(s) {', '.join(earlier)}"),
                  file=facts.recipe.file, line=matcher.line,
                  fix="move it above the broader matcher, or narrow the earlier pattern")
