"""QA090: the input sets something the audit does not model."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.unmodelled_advice import fix_text, shown_without_effect


@rule("QA090", "warning", "input setting not modelled by the audit")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The config (or launch script) sets something that can change which TE modules run, how
    often, or in which precision, but qaudit does not model it yet. The audit went on without
    it, so its result may not hold for the real run. The message names the setting as it was
    written and says what TE or Megatron does differently; a YAML field, a MODEL_ARGS key and
    a launch-script flag for the same setting get the same reason (one table:
    qaudit/load/unmodelled.py). Its fix says, per setting, what qaudit cannot see, the concrete
    way to check it (`--cross-check`, `qaudit guard`, or the upstream code path to read) and
    whether the setting can change this verdict (qaudit/judge/unmodelled_advice.py). Settings
    shown to change nothing the audit reports are not warned about: QA091 lists them once.
    """
    source = facts.config.source
    for note in (source.notes if source else []):
        if note.no_effect or shown_without_effect(note.key):
            continue  # QA091 lists those
        yield Hit(message=note.message, file=note.file or facts.config.file, line=note.line,
                  fix=fix_text(note.key))
