"""QA018 and QA019: recipe text Megatron accepts but reads differently from how it looks."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.report import Finding
from qaudit.judge.rules import AuditFacts, rule


def _notes(facts: AuditFacts, rule_id: str) -> Iterable[Finding]:
    if facts.recipe is None:
        return
    for note in facts.recipe.notes:
        if note.rule == rule_id:
            yield Finding(rule_id, "warning", None, note.message, facts.recipe.file, note.line,
                          note.fix)


@rule("QA018", "warning", "matcher 'enabled' is not true or false")
def check_enabled(facts: AuditFacts) -> Iterable[Finding]:
    """Megatron reads a matcher's `enabled` by truthiness (`matcher.get("enabled", False)`),
    not as a boolean: the quoted string `"false"` (or `"no"`, `"0"`) is a non-empty string and
    *enables* the matcher, while `0`, `""` or `null` disable it. The audit follows Megatron,
    so the matcher takes effect (or not) exactly as in the real run; the finding points at the
    line so that the intent can be written as a plain `true` or `false`.
    """
    return _notes(facts, "QA018")


@rule("QA019", "warning", "recipe key Megatron ignores or replaces")
def check_ignored(facts: AuditFacts) -> Iterable[Finding]:
    """Megatron reads only `configs` and `matchers` at the top of a recipe and only `type`,
    `pattern`, `config` and `enabled` in a matcher; anything else (a typo such as `matcher:`
    or `enable: true`) is silently ignored. A key written twice in one mapping is not an
    error either: PyYAML, which Megatron loads the file with, keeps the last value, and a
    repeated matcher name keeps its first place in the match order with the last body. The
    audit reads the file the same way and reports each such key at its line. (Payloads under
    `configs` are strict upstream: unknown fields there are errors, see QA014.)
    """
    return _notes(facts, "QA019")
