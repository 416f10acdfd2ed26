"""QA091: settings read and shown to change nothing the audit reports."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.unmodelled_advice import shown_without_effect


@rule("QA091", "info", "setting read, no effect on the audit")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The input sets things qaudit has read and that change nothing it reports: which TE
    modules run, how often, in which precision, and whether their weight gradient overwrites
    or accumulates into main_grad. They are listed once, in one note, so that a reader knows
    they were seen and not skipped; they never make the exit code 1 unless `--fail-on info`.
    Each entry's upstream evidence is in docs/no-effect-settings.md: for example, with
    `--overlap-grad-reduce` Megatron's data-parallel reduce waits until every parameter has
    reported all its grad-ready events of the last microbatch, so a module run twice is reduced
    after its last backward, as without the overlap. A Bridge provider field no code reads
    (`keep_mtp_spec_in_bf16`: the MTP layers run in the model's precision, as audited) is
    listed here too.
    """
    source = facts.config.source
    quiet = [note for note in (source.notes if source else [])
             if note.no_effect or shown_without_effect(note.key)]
    if not quiet:
        return
    names = ", ".join(note.message.split(": ", 1)[0] for note in quiet)
    reasons = "; ".join(note.message for note in quiet)
    yield Hit(message=f"read, no effect: {names}. {reasons} (docs/no-effect-settings.md)",
              file=facts.config.file, line=quiet[0].line, fix="")
