"""Command-line words read from a file, with where they came from and what is not known.

Both readers (MODEL_ARGS YAML and bash launch scripts) reduce their input to the argv that
Megatron would receive. A word may be only partly known: `--num-layers $NUM_LAYERS` with
NUM_LAYERS never set in the file. Such words are kept, with the outside values they depend on,
so that the audit fails only when an unknown value actually matters to it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class External:
    """A value the file takes from outside: an unset variable, a command substitution, ..."""

    name: str  # the variable (or '$(...)') as the user would recognise it
    line: int | None  # where the file refers to it
    why: str  # e.g. "not set in the script"
    # Variables whose value would decide this one (a condition reads them): `--set` on any of
    # them is a fix too.
    deciders: tuple[str, ...] = ()

    def settable(self) -> bool:
        """Whether `--set NAME=VALUE` can supply it (a variable, not a command's output)."""
        return self.name.isidentifier() or self.name.isdigit()

    def describe(self) -> str:
        where = f", line {self.line}" if self.line else ""
        return f"{self.display()} ({self.why}{where})"

    def display(self) -> str:
        return f"${self.name}" if self.settable() else self.name


@dataclass(frozen=True)
class Word:
    """One argv word. `text` holds known parts; `unknown` lists what the rest depends on.

    `condition` is set when the word is passed only if a condition the reader could not decide
    holds (an `if` on an unset variable, a loop body); it names what that condition reads.
    """

    text: str
    line: int | None
    unknown: tuple[External, ...] = ()
    condition: tuple[External, ...] = ()

    @property
    def known(self) -> bool:
        return not self.unknown

    def depends_on(self) -> tuple[External, ...]:
        return self.unknown + self.condition
