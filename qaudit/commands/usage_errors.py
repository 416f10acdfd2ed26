"""Usage errors as one line: `error: <what>` and exit 2, like every other refusal of qaudit.

Typer (Click) prints a usage error as four lines: the usage, a hint, a blank line and
`Error: ...`. A CI log or a wrapper that reads qaudit's first `error:` line gets neither.
The command group used by qaudit's app turns every usage error raised while the command line
is parsed (an unknown option, `--steps 0`, `--fail-on bogus`, `guard --mode pause`) or
raised by a command itself into that one line, and exits 2 through Typer's own exit path.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from qaudit.errors import printable

try:  # Typer 0.2x carries its own Click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - Typer on Click
    from click.exceptions import UsageError  # type: ignore[no-redef]

EXIT_USAGE = 2


def one_line(exc: UsageError) -> str:
    """`error: invalid value for '--steps': ... (qaudit check -h for help)`."""
    message = exc.format_message().replace(": Value error, ", ": ")
    message = message[:1].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    hint = ""
    if ctx is not None and ctx.help_option_names:
        hint = f" ({ctx.command_path} {ctx.help_option_names[0]} for help)"
    return printable(f"error: {' '.join(message.split())}{hint}")[:2000]


def _refuse(exc: UsageError) -> typer.Exit:
    sys.stderr.write(one_line(exc) + "\n")
    return typer.Exit(EXIT_USAGE)


class OneLineUsageErrors(TyperGroup):
    """qaudit's command group: usage errors of the group and of every command, one line."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:
            raise _refuse(exc) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise _refuse(exc) from None
