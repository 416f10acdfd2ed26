"""Error types that map to qaudit's exit codes (2: bad input, 3: environment)."""

from __future__ import annotations


class InputError(Exception):
    """Bad user input: reported as one line naming file, line and key; exit code 2."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.key = key

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = _clip(self.file, 300) + (f":{self.line}" if self.line else "") + ": "
        key = f"key '{_clip(self.key, 80)}': " if self.key else ""
        return printable(f"{where}{key}{_clip(self.message, 1000)}")


def _clip(text: str, limit: int) -> str:
    """At most `limit` characters, keeping both ends (a message's reason is at its end)."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def printable(text: str, keep_newlines: bool = False) -> str:
    """Safe for a terminal: escape sequences, carriage returns, bidi overrides escaped; one
    line unless `keep_newlines` (then each renderer shows or encodes the newlines itself)."""
    if text.isprintable():
        return text
    # One escape per distinct character, applied in one pass (a whole rendered report can be
    # millions of characters; a generator over each of them was seconds).
    escapes = {ord(c): c.encode("unicode_escape").decode("ascii") for c in set(text)
               if not (c.isprintable() or (keep_newlines and c == "\n"))}
    return text.translate(escapes)


class EnvironmentProblem(Exception):
    """The machine cannot do what was asked (missing TE, no CUDA); exit code 3."""
