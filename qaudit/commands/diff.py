"""`qaudit diff BASE HEAD`: each side audited now or read from a JSON report, then compared
(qaudit/judge/diff.py) and shown (qaudit/render/diff.py)."""

from __future__ import annotations

from qaudit.judge.diff import ReportDiff
from qaudit.judge.report import Report
from qaudit.render.diff import render_diff


def load_side(path: str, recipe: str | None, options) -> Report:
    """A side of the diff: a JSON report (`*.json`) as written by `check --format json`, or a
    config audited now."""
    from qaudit.judge.baseline import apply_comments
    from qaudit.render.load import is_report_file, load_report

    if is_report_file(path):
        if recipe:
            from qaudit.errors import InputError
            raise InputError("a recipe option does not apply to a JSON report", file=path)
        return load_report(path)
    from qaudit.commands.check import audit_files

    return apply_comments(audit_files(path, recipe, options))


def emit_diff(diff: ReportDiff, exit_code: int, fmt: str, outputs: list[tuple[str, str]],
              *, expand: bool = False) -> None:
    """Like render.emit: everything rendered first; GitHub Actions extras for new findings."""
    import os
    import sys

    from qaudit.render import Emission, deliver, terminal_width
    from qaudit.render.github import annotation

    emission = Emission(render_diff(diff, exit_code, fmt, width=terminal_width(sys.stdout),
                                    expand=expand),
                        [(path, render_diff(diff, exit_code, f, expand=expand))
                         for f, path in outputs])
    if os.environ.get("GITHUB_ACTIONS") == "true":
        emission.stderr = "".join(annotation(f) + "\n"
                                  for f in diff.new + [c.head for c in diff.changed if c.worse])
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            emission.step_summary = (os.environ["GITHUB_STEP_SUMMARY"],
                                     render_diff(diff, exit_code, "markdown", expand=expand))
    deliver(emission)

