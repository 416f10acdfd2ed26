"""Read a `qaudit/1` JSON report back into a Report (for `qaudit diff` and the golden tests).

Unknown keys are ignored, so reports from a newer qaudit still load."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from qaudit.errors import InputError
from qaudit.load.jsonfile import read_qaudit_json
from qaudit.judge.report import SCHEMA, Finding, ModuleRow, Report

_MAX_REPORT_BYTES = 64 * 1024 * 1024


def _known(cls, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def report_from_dict(data: dict[str, Any]) -> Report:
    from qaudit.judge.baseline import SuppressedFinding

    report = Report(**_known(Report, {k: v for k, v in data.items()
                                      if k not in ("modules", "findings", "suppressed")}))
    report.modules = [ModuleRow(**_known(ModuleRow, m)) for m in data.get("modules", [])]
    report.findings = [Finding(**_known(Finding, f)) for f in data.get("findings", [])]
    if data.get("suppressed") is not None:
        report.suppressed = [SuppressedFinding(**_known(SuppressedFinding, f))
                             for f in data["suppressed"]]
    return report


def is_report_file(path: str) -> bool:
    return path.lower().endswith(".json")


def load_report(path: str) -> Report:
    """A JSON report written by `qaudit check --format json`; bad file: InputError (exit 2)."""
    data = read_qaudit_json(path, kind="JSON report", schema=SCHEMA,
                            schema_file="report-v1.schema.json", max_bytes=_MAX_REPORT_BYTES,
                            not_found="file not found")
    try:
        return report_from_dict(data)
    except (TypeError, AttributeError) as exc:
        raise InputError(f"malformed qaudit JSON report ({exc})", file=path) from None
