"""Renderers: the same Report as text; they never decide anything.

`emit` is the one place that chooses outputs: the `--format` stream on stdout, every
`--output FORMAT=PATH` file, and in GitHub Actions the annotations on stderr and the Markdown
job summary. Everything is rendered in memory first, so an internal error never leaves a
partial report behind.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping, TextIO

from qaudit.errors import InputError
from qaudit.files.outputs import append_file, check_clashes, check_output_path, write_file
from qaudit.render.defuse import defuse, escaped_strings
from qaudit.judge.report import Report

STDOUT_FORMATS = ("table", "markdown", "json", "sarif", "github")
FILE_FORMATS = STDOUT_FORMATS + ("svg",)
FORMAT_ALIASES = {"md": "markdown", "txt": "table", "text": "table"}
MIN_WIDTH, MAX_WIDTH = 60, 240


def render(report: Report, exit_code: int, fmt: str, *, expand: bool = False,
           color: bool = False, width: int = 80, show_info: bool = False) -> str:
    own: tuple[str, ...] = ()
    if color and fmt == "table":
        from qaudit.render.table import COLOR_SEQUENCES

        # Input text escaped before qaudit adds its colours, so that only those are kept.
        report, own = escaped_strings(report), COLOR_SEQUENCES
    text = _render(report, exit_code, fmt, expand=expand, color=color, width=width,
                   show_info=show_info)
    return defuse(text, own_sequences=own, commands=fmt != "github")


def _render(report: Report, exit_code: int, fmt: str, *, expand: bool,
            color: bool, width: int, show_info: bool = False) -> str:
    if fmt == "table":
        from qaudit.render.table import render_table
        return render_table(report, exit_code, width=width, color=color, expand=expand,
                            show_info=show_info)
    if fmt == "markdown":
        from qaudit.render.markdown import render_markdown
        return render_markdown(report, exit_code, expand=expand)
    if fmt == "json":
        from qaudit.render.json import render_json
        return render_json(report, exit_code)
    if fmt == "sarif":
        from qaudit.render.sarif import render_sarif
        return render_sarif(report, exit_code)
    if fmt == "github":
        from qaudit.render.github import render_github
        return render_github(report, exit_code, show_info=show_info)
    if fmt == "svg":
        from qaudit.render.svg import render_svg
        return render_svg(report, exit_code)
    raise ValueError(f"unknown format {fmt!r}")


def parse_output(spec: str, formats: tuple[str, ...] = FILE_FORMATS) -> tuple[str, str]:
    """`json=out/report.json` -> ("json", "out/report.json"); bad spec: InputError (exit 2)."""
    fmt, sep, path = spec.partition("=")
    fmt = FORMAT_ALIASES.get(fmt.strip().lower(), fmt.strip().lower())
    if not sep or not path:
        raise InputError(f"--output {spec!r}: expected FORMAT=PATH, e.g. sarif=qaudit.sarif")
    if fmt not in formats:
        raise InputError(f"--output {spec!r}: unknown format {fmt!r}; one of {', '.join(formats)}")
    check_output_path(path, f"--output {fmt}")
    return fmt, path


def parse_outputs(specs: list[str] | None, formats: tuple[str, ...] = FILE_FORMATS) -> list[tuple[str, str]]:
    outputs = [parse_output(spec, formats) for spec in specs or []]
    check_clashes([(f"--output {fmt}", path) for fmt, path in outputs], [])
    return outputs


def use_color(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """ANSI colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def terminal_width(stream: TextIO) -> int:
    """The terminal's width on a TTY, else 80 (files, pipes and CI logs get stable bytes)."""
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return 80
    columns = shutil.get_terminal_size((80, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, columns))


def write_atomic(path: str, text: str) -> None:
    """Write via a temporary file and rename: readers never see half a report (see
    qaudit.files.outputs: modes, symlinks, FIFOs and devices, signals)."""
    write_file(path, text)


@dataclass
class Emission:
    """Everything one run prints or writes, rendered before anything is written."""

    stdout: str
    files: list[tuple[str, str]] = field(default_factory=list)  # (path, text)
    stderr: str = ""
    step_summary: tuple[str, str] | None = None  # (path, markdown to append)


def prepare(report: Report, exit_code: int, stdout_format: str, outputs: list[tuple[str, str]],
            *, expand: bool = False, show_info: bool = False, stream: TextIO | None = None,
            environ: Mapping[str, str] | None = None,
            markdown: Callable[[], str] | None = None,
            annotations: Callable[[], str] | None = None) -> Emission:
    stream = stream if stream is not None else sys.stdout
    environ = environ if environ is not None else os.environ
    color = stdout_format == "table" and use_color(stream, environ)
    main = render(report, exit_code, stdout_format, expand=expand, color=color,
                  width=terminal_width(stream), show_info=show_info)
    files = [(path, render(report, exit_code, fmt, expand=expand, show_info=show_info))
             for fmt, path in outputs]
    emission = Emission(main, files)
    if environ.get("GITHUB_ACTIONS") == "true":
        if stdout_format != "github":
            if annotations is None:
                from qaudit.render.github import render_annotations
                emission.stderr = render_annotations(report, show_info)
            else:
                emission.stderr = annotations()
        summary = environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            text = markdown() if markdown else render(report, exit_code, "markdown", expand=expand)
            emission.step_summary = (summary, text)
    return emission


def deliver(emission: Emission, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
    """Files first (a failure there leaves stdout empty), then the job summary, then streams."""
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    for path, text in emission.files:
        try:
            write_atomic(path, text)
        except OSError as exc:
            raise InputError(f"cannot write: {exc.strerror or exc}", file=path) from None
    if emission.step_summary:
        path, text = emission.step_summary
        try:
            append_file(path, text + "\n")
        except OSError as exc:
            stderr.write(defuse(f"warning: cannot append to GITHUB_STEP_SUMMARY {path}: "
                                f"{exc.strerror or exc}") + "\n")
    stdout.write(emission.stdout)
    stdout.flush()
    if emission.stderr:
        stderr.write(defuse(emission.stderr, commands=False))


def emit(report: Report, exit_code: int, stdout_format: str, outputs: list[tuple[str, str]],
         *, expand: bool = False, show_info: bool = False,
         extra_files: list[tuple[str, str]] | None = None) -> None:
    """Render everything, then write the files (`extra_files`: (path, text) pairs such as a
    baseline), then stdout; GitHub Actions extras when GITHUB_ACTIONS=true."""
    emission = prepare(report, exit_code, stdout_format, outputs, expand=expand,
                       show_info=show_info)
    emission.files.extend(extra_files or [])
    deliver(emission)
