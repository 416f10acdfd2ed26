"""The report: one row per audited module plus findings; renderers only format it."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from qaudit.errors import printable
from qaudit.run.rows import ModuleRow
from qaudit.plan.upstream.releases import policy_versions

SCHEMA = "qaudit/1"
SEVERITIES = ("error", "warning", "info")


@dataclass(kw_only=True)  # eight fields, four of them optional strings: by name only
class Finding:
    rule: str
    severity: str
    module: str | None
    message: str
    file: str | None
    line: int | None
    fix: str = ""
    # "confirmed" / "not reproduced" once --verify measured it, or the upstream code a
    # release-keyed rule (QA008) rests on; otherwise None.
    evidence: str | None = None

    def __post_init__(self) -> None:
        # Messages quote names from the input (matchers, configs, keys): no renderer may hand
        # an escape sequence or a carriage return to a terminal. Newlines stay: each renderer
        # wraps or encodes them (GitHub annotations as %0A).
        self.message = printable(self.message, keep_newlines=True)
        self.fix = printable(self.fix, keep_newlines=True)


@dataclass(kw_only=True)
class Report:
    runtime: str
    policy: str
    config: str
    recipe: str | None
    steps: int
    microbatches: int
    modules: list[ModuleRow] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # Per module group, the verdict under each tracking policy (--compare-policies only).
    policies: dict[str, dict[str, str]] | None = None
    # Remedies re-audited by --suggest: remedy, passes, cost, yaml, remaining_errors.
    suggestions: list[dict[str, Any]] | None = None
    # Findings hidden by --baseline or a `qaudit: ignore` comment (qaudit/judge/baseline.py); each
    # also has `suppression`: "baseline" or "comment". Not counted in summary or exit code.
    suppressed: list[Finding] | None = None
    # The Megatron the verdict is for (qaudit/plan/upstream/target.py MegatronTarget.to_dict()):
    # source, version, policy (its behaviour; `policy` above is the one audited), label,
    # location, note. None in reports written before qaudit knew Megatron versions.
    megatron: dict[str, Any] | None = None
    # The Transformer Engine behaviour audited for (qaudit/plan/upstream/te.py TETarget.to_dict()):
    # source, version, label, overwrite_main_grad, location, note. None in older reports.
    te: dict[str, Any] | None = None
    # --cross-check: the comparison with the installed Megatron (qaudit.crosscheck.CrossCheck
    # .to_dict(): megatron, modules_compared, differences, ...).
    cross_check: dict[str, Any] | None = None
    # --full-size: parameters and bytes on one rank (qaudit/run/memory.py per_rank_memory).
    memory: dict[str, Any] | None = None
    # Each quantized module group's GEMM on one rank at real width, in every audit (from the
    # real-size build under --full-size; qaudit/judge/rules/qa040_gemm_shape.py gemm_shapes).
    gemm_shapes: list[dict[str, Any]] | None = None
    # How the config was read when a reader says more than its path: a Megatron-Bridge
    # ConfigContainer's provider and version, and settings resolved for the GPU job
    # (qaudit/load/bridge/). None for the other inputs.
    source: list[str] | None = None
    # The guard (qaudit/guard/verdict.py): what it watched, ranks, numeric checks, failures.
    guard: dict[str, Any] | None = None
    # Modules inferred identical to an observed one (qaudit/run/inferred.py observation()):
    # counts, and per class the observed expert and the inferred ones. None when all ran.
    observation: dict[str, Any] | None = None
    # --runtime te: the modules that ran TE's code and the ones inferred from an identical
    # one (qaudit/runtime/te_infer.py summary()), or why inference fell back. None otherwise.
    te_inference: dict[str, Any] | None = None

    def counts(self) -> Counter:
        return Counter(f.severity for f in self.findings)

    def exit_code(self, fail_on: str = "error") -> int:
        """1 when a finding is at or above `fail_on` (error > warning > info), else 0."""
        threshold = SEVERITIES.index(fail_on)
        return int(any(SEVERITIES.index(f.severity) <= threshold for f in self.findings))

    def to_dict(self) -> dict[str, Any]:
        counts = self.counts()
        return {
            "schema": SCHEMA,
            "runtime": self.runtime,
            "policy": self.policy,
            **({"megatron": self.megatron} if self.megatron is not None else {}),
            **({"te": self.te} if self.te is not None else {}),
            "config": self.config,
            **({"source": self.source} if self.source is not None else {}),
            "recipe": self.recipe,
            "steps": self.steps,
            "microbatches": self.microbatches,
            "modules": [_row_dict(row) for row in self.modules],
            "findings": [asdict(f) for f in self.findings],
            "summary": {severity: counts.get(severity, 0) for severity in SEVERITIES},
            **({"policies": self.policies,
                "policy_versions": {name: policy_versions(name) for name in _policy_names(self.policies)}}
               if self.policies is not None else {}),
            **({"suggestions": self.suggestions} if self.suggestions is not None else {}),
            **({"suppressed": [asdict(f) for f in self.suppressed]}
               if self.suppressed is not None else {}),
            **({"cross_check": self.cross_check} if self.cross_check is not None else {}),
            **({"memory": self.memory} if self.memory is not None else {}),
            **({"gemm_shapes": self.gemm_shapes} if self.gemm_shapes is not None else {}),
            **({"guard": self.guard} if self.guard is not None else {}),
            **({"observation": self.observation} if self.observation is not None else {}),
            **({"te_inference": self.te_inference} if self.te_inference is not None else {}),
        }


_ROW_FIELDS = tuple(f.name for f in fields(ModuleRow))


def _row_dict(row: ModuleRow) -> dict[str, Any]:
    """asdict(row) for a row of plain values, without asdict's deep copy of each (a model with
    sequential experts has tens of thousands of rows)."""
    return {name: getattr(row, name) for name in _ROW_FIELDS}


def _policy_names(policies: dict[str, dict[str, str]]) -> list[str]:
    names: list[str] = []
    for verdicts in policies.values():
        names.extend(name for name in verdicts if name not in names)
    return names
