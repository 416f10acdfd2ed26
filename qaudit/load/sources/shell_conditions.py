"""`[[ ... ]]` and `[ ... ]` expressions of the bash reader, three-valued: True, False, or None
(unknown, with what it depends on). Files are never looked at: file tests are unknown.
"""

from __future__ import annotations

import fnmatch

from qaudit.load.sources.shell_values import holes, text_of
from qaudit.load.sources.tokens import External

_FILE_TESTS = set("-a -b -c -d -e -f -g -h -k -p -r -s -t -u -w -x -G -L -N -O -S".split())
_INT_OPS = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-lt": lambda a, b: a < b,
            "-le": lambda a, b: a <= b, "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b}
_BINARY_OPS = {"=", "==", "!=", "<", ">", "=~"} | set(_INT_OPS)


class TestExpression:
    """`[[ ... ]]` / `[ ... ]` expressions, three-valued: True, False or None (unknown)."""

    def __init__(self, items: list, line: int, double: bool) -> None:
        self.items = items
        self.pos = 0
        self.line = line
        self.double = double

    def text(self, item) -> str | None:
        if isinstance(item, str):
            return item
        chars, _ = item
        return None if holes(chars) else text_of(chars)

    def peek_text(self) -> str | None:
        return self.text(self.items[self.pos]) if self.pos < len(self.items) else None

    def run(self) -> tuple[bool | None, tuple[External, ...]]:
        if not self.items:
            return False, ()
        result = self.or_()
        if self.pos != len(self.items):
            return None, (External("a test", self.line, "uses syntax qaudit does not read"),)
        return result

    def or_(self):
        left = self.and_()
        while self.peek_text() in ("||", "-o"):
            self.pos += 1
            left = _or(left, self.and_())
        return left

    def and_(self):
        left = self.not_()
        while self.peek_text() in ("&&", "-a"):
            self.pos += 1
            left = _and(left, self.not_())
        return left

    def not_(self):
        if self.peek_text() == "!":
            self.pos += 1
            value, externals = self.not_()
            return (None if value is None else not value), externals
        return self.primary()

    def primary(self):
        if self.pos >= len(self.items):
            return None, (External("a test", self.line, "ends too early"),)
        first = self.items[self.pos]
        if self.peek_text() == "(":
            self.pos += 1
            value = self.or_()
            if self.peek_text() == ")":
                self.pos += 1
            return value
        # binary operator?
        if self.pos + 2 < len(self.items) and self.text(self.items[self.pos + 1]) in _BINARY_OPS:
            left, op, right = first, self.text(self.items[self.pos + 1]), self.items[self.pos + 2]
            self.pos += 3
            return self.binary(left, op, right)
        op = self.text(first)
        if op in ("-z", "-n") and self.pos + 1 < len(self.items):
            operand = self.items[self.pos + 1]
            self.pos += 2
            if isinstance(operand, str):
                return (op == "-n") == bool(operand), ()
            chars, _ = operand
            if holes(chars):
                return None, holes(chars)
            return (op == "-n") == bool(chars), ()
        if op in _FILE_TESTS or op == "-v":
            self.pos += 2
            return None, (External(f"[ {op} ... ]", self.line,
                                   "a filesystem test; qaudit does not look at files"),)
        self.pos += 1
        if isinstance(first, str):
            return bool(first), ()
        chars, _ = first
        return (None, holes(chars)) if holes(chars) else (bool(chars), ())

    def binary(self, left, op: str, right):
        unknown = tuple(dict.fromkeys(
            e for item in (left, right) if not isinstance(item, str) for e in holes(item[0])))
        if unknown:
            return None, unknown
        a, b = self.text(left), self.text(right)
        if op in _INT_OPS:
            try:
                return _INT_OPS[op](int(a), int(b)), ()
            except ValueError:
                return None, (External(f"{a} {op} {b}", self.line, "compares non-integers"),)
        if op == "=~":
            return None, (External(f"=~ {b}", self.line, "regular expressions are not read"),)
        if op in ("<", ">"):
            return (a < b) if op == "<" else (a > b), ()
        equal = fnmatch.fnmatchcase(a, b) if self.double and _unquoted_pattern(right) else a == b
        return equal if op in ("=", "==") else not equal, ()


def _unquoted_pattern(item) -> bool:
    """In `[[ a == b ]]` an unquoted right side is a glob pattern: items are (characters,
    whether the word has unquoted glob characters)."""
    return not isinstance(item, str) and item[1]


def _and(a, b):
    if a[0] is False or b[0] is False:
        return False, ()
    if a[0] is True and b[0] is True:
        return True, ()
    return None, a[1] + b[1]


def _or(a, b):
    if a[0] is True or b[0] is True:
        return True, ()
    if a[0] is False and b[0] is False:
        return False, ()
    return None, a[1] + b[1]
