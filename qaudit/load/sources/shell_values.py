"""Values of the bash reader: characters that remember their source line and what they
depend on when unknown, arrays whose elements may exist only under a condition, and how the
outcomes of an undecided condition merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from qaudit.load.sources.argv import HOLE
from qaudit.load.sources.tokens import External, Word

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


_TEXT, _HOLE = itemgetter(0), itemgetter(2)  # map() with these runs at C speed


def text_of(chars: Chars) -> str:
    return "".join(map(_TEXT, chars))


def holes(chars: Chars) -> tuple[External, ...]:
    if not any(map(_HOLE, chars)):
        return ()
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


def _same_chars(a: Chars, b: Chars) -> bool:
    """plain(a) == plain(b) without building either: same text, same holes in place."""
    if a is b or a == b:
        return True
    return len(a) == len(b) and text_of(a) == text_of(b) and \
        list(map(_HOLE, a)) == list(map(_HOLE, b))


def same_shape(a, b) -> bool:
    """plain(a) == plain(b): the same value whatever lines its characters came from."""
    if a is b:
        return True
    if isinstance(a, ArrayValue) and isinstance(b, ArrayValue):
        return _same_elems(a.elems, b.elems)
    if isinstance(a, ArrayValue) and not a.elems and b == () or \
            isinstance(b, ArrayValue) and not b.elems and a == ():
        return True  # an empty array and an empty string expand alike
    if isinstance(a, ArrayValue) or isinstance(b, ArrayValue) or a is None or b is None \
            or a is UNSET or b is UNSET:
        return False
    return _same_chars(a, b)


def _same_elems(a: tuple[Elem, ...], b: tuple[Elem, ...]) -> bool:
    return len(a) == len(b) and all(x.condition == y.condition and _same_chars(x.chars, y.chars)
                                    for x, y in zip(a, b))


def merge_values(values: list, why: tuple[External, ...], differs: External):
    if all(same_shape(value, values[0]) for value in values[1:]):
        return values[0]
    arrays = [v for v in values if isinstance(v, ArrayValue) or v is None or v is UNSET]
    if len(arrays) == len(values):
        # Arrays that only grew in some outcomes (ARGS+=(...) under a condition): keep the
        # common prefix, mark the extra elements conditional.
        elems = [as_array(v) for v in values]
        longest = max(elems, key=len)
        shortest = min(len(e) for e in elems)
        if all(_same_elems(e, longest[:len(e)]) for e in elems):
            merged = list(longest[:shortest])
            merged += [Elem(e.chars, tuple(dict.fromkeys(e.condition + why)))
                       for e in longest[shortest:]]
            return ArrayValue(tuple(merged))
    return hole(differs)
