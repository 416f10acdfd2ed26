"""The Python API: audit a config object or file from a test or a recipe script.

    from qaudit import audit
    report = audit(cfg)            # a Bridge ConfigContainer, a provider / TransformerConfig,
    report.raise_for_findings()    # a mapping, or a path; fails on findings at/above error

The object's attributes are read (qaudit/load/bridge/live.py); Megatron and Bridge are never
imported. The verdict is the CLI's on the same config: the same reader, plan and audit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Sequence

from qaudit.judge.report import Finding, ModuleRow, Report


class AuditFailed(AssertionError):
    """Findings at or above the fail level (an AssertionError, so pytest reports it as a
    failed test); `report` holds the whole audit."""

    def __init__(self, message: str, report: "AuditReport") -> None:
        super().__init__(message)
        self.report = report


@dataclass
class AuditReport:
    report: Report
    fail_on: str = "error"

    @property
    def rows(self) -> list[ModuleRow]:
        return self.report.modules

    @property
    def findings(self) -> list[Finding]:
        return self.report.findings

    @property
    def exit_code(self) -> int:
        """What `qaudit check` would exit with: 1 on findings at or above `fail_on`."""
        return self.report.exit_code(self.fail_on)

    def to_dict(self) -> dict[str, Any]:
        return {**self.report.to_dict(), "exit_code": self.exit_code}

    def render(self, output_format: str = "table") -> str:
        from qaudit.render import render

        return render(self.report, self.exit_code, output_format)

    def raise_for_findings(self, fail_on: str | None = None) -> "AuditReport":
        """Raise AuditFailed when a finding is at or above `fail_on` (default: the audit's)."""
        level = fail_on or self.fail_on
        if self.report.exit_code(level):
            failing = [f for f in self.findings
                       if _rank(f.severity) <= _rank(level)]
            lines = [f"{f.rule} {f.severity}: {f.message}" for f in failing[:10]]
            raise AuditFailed(f"qaudit: {len(failing)} finding(s) at or above {level}:\n"
                              + "\n".join(lines), self)
        return self


def _rank(severity: str) -> int:
    return ("error", "warning", "info").index(severity)


def audit(cfg: Any, *, recipe: str | None = None, overrides: Sequence[str] = (),
          megatron: str = "auto", te: str = "auto", policy: str | None = None,
          fail_on: str = "error", **options: Any) -> AuditReport:
    """Audit `cfg` (an object, a mapping, or a config file path) as `qaudit check` does.
    `overrides`: Hydra-style `a.b=c` strings (Bridge configs); other keyword arguments are
    AuditOptions fields (steps, microbatches, runtime, seed, ...).

    The runtime defaults to the reference, not the CLI's auto: without a GPU, auto would boot
    TE's Python on qaudit's CPU kernel stand-in, which makes torch report a CUDA device for the
    rest of the caller's process (docs/te-runtime.md). Pass runtime="auto" or "te" to ask for it."""
    from qaudit.commands.check import audit_inputs
    from qaudit.errors import InputError
    from qaudit.load.bridge import load_object, locate_error
    from qaudit.load.bridge.overrides import Override
    from qaudit.plan import check_plan
    from qaudit.run.options import AuditOptions

    if fail_on not in ("error", "warning", "info"):
        raise ValueError(f"fail_on must be error, warning or info, got {fail_on!r}")
    listed = tuple(Override(text=text, index=i + 1) for i, text in enumerate(overrides))
    options.setdefault("runtime", "reference")
    run = replace(AuditOptions(), megatron=megatron, te=te, policy=policy, overrides=listed,
                  **options)
    from qaudit.load.run_files import one_run

    with one_run():  # each file read and parsed once in this call, kept no longer
        # The type, not the object: isinstance() would ask the caller's `__getattribute__`
        # for `__class__`, and one that raises must become an InputError below, not escape.
        if issubclass(type(cfg), (str, os.PathLike)):
            from qaudit.commands.inputs import load_inputs

            config, loaded_recipe = load_inputs(os.fspath(cfg), recipe, dict(run.variables),
                                                listed, run.megatron)
        else:
            config, loaded_recipe = load_object(cfg, listed)
            try:
                check_plan(config)
            except InputError as exc:
                raise locate_error(exc, config.source) from None
        return AuditReport(audit_inputs(config, loaded_recipe, run), fail_on)
