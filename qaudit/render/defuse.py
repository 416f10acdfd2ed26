"""No workflow command from input text: GitHub Actions runs a log line as a command when it
starts, after leading whitespace, with `::` (and reads the legacy `##[...]` form). Names from
the input (matchers, configs, paths) reach the table, Markdown and SVG outputs, where wrapping
can start a line with them; every format but `github`, whose commands are the point and whose
user text is escaped, goes through `defuse` before it is printed or written.
"""

from __future__ import annotations

import re

# A line start (the runner splits on \n and \r), whitespace, then `::`.
_LINE_COMMAND = re.compile(r"(^|[\r\n])([^\S\r\n]*)::")


def defuse(text: str) -> str:
    """`::` at a line start becomes `\\::` (Markdown renders it as `::`); `##[` becomes `#\\#[`."""
    if "::" in text:
        text = _LINE_COMMAND.sub(lambda m: f"{m.group(1)}{m.group(2)}\\::", text)
    return text.replace("##[", "#\\#[")


def has_command_line(text: str) -> bool:
    """True when some line would be read as a workflow command (for tests and fuzzing)."""
    return bool(_LINE_COMMAND.search(text)) or "##[" in text
