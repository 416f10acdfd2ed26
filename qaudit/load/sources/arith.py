"""Bash `$(( ... ))` arithmetic on known integers, without eval.

Integers, variables, parentheses and bash's operators except assignment, increment and the
comma operator (side effects are not modelled). Results wrap to 64 bits as in bash. Anything
else raises `ArithUnknown`, and the caller treats the value as unknown.
"""

from __future__ import annotations

import re
from typing import Callable

_TOKEN = re.compile(r"\s*(0[xX][0-9a-fA-F]+|\d+|[A-Za-z_][A-Za-z0-9_]*|\*\*|<<|>>|<=|>=|==|!=|"
                    r"&&|\|\||[-+*/%()<>!~&|^?:])")
_BINARY = [  # lowest precedence first
    ("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="),
    ("<<", ">>"), ("+", "-"), ("*", "/", "%"),
]
MAX_DEPTH = 50


MAX_DIGITS = 100  # bash wraps at 64 bits; past this a literal is refused, not converted


class ArithUnknown(Exception):
    """The expression uses something not known or not supported; the message says what."""


class ArithRefused(Exception):
    """The expression is refused outright (exit 2): a literal too long to convert."""


def _wrap(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def evaluate(text: str, lookup: Callable[[str], str | None], depth: int = 0) -> int:
    """`lookup(name)` returns a variable's text (None when unknown)."""
    if depth > MAX_DEPTH:
        raise ArithUnknown("variables refer to each other too deeply")
    tokens = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise ArithUnknown(f"unsupported arithmetic {text[pos:pos + 10]!r}")
        tokens.append(match.group(1))
        pos = match.end()
    if not tokens:
        return 0
    parser = _Parser(tokens, lookup, depth)
    value = parser.ternary()
    if parser.pos != len(tokens):
        raise ArithUnknown(f"unsupported arithmetic near {tokens[parser.pos]!r}")
    return value


class _Parser:
    def __init__(self, tokens: list[str], lookup: Callable[[str], str | None], depth: int) -> None:
        self.tokens = tokens
        self.pos = 0
        self.lookup = lookup
        self.depth = depth

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        if self.pos >= len(self.tokens):
            raise ArithUnknown("arithmetic expression ends too early")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def ternary(self) -> int:
        condition = self.binary(0)
        if self.peek() != "?":
            return condition
        self.take()
        yes = self.ternary()
        if self.take() != ":":
            raise ArithUnknown("expected ':' in a ?: expression")
        no = self.ternary()
        return yes if condition else no

    def binary(self, level: int) -> int:
        if level == len(_BINARY):
            return self.power()
        left = self.binary(level + 1)
        while self.peek() in _BINARY[level]:
            op = self.take()
            right = self.binary(level + 1)
            left = _wrap(_apply(op, left, right))
        return left

    def power(self) -> int:
        base = self.unary()
        if self.peek() == "**":
            self.take()
            exponent = self.power()  # right-associative
            if exponent < 0 or exponent > 64:
                raise ArithUnknown("exponent out of range")
            return _wrap(base ** exponent)
        return base

    def unary(self) -> int:
        token = self.peek()
        if token in ("-", "+", "!", "~"):
            self.take()
            value = self.unary()
            return _wrap({"-": -value, "+": value, "!": int(not value), "~": ~value}[token])
        return self.atom()

    def atom(self) -> int:
        token = self.take()
        if token == "(":
            value = self.ternary()
            if self.take() != ")":
                raise ArithUnknown("unbalanced parentheses")
            return value
        if token[0].isdigit():
            if len(token) > MAX_DIGITS:
                raise ArithRefused(f"an integer literal with {len(token)} digits (more than "
                                   f"{MAX_DIGITS})")
            if token[:2].lower() == "0x":
                return _wrap(int(token, 16))
            if len(token) > 1 and token[0] == "0":
                if set(token) - set("01234567"):
                    raise ArithUnknown(f"{token} is not an octal number")
                return _wrap(int(token, 8))
            return _wrap(int(token))
        if token[0].isalpha() or token[0] == "_":
            value = self.lookup(token)
            if value is None:
                raise ArithUnknown(token)
            return evaluate(value, self.lookup, self.depth + 1) if value.strip() else 0
        raise ArithUnknown(f"unexpected {token!r}")


def _apply(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        if b == 0:
            raise ArithUnknown("division by zero")
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # truncates like C
        return quotient if op == "/" else a - b * quotient
    if op in ("<<", ">>"):
        if not 0 <= b < 64:
            raise ArithUnknown("shift out of range")
        return a << b if op == "<<" else a >> b
    return {
        "||": lambda: int(bool(a) or bool(b)), "&&": lambda: int(bool(a) and bool(b)),
        "|": lambda: a | b, "^": lambda: a ^ b, "&": lambda: a & b,
        "==": lambda: int(a == b), "!=": lambda: int(a != b), "<": lambda: int(a < b),
        ">": lambda: int(a > b), "<=": lambda: int(a <= b), ">=": lambda: int(a >= b),
        "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
    }[op]()
