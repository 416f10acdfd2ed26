"""JSON output: the report's dict, schema `qaudit/1`, stable key order."""

from __future__ import annotations

import json

from qaudit.report import Report


def render_json(report: Report, exit_code: int) -> str:
    data = report.to_dict()
    data["exit_code"] = exit_code
    return json.dumps(data, indent=2) + "\n"
