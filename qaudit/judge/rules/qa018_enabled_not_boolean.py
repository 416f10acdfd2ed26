"""QA018: a matcher's `enabled` that Megatron reads by truthiness, not as true/false."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.rules._recipe_notes import recipe_notes


@rule("QA018", "warning", "matcher 'enabled' is not true or false")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Megatron reads a matcher's `enabled` by truthiness (`matcher.get("enabled", False)`),
    not as a boolean: the quoted string `"false"` (or `"no"`, `"0"`) is a non-empty string and
    *enables* the matcher, while `0`, `""` or `null` disable it. The audit follows Megatron,
    so the matcher takes effect (or not) exactly as in the real run; the finding points at the
    line so that the intent can be written as a plain `true` or `false`.
    """
    return recipe_notes(facts, "QA018")
