"""Split Megatron's argv into flag occurrences, the way its argparse parser would.

The arity of every upstream option comes from `upstream_flags`; an option the parser does not
know takes the words up to the next option, as custom flags in real scripts usually do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from qaudit.load.sources.tokens import Word
from qaudit.load.sources.upstream_flags import UPSTREAM_FLAGS

# Marks the part of a word's text that comes from an unknown value.
HOLE = "\x00"
_NUMBER = re.compile(r"^-\d|^-\.\d")


@dataclass
class Occurrence:
    flag: str
    word: Word  # the flag itself (its line is the flag's line)
    values: list[Word] = field(default_factory=list)

    @property
    def line(self) -> int | None:
        return self.word.line


@dataclass
class Argv:
    occurrences: list[Occurrence]
    # Words in flag position that are not a known flag: unknown values that may expand to
    # flags, or stray positional words.
    loose: list[Word]


def arity(flag: str) -> str | None:
    """'T'/'F' for switches, '1', '3', '+', '*' for options with values, None if unknown."""
    spec = UPSTREAM_FLAGS.get(flag)
    return spec[1].rstrip("ifs") if spec else None


def _is_option(word: Word) -> bool:
    """argparse's rule: a word starting with '-' is an option unless it looks like a number."""
    text = word.text
    return text.startswith("-") and not text.startswith(HOLE) and not _NUMBER.match(text)


def split_argv(words: list[Word]) -> Argv:
    occurrences: list[Occurrence] = []
    loose: list[Word] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        name, _, inline = word.text.partition("=")
        if not (word.text.startswith("--") and HOLE not in name):
            loose.append(word)
            continue
        occurrence = Occurrence(name, Word(name, word.line, (), word.condition))
        occurrences.append(occurrence)
        if "=" in word.text:
            occurrence.values.append(Word(inline, word.line, word.unknown, word.condition))
            continue
        kind = arity(name)
        if kind in ("T", "F"):
            continue
        wanted = int(kind) if kind and kind.isdigit() else None
        while i < len(words) and not _is_option(words[i]):
            if wanted is not None and len(occurrence.values) >= wanted:
                break
            occurrence.values.append(words[i])
            i += 1
    return Argv(occurrences, loose)
