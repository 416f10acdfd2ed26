"""One row per audited module: what its calls did, summarised from the probes' records."""

from __future__ import annotations

from collections import Counter
from itertools import groupby
from dataclasses import dataclass
from typing import Iterable

from qaudit.errors import printable
from qaudit.load.precision import precision_label
from qaudit.model.probe import CallRecord


@dataclass(kw_only=True)
class ModuleRow:
    name: str
    type: str
    precision: str
    recipe: str
    tracked: str
    accumulation: str
    calls_per_microbatch: int
    nograd_calls_per_microbatch: int
    verdict: str = "ok"
    # Relative error of main_grad against an unfused float64 reference (--verify only).
    grad_rel_error: float | None = None
    stage: int = 0  # pipeline stage and virtual model chunk holding the module
    chunk: int = 0

    def __post_init__(self) -> None:
        self.recipe = printable(self.recipe)  # a config name from the recipe file


def calls_per_microbatch(records: list[CallRecord], grad: bool) -> int:
    per_mb = Counter((r.step, r.microbatch) for r in records if r.grad == grad)
    return max(per_mb.values(), default=0)


def precision_of(records: list[CallRecord]) -> str:
    grad_records = [r for r in records if r.grad] or records
    labels = sorted({precision_label(r.quant) for r in grad_records})
    return "+".join(labels) if labels else "-"


def tracked_of(records: list[CallRecord], is_te: bool, rearmed: bool) -> str:
    """yes: re-armed each step; stale: only true after construction; no: always None;
    graph: inside a per-layer CUDA graph (qaudit/plan/graphs.py)."""
    if not is_te:
        return "-"
    if any(r.graph for r in records):
        return "graph"  # replayed from a CUDA graph: the capture fixed what TE sees
    if all(r.flag is None for r in records):
        return "no"
    return "yes" if rearmed else "stale"


def weight_cache_of(records: list[CallRecord]) -> str:
    """What TE did with the quantized weight at each call, step by step: the uses in call order
    (a run of one use as `use*N`), steps separated by ` | `. `-` when no call ran quantized."""
    if all(r.cache is None for r in records):
        return "-"
    steps: dict[int, list[str]] = {}
    for record in sorted(records, key=lambda r: (r.step, r.microbatch, r.call)):
        steps.setdefault(record.step, []).append(record.cache or "-")
    return " | ".join(_runs(uses) for uses in steps.values())


def _runs(uses: list[str]) -> str:
    counted = ((use, len(list(group))) for use, group in groupby(uses))
    return ",".join(use if count == 1 else f"{use}*{count}" for use, count in counted)


def accumulation_of(records: list[CallRecord]) -> str:
    decisions = [r.decision for r in records if r.grad and r.decision]
    if not decisions:
        return "-"
    if all(d == "autograd" for d in decisions):
        return "autograd"
    # Overwrites that the flag does not explain come from overwrite_main_grad.
    if any(r.decision == "overwrite" and r.flag is not True for r in records if r.grad):
        return "overwrite-always"
    if any(r.decision == "overwrite" and r.microbatch == 0 for r in records):
        return "overwrite-first"
    return "accumulate"


def index_set_text(values: Iterable[int]) -> str:
    """`[0-2,5,7-9]`; one value alone as itself."""
    ordered = sorted(set(values))
    if len(ordered) == 1:
        return str(ordered[0])
    spans: list[str] = []
    start = prev = ordered[0]
    for value in ordered[1:] + [None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return "[" + ",".join(spans) + "]"
