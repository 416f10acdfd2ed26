"""QA011 and QA012: matchers that match no module, or never win."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.report import Finding
from qaudit.judge.rules import AuditFacts, rule


@rule("QA011", "warning", "recipe matcher matches no module")
def check(facts: AuditFacts) -> Iterable[Finding]:
    """An enabled matcher's glob matches none of the model's TE module names, so it does
    nothing. Usually a typo or a name from another model layout (module names are
    `decoder.layers.N.…`, `mtp.layers.K.…`, `output_layer`, rooted at GPTModel with no
    `module.` prefix).
    """
    if facts.recipe is None:
        return
    for matcher in facts.recipe.matchers:
        if not any(matcher.matches(name) for name in facts.te_match_names()):
            yield Finding("QA011", "warning", None,
                          f"matcher '{matcher.name}' (pattern {matcher.pattern!r}) matches no TE "
                          "module of this model", facts.recipe.file, matcher.line,
                          "check the pattern against the module names in the table")


@rule("QA012", "warning", "recipe matcher is shadowed by an earlier one")
def check_shadowed(facts: AuditFacts) -> Iterable[Finding]:
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
        yield Finding("QA012", "warning", None,
                      f"matcher '{matcher.name}' never wins: all {len(matched)} module(s) it "
                      f"matches are taken by earlier matcher(s) {', '.join(earlier)}",
                      facts.recipe.file, matcher.line,
                      "move it above the broader matcher, or narrow the earlier pattern")
