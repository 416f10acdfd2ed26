"""Every printed or written output goes through `defuse`: the one place input text (config
and recipe names, report and baseline fields, installed metadata, upstream's messages) is
made safe to show.

Escapes: every character that is not printable (escape sequences, carriage returns, bidi
overrides, lone surrogates, which no encoder accepts) is written as its Python escape
(`\\x1b`, `\\u202e`, `\\ud800`) by `qaudit.errors.printable`, the function error lines use too;
newlines stay. qaudit's own colours (`own_sequences`) are kept, and only those.

No workflow command from input text: GitHub Actions runs a log line as a command when it
starts, after leading whitespace, with `::` (and reads the legacy `##[...]` form). Names from
the input (matchers, configs, paths) reach the table, Markdown and SVG outputs, where wrapping
can start a line with them; every format but `github`, whose commands are the point and whose
user text is escaped, goes through `defuse` before it is printed or written.
"""

from __future__ import annotations

import re

from qaudit.errors import printable

# A line start (the runner splits on \n and \r), whitespace, then `::`.
_LINE_COMMAND = re.compile(r"(^|[\r\n])([^\S\r\n]*)::")


def defuse(text: str, *, own_sequences: tuple[str, ...] = (), commands: bool = True) -> str:
    """Non-printable characters escaped (`own_sequences`, qaudit's own colour codes, kept);
    with `commands`, `::` at a line start becomes `\\::` (Markdown renders it as `::`) and `##[`
    becomes `#\\#[` (the `github` format's commands are its point: its user text is escaped
    where it is written)."""
    text = _escaped(text, own_sequences)
    if not commands:
        return text
    if "::" in text:
        text = _LINE_COMMAND.sub(lambda m: f"{m.group(1)}{m.group(2)}\\::", text)
    return text.replace("##[", "#\\#[")


def has_command_line(text: str) -> bool:
    """True when some line would be read as a workflow command (for tests and fuzzing)."""
    return bool(_LINE_COMMAND.search(text)) or "##[" in text


def _escaped(text: str, own_sequences: tuple[str, ...]) -> str:
    if text.isprintable() or not own_sequences:
        return printable(text, keep_newlines=True)
    pattern = "(" + "|".join(re.escape(seq) for seq in own_sequences) + ")"
    return "".join(piece if i % 2 else printable(piece, keep_newlines=True)
                   for i, piece in enumerate(re.split(pattern, text)))


def escaped_strings(value):
    """A copy of `value` (dataclasses, lists, tuples, dicts of them) with every string
    escaped as `defuse` escapes it: for renderers that add their own control sequences
    (colour), so that input text can never hold one of theirs."""
    import copy
    import dataclasses

    if isinstance(value, str):
        return printable(value, keep_newlines=True)
    if isinstance(value, list):
        return [escaped_strings(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(escaped_strings(v) for v in value)
    if isinstance(value, dict):
        return {escaped_strings(k): escaped_strings(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        clone = copy.copy(value)
        for field in dataclasses.fields(value):
            object.__setattr__(clone, field.name, escaped_strings(getattr(value, field.name)))
        return clone
    return value
