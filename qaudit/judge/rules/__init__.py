"""Rules turn what the run recorded into findings. One rule per module, self-registering."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Iterable

from qaudit.judge.report import Finding
from qaudit.run.evidence import AuditFacts


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    title: str
    check: Callable[[AuditFacts], Iterable[Finding]]
    doc: str


RULES: dict[str, Rule] = {}


def rule(id: str, severity: str, title: str):
    """Register `check` as rule `id`; its docstring is the rule's doc page."""

    def register(check: Callable[[AuditFacts], Iterable[Finding]]):
        if id in RULES:
            raise RuntimeError(f"rule {id} registered twice")
        RULES[id] = Rule(id, severity, title, check, (check.__doc__ or "").strip())
        return check

    return register


def load_rules() -> dict[str, Rule]:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(RULES.items()))


def judge(facts: AuditFacts) -> list[Finding]:
    findings: list[Finding] = []
    for current in load_rules().values():
        findings.extend(current.check(facts))
    return findings
