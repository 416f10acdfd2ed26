"""Running the `qaudit` console entry in process, as the tests of the CLI do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qaudit import cli

REPO = Path(__file__).resolve().parent.parent


def run_in_process(monkeypatch, capsys, *args: str, cwd: Path | None = REPO) -> tuple[int, str, str]:
    """Run `qaudit ARGS` in `cwd` (the repository root; None: stay where the test is);
    return exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["qaudit", *args])
    if cwd is not None:
        monkeypatch.chdir(cwd)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err
