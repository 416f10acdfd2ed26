"""What a run leaves for the judge: every fact a rule may look at."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from qaudit.load.config import ModelConfig
from qaudit.load.recipe import Matcher, QuantConfig, QuantRecipe
from qaudit.model.probe import CallRecord
from qaudit.plan.policies import TrackingPolicy
from qaudit.run.rows import ModuleRow


@dataclass(kw_only=True)
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
    te_version: str | None = None  # the TE release the verdict is for (None: the newest known)
    # The Megatron the verdict is for (qaudit.plan.upstream.target.MegatronTarget); None where
    # none was resolved (the guard's observed facts).
    megatron: Any = None
    # --full-size: each TE module's (in_features, out_features) in the real-width build.
    built_widths: dict[str, tuple[int, int]] = field(default_factory=dict)
    # With TE's Python imported by the te runtime: its own shape checks (runtime/te_shapes.py).
    te_shape_checks: Any = None
    # Values a rule computes once that the report reuses (QA040's shapes), by the rule's key.
    derived: dict[str, Any] = field(default_factory=dict)
    # The guard (qaudit/guard/): the records were observed in a live run, not qaudit's audit;
    # writes into main_grad that no call's backward explains (qaudit/run/observe.py).
    observed: bool = False
    stray_writes: list[Any] = field(default_factory=list)
    # Fused calls whose backward ran but whose main_grad never got a write (observe.py).
    missing_writes: list[Any] = field(default_factory=list)

    @cached_property
    def rows_by_name(self) -> dict[str, ModuleRow]:
        # Cached: rules look rows up per module, and models reach thousands of modules.
        return {row.name: row for row in self.rows}
