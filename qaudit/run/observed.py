"""An observed run (qaudit/run/observe.py, watching Megatron's own model) as the audit's
facts: one row per observed module and the rules that judge what a run did. The guard judges
the user's run with these; the cross-check judges its own upstream run with them too."""

from __future__ import annotations

from typing import Any

from qaudit.load.config import ModelConfig
from qaudit.model.probe import CallRecord
from qaudit.plan.policies import POLICIES
from qaudit.run.evidence import AuditFacts
from qaudit.run.observe import Observation
from qaudit.run.rows import ModuleRow, accumulation_of, calls_per_microbatch, precision_of

# The rules that judge what a run did (the others judge a config or recipe file).
GUARD_RULES = ("QA001", "QA003", "QA004", "QA005", "QA006", "QA007", "QA009")


def rows_of(seen: Observation, rearms: bool | None) -> list[ModuleRow]:
    """One row per observed module, in model order. `tracked`: observed when two or more
    steps were watched (True again at a later step: yes), else from `rearms`, the running
    Megatron's own re-arming (read from its code) when known."""
    records = seen.records()
    rows = []
    for name, kind in seen.classes.items():
        own = records.get(name, [])
        is_te = name in seen.te_modules
        rows.append(ModuleRow(
            name=name, type=kind, precision=precision_of(own) if own else "-",
            recipe=seen.bindings.get(name, "-"), tracked=_tracked(own, is_te, seen.steps, rearms),
            accumulation="frozen" if seen.frozen.get(name) else accumulation_of(own),
            calls_per_microbatch=calls_per_microbatch(own, grad=True),
            nograd_calls_per_microbatch=calls_per_microbatch(own, grad=False),
            stage=_stage(name)[0], chunk=_stage(name)[1]))
    return rows


def _tracked(records: list[CallRecord], is_te: bool, steps: int, rearms: bool | None) -> str:
    if not is_te:
        return "-"
    if not records or all(r.flag is None for r in records):
        return "no"
    if any(r.flag is True and r.step > 0 for r in records):
        return "yes"
    if steps > 1 or rearms is None:
        return "stale"
    return "yes" if rearms else "stale"


def _stage(name: str) -> tuple[int, int]:
    head = name.split("/", 1)[0] if "/" in name else ""
    if not head.startswith("stage"):
        return 0, 0
    stage, _, chunk = head[len("stage"):].partition(".chunk")
    return int(stage), int(chunk or 0)


def facts_of(seen: Observation, config: ModelConfig, rearms: bool | None,
             policy: Any = None) -> AuditFacts:
    """`policy`: the running Megatron's tracking behaviour (its fix texts), legacy unknown."""
    return AuditFacts(config=config, recipe=None, policy=policy or POLICIES["legacy"],
                      rows=rows_of(seen, rearms), records=seen.records(),
                      overwrite_main_grad=dict(seen.overwrite_main_grad),
                      te_modules=list(seen.te_modules), bindings={}, observed=True,
                      stray_writes=list(seen.strays), missing_writes=list(seen.missing))
