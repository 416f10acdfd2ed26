"""JSON output: the report's dict, schema `qaudit/1`, stable key order.

The JSON Schema of this output ships with the package: `schema_text()` returns it
(qaudit/schemas/report-v1.schema.json)."""

from __future__ import annotations

import json
from importlib import resources

from qaudit.judge.report import Report

SCHEMA_RESOURCE = "schemas/report-v1.schema.json"


def render_json(report: Report, exit_code: int) -> str:
    data = report.to_dict()
    data["exit_code"] = exit_code
    return json.dumps(data, indent=2) + "\n"


def schema_text() -> str:
    """The JSON Schema (draft 2020-12) that every `qaudit/1` report validates against."""
    return resources.files("qaudit").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
