"""`qaudit check` over several configs (or a directory): each audited on its own, one
summary line per file, the worst exit code; json and sarif carry every file."""

from __future__ import annotations

from dataclasses import replace

from qaudit.errors import EnvironmentProblem, InputError
from qaudit.run.options import AuditOptions

EXIT_USAGE, EXIT_INTERNAL = 2, 3


def _say(line: str) -> None:
    import sys

    from qaudit.errors import printable

    sys.stderr.write(printable(line) + "\n")


def _refuse(message: str) -> int:
    _say(f"error: {message}")
    return EXIT_USAGE


def check_many(files: list[str], recipe: str | None, options: AuditOptions,
               set_values: list[str] | None, output_format: str, fail_on: str,
               output: list[str] | None, baseline: str | None, write_baseline: str | None,
               suggest: bool, show_info: bool = False) -> int:
    """Audit each of `files`, print, and return the worst exit code."""
    import os
    import sys

    from qaudit.commands.inputs import load_inputs
    from qaudit.files.outputs import check_clashes
    from qaudit.load.sources import parse_assignments
    from qaudit.render import Emission, deliver, parse_outputs
    from qaudit.render.many import ONE_FILE_FORMATS, Audited, render_many, worst_code

    from qaudit.judge.baseline import prepare_baseline

    try:
        outputs = parse_outputs(output)
        baselines = prepare_baseline(baseline, write_baseline)
        options = replace(options, variables=parse_assignments(set_values))
        for fmt, _ in outputs:
            if fmt in ONE_FILE_FORMATS:
                raise InputError(f"--output {fmt} is of one config; give one config")
        from qaudit.commands.written import written_files

        written = written_files(outputs, write_baseline)
        inputs = [("config", path) for path in files] + ([("recipe", recipe)] if recipe else []) \
            + ([("baseline", baseline)] if baseline else [])
        check_clashes(written, inputs)
    except InputError as exc:
        return _refuse(str(exc))
    items: list[Audited] = []
    for path in files:
        try:
            loaded = load_inputs(path, recipe, dict(options.variables), megatron=options.megatron)
            from qaudit.commands.check import audit_inputs

            report = audit_inputs(*loaded, options, suggest=suggest)
        except InputError as exc:
            _say(f"error: {exc}")
            items.append(Audited(path, EXIT_USAGE, error=str(exc).removeprefix(f"{path}: ")))
            continue
        except EnvironmentProblem as exc:
            _say(f"error: {exc}")
            items.append(Audited(path, EXIT_INTERNAL, error=str(exc)))
            continue
        report = baselines.apply(report)  # each config by its own entries only
        while baselines.unmatched:
            _say(baselines.unmatched.pop(0))
        items.append(Audited(path, report.exit_code(fail_on), report))
    emission = Emission(render_many(items, output_format, show_info),
                        [(out_path, render_many(items, fmt, show_info))
                         for fmt, out_path in outputs])
    if os.environ.get("GITHUB_ACTIONS") == "true":
        from qaudit.render.github import render_annotations

        if output_format != "github":
            from qaudit.render.defuse import defuse

            emission.stderr = defuse("".join(render_annotations(item.report, show_info)
                                             for item in items
                                             if item.report is not None), commands=False)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            emission.step_summary = (summary, render_many(items, "markdown"))
    try:
        check_clashes(written, inputs + [("recipe", item.report.recipe) for item in items
                                         if item.report is not None and item.report.recipe])
        # One baseline file for every config audited (and those it already held).
        emission.files.extend(baselines.files(*[item.report for item in items
                                                if item.report is not None]))
        deliver(emission)
    except InputError as exc:
        return _refuse(str(exc))
    return worst_code(items)
