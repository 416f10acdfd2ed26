"""Output quoted in README.md and docs/*.md, regenerated from the tool itself.

A quoted output block is a fenced block right after a marker line naming the command and
which of its output lines to keep:

    <!-- output: check configs/deepseek-v3-mtp-fp8.yaml | verdict:.. | mtp.layers.0.eh_proj +1 -->

Each `|` piece selects lines of the command's output (as a pipe or CI log gets it: 80
columns, no colour), in order, each after the previous one: `TEXT` the first line starting
with TEXT, `TEXT +N` that line and the N after it, `TEXT..` that line up to the next blank
line. Pieces that do not follow each other are joined by a `...` line (a blank line when only
a blank line lies between). `scripts/docs-output` rewrites the blocks; tests/test_docs_output.py
fails when one differs from what the tool prints now.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MARKER = re.compile(r"^<!-- output: (?P<spec>.+?) -->\n```\n(?P<body>.*?)```\n",
                    re.MULTILINE | re.DOTALL)


def _select(output: list[str], pieces: list[str]) -> list[str]:
    lines: list[str] = []
    at = 0  # the next output line a piece may start at
    for piece in pieces:
        count, until_blank = 0, False
        if piece.endswith(".."):
            text, until_blank = piece[:-2], True
        elif re.search(r" \+\d+$", piece):
            text, _, number = piece.rpartition(" +")
            count = int(number)
        else:
            text = piece
        start = next((i for i in range(at, len(output)) if output[i].startswith(text)), None)
        if start is None:
            raise ValueError(f"no output line starts with {text!r} (after line {at})")
        end = start + 1 + count
        if until_blank:
            end = next((i for i in range(start, len(output)) if not output[i].strip()),
                       len(output))
        if lines:
            gap = output[at:start]
            if gap and all(not line.strip() for line in gap) and len(gap) == 1:
                lines.append("")
            elif gap:
                lines.append("...")
        lines.extend(output[start:end])
        at = end
    return lines


def run_command(command: str, repo: Path) -> list[str]:
    """`qaudit COMMAND` as a CI log gets it (the bytes tests/goldens.py records)."""
    environment = dict(os.environ, NO_COLOR="1")
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
        environment.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "qaudit", *command.split()], cwd=repo,
                          capture_output=True, text=True, env=environment)
    if done.returncode > 1:
        raise RuntimeError(f"qaudit {command}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout.splitlines()


def render_block(spec: str, repo: Path, cache: dict[str, list[str]] | None = None) -> str:
    command, *pieces = [part.strip() for part in spec.split(" | ")]
    cache = {} if cache is None else cache
    if command not in cache:
        cache[command] = run_command(command, repo)
    return "\n".join(_select(cache[command], pieces)) + "\n"


def regenerated(text: str, repo: Path, cache: dict[str, list[str]] | None = None) -> str:
    """`text` with every marked block replaced by the tool's output now."""
    def replace(match: re.Match) -> str:
        spec = match["spec"]
        return f"<!-- output: {spec} -->\n```\n{render_block(spec, repo, cache)}```\n"

    return MARKER.sub(replace, text)


def documents(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
