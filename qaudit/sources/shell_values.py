"""Values of the bash reader: characters that remember their source line and what they
depend on when unknown, arrays whose elements may exist only under a condition, and how the
outcomes of an undecided condition merge.
"""

from __future__ import annotations

from dataclasses import dataclass

from qaudit.sources.argv import HOLE
from qaudit.sources.tokens import External, Word

# A character of an expanded value: (text, source line, what it depends on if unknown).
Ch = tuple[str, int, "External | None"]
Chars = tuple[Ch, ...]


@dataclass(frozen=True)
class Elem:
    """An array element; `condition` when it exists only if an undecided condition holds."""

    chars: Chars
    condition: tuple[External, ...] = ()


@dataclass(frozen=True)
class ArrayValue:
    elems: tuple[Elem, ...]


class _Unset:
    """A variable the script itself unset: expands to nothing (unlike one never set)."""


UNSET = _Unset()


def text_of(chars: Chars) -> str:
    return "".join(c[0] for c in chars)


def holes(chars: Chars) -> tuple[External, ...]:
    return tuple(dict.fromkeys(c[2] for c in chars if c[2] is not None))


def hole(external: External) -> Chars:
    return ((HOLE, external.line or 0, external),)


def known(text: str, line: int) -> Chars:
    return tuple((c, line, None) for c in text)


def to_word(chars: Chars, line: int, condition: tuple[External, ...] = ()) -> Word:
    return Word(text_of(chars), chars[0][1] if chars else line, holes(chars), condition)


def chars_of(word: Word, line: int) -> Chars:
    """Back from a Word to characters (holes matched to its unknowns in order)."""
    unknown = iter(word.unknown)
    return tuple((c, word.line or line, next(unknown, None) if c == HOLE else None)
                 for c in word.text)


def as_scalar(state) -> Chars:
    if isinstance(state, ArrayValue):
        return state.elems[0].chars if state.elems else ()
    if state is None or state is UNSET:
        return ()
    return state


def as_array(state) -> tuple[Elem, ...]:
    if isinstance(state, ArrayValue):
        return state.elems
    if state is None or state is UNSET:
        return ()
    return (Elem(state),)


def join(elems: tuple[Elem, ...], line: int) -> Chars:
    out: list[Ch] = []
    for i, elem in enumerate(elems):
        if i:
            out.append((" ", line, None))
        out.extend(elem.chars)
    return tuple(out)


def plain(value):
    """A value without line numbers, to compare outcomes of different branches."""
    if isinstance(value, ArrayValue):
        return tuple((tuple((c, h) for c, _, h in e.chars), e.condition) for e in value.elems)
    if value is None or value is UNSET:
        return value
    return tuple((c, h) for c, _, h in value)


def merge_values(values: list, why: tuple[External, ...], differs: External):
    shapes = [plain(v) for v in values]
    if all(shape == shapes[0] for shape in shapes):
        return values[0]
    arrays = [v for v in values if isinstance(v, ArrayValue) or v is None or v is UNSET]
    if len(arrays) == len(values):
        # Arrays that only grew in some outcomes (ARGS+=(...) under a condition): keep the
        # common prefix, mark the extra elements conditional.
        elems = [as_array(v) for v in values]
        longest = max(elems, key=len)
        shortest = min(len(e) for e in elems)
        if all(plain(ArrayValue(e)) == plain(ArrayValue(longest[:len(e)])) for e in elems):
            merged = list(longest[:shortest])
            merged += [Elem(e.chars, tuple(dict.fromkeys(e.condition + why)))
                       for e in longest[shortest:]]
            return ArrayValue(tuple(merged))
    return hole(differs)
