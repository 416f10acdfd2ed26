"""QA019: a recipe key Megatron ignores, or a key written twice (the last one wins)."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.rules._recipe_notes import recipe_notes


@rule("QA019", "warning", "recipe key Megatron ignores or replaces")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Megatron reads only `configs` and `matchers` at the top of a recipe and only `type`,
    `pattern`, `config` and `enabled` in a matcher; anything else (a typo such as `matcher:`
    or `enable: true`) is silently ignored. A key written twice in one mapping is not an
    error either: PyYAML, which Megatron loads the file with, keeps the last value, and a
    repeated matcher name keeps its first place in the match order with the last body. The
    audit reads the file the same way and reports each such key at its line. (Payloads under
    `configs` are strict upstream: unknown fields there are errors, see QA014.)
    """
    return recipe_notes(facts, "QA019")
