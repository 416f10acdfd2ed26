"""Recipe notes (qaudit/load/recipe.py RecipeNote) as hits: QA018 and QA019 share this.

The loader records what Megatron accepts but reads differently, each note tagged with its rule;
the rule only reports its own notes at their lines.
"""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit


def recipe_notes(facts: AuditFacts, rule_id: str) -> Iterable[Hit]:
    if facts.recipe is None:
        return
    for note in facts.recipe.notes:
        if note.rule == rule_id:
            yield Hit(message=note.message, file=facts.recipe.file, line=note.line, fix=note.fix)
