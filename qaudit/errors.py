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
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        key = f"key '{self.key}': " if self.key else ""
        return f"{where}{key}{self.message}"


class EnvironmentProblem(Exception):
    """The machine cannot do what was asked (missing TE, no CUDA); exit code 3."""
