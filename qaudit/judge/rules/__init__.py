"""Rules turn what the run recorded into findings. One rule per module, self-registering."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable

from qaudit.load.config import ModelConfig
from qaudit.plan.policies import TrackingPolicy
from qaudit.model.probe import CallRecord
from qaudit.load.recipe import Matcher, QuantConfig, QuantRecipe
from qaudit.judge.report import Finding, ModuleRow


@dataclass
class AuditFacts:
    """Everything a rule may look at."""

    config: ModelConfig
    recipe: QuantRecipe | None
    policy: TrackingPolicy
    rows: list[ModuleRow]
    records: dict[str, list[CallRecord]]  # per module name, in call order
    overwrite_main_grad: dict[str, bool]
    te_modules: list[str]  # names of TE modules (the ones recipes can bind), model order
    bindings: dict[str, tuple[Matcher, QuantConfig]]  # module name -> its matcher and config
    evaluation: bool = False
    # Row name -> the name recipe matchers see (local to its pipeline model chunk).
    match_names: dict[str, str] = field(default_factory=dict)

    def te_match_names(self) -> list[str]:
        return [self.match_names.get(name, name) for name in self.te_modules]
    allow_import: bool = False  # --allow-import: custom recipe factories were imported
    custom_factories: dict[str, str] = field(default_factory=dict)  # factory -> what it gave
    cross_check: Any = None  # --cross-check: qaudit.crosscheck.CrossCheck

    @cached_property
    def rows_by_name(self) -> dict[str, ModuleRow]:
        # Cached: rules look rows up per module, and models reach thousands of modules.
        return {row.name: row for row in self.rows}


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
