"""Rules turn what the run recorded into findings. One rule per module, named by its ID and
self-registering; modules whose name starts with `_` hold helpers shared by rules.

The registry owns a rule's ID and severity: a check yields `Hit`s (where and what), and
`Rule.findings` makes each a `Finding` with the rule's registered ID and severity, so no rule
can report under another ID or at another severity than `qaudit rules` lists.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from qaudit.judge.report import SEVERITIES, Finding
from qaudit.run.evidence import AuditFacts

_RULE_ID = re.compile(r"QA\d{3}")


@dataclass(frozen=True, kw_only=True)
class Hit:
    """One thing a check found; its rule supplies ID and severity."""

    module: str | None = None
    message: str
    file: str | None
    line: int | None
    fix: str = ""
    # The upstream code a finding rests on, when the rule is about one release's code.
    evidence: str | None = None


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    severity: str
    title: str
    check: Callable[[AuditFacts], Iterable[Hit]]
    doc: str

    def findings(self, facts: AuditFacts) -> list[Finding]:
        found = []
        for hit in self.check(facts):
            if not isinstance(hit, Hit):
                # A check that builds its own Finding could state another ID or severity.
                raise TypeError(f"rule {self.id} yielded {type(hit).__name__}, not a Hit")
            found.append(Finding(rule=self.id, severity=self.severity, module=hit.module,
                                 message=hit.message, file=hit.file, line=hit.line, fix=hit.fix,
                                 evidence=hit.evidence))
        return found


RULES: dict[str, Rule] = {}


def rule(id: str, severity: str, title: str):
    """Register `check` as rule `id`; its docstring is the rule's doc page."""
    if not _RULE_ID.fullmatch(id) or severity not in SEVERITIES:
        raise ValueError(f"rule {id!r}: the ID must read QA### and the severity be one of "
                         f"{', '.join(SEVERITIES)}, not {severity!r}")

    def register(check: Callable[[AuditFacts], Iterable[Hit]]):
        if id in RULES:
            raise RuntimeError(f"rule {id} registered twice")
        RULES[id] = Rule(id=id, severity=severity, title=title, check=check,
                         doc=(check.__doc__ or "").strip())
        return check

    return register


def load_rules() -> dict[str, Rule]:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):  # helpers register nothing
            importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(RULES.items()))


def judge(facts: AuditFacts, only: Iterable[str] | None = None) -> list[Finding]:
    """Every registered rule's findings (`only`: these rules, e.g. the guard's)."""
    chosen = set(only) if only is not None else None
    findings: list[Finding] = []
    for current in load_rules().values():
        if chosen is None or current.id in chosen:
            findings.extend(current.findings(facts))
    return findings
