"""`pytest --regen-goldens`: rewrite tests/golden/ from the CLI before the tests compare.

One `qaudit check` per bundled example writes every format; `qaudit diff` of the two
DeepSeek-shaped reports writes the diff goldens. Subprocesses, two at a time (the CI machine
has two cores), because that is what a user runs. Read `git diff tests/golden` afterwards:
goldens are reviewed output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
FILE_SUFFIXES = {"json": ".json", "markdown": ".md", "sarif": ".sarif", "github": ".github",
                 "svg": ".svg"}
DIFF_BASE, DIFF_HEAD = "deepseek-v3-mtp-fp8-per-depth", "deepseek-v3-mtp-fp8"
DIFF_SUFFIXES = {"table": ".txt", "markdown": ".md", "json": ".json"}
PARALLEL = 2


def _qaudit(*args: str) -> list[str]:
    return [sys.executable, "-m", "qaudit", *args]


def _environment() -> dict[str, str]:
    environment = dict(os.environ, NO_COLOR="1")
    # Goldens are what a plain CI machine prints: no GitHub job summary, no TE.
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
        environment.pop(name, None)
    return environment


def _check_command(example: str) -> list[str]:
    outputs = [arg for fmt, suffix in FILE_SUFFIXES.items()
               for arg in ("-o", f"{fmt}={GOLDEN / (example + suffix)}")]
    return _qaudit("check", f"configs/{example}.yaml", "--format", "table", *outputs)


def regenerate() -> list[str]:
    """Rewrite every golden file; returns one line per file group written."""
    examples = sorted(path.stem for path in (REPO / "configs").glob("*.yaml"))
    done: list[str] = []
    running: list[tuple[str, subprocess.Popen, object]] = []

    def finish(example: str, process: subprocess.Popen, table) -> None:
        code = process.wait()
        table.close()
        if code > 1:
            raise RuntimeError(f"regenerating {example}: qaudit check exited {code}")
        done.append(f"{example}: exit {code}")

    for example in examples:
        table = (GOLDEN / f"{example}.txt").open("w")
        process = subprocess.Popen(_check_command(example), cwd=REPO, stdout=table,
                                   env=_environment())
        running.append((example, process, table))
        if len(running) >= PARALLEL:
            finish(*running.pop(0))
    for entry in running:
        finish(*entry)
    for fmt, suffix in DIFF_SUFFIXES.items():
        with (GOLDEN / f"diff-deepseek-per-depth-to-repeated{suffix}").open("w") as out:
            subprocess.run(_qaudit("diff", f"tests/golden/{DIFF_BASE}.json",
                                   f"tests/golden/{DIFF_HEAD}.json", "--format", fmt),
                           cwd=REPO, stdout=out, env=_environment())
    done.append("qaudit diff goldens")
    return done
