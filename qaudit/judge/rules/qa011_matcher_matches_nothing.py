"""QA011: an enabled matcher matches no module of the model."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA011", "warning", "recipe matcher matches no module")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """An enabled matcher's glob matches none of the model's TE module names, so it does
    nothing. Usually a typo or a name from another model layout (module names are
    `decoder.layers.N.…`, `mtp.layers.K.…`, `output_layer`, rooted at GPTModel with no
    `module.` prefix).
    """
    if facts.recipe is None:
        return
    for matcher in facts.recipe.matchers:
        if not any(matcher.matches(name) for name in facts.te_match_names()):
            yield Hit(message=(f"matcher '{matcher.name}' (pattern {matcher.pattern!r}) matches "
                               "no TE module of this model"),
                      file=facts.recipe.file, line=matcher.line,
                      fix="check the pattern against the module names in the table")
