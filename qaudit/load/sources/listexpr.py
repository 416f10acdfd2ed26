"""Megatron's `--moe-layer-freq` list expressions, parsed without `eval`.

Upstream evaluates strings such as `([0]*3+[1]*58)` with Python; qaudit must never evaluate
input, so this is a tiny recursive-descent parser for the only shapes those strings take:

    expr   := term ('+' term)*
    term   := factor ('*' INT)* | INT '*' factor
    factor := '[' INT (',' INT)* [','] ']' | '(' expr ')'

Anything else (names, calls, floats, strings, comprehensions) is rejected with a ValueError.
The `(expr)*n` group form is accepted because upstream documents it (`([1]*3+[0]*1)*3`).
"""

from __future__ import annotations

import re

# Real models have at most a few hundred layers; the cap stops `[0]*10**9`-style inputs from
# allocating before the layer-count check could reject them.
MAX_LENGTH = 100_000
MAX_DEPTH = 50  # parentheses; real patterns nest one or two deep
MAX_DIGITS = 9  # an entry or a repeat count; MAX_LENGTH bounds them anyway
_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")


def is_list_expression(text: str) -> bool:
    """Upstream's own test: a string containing '[' is a pattern, otherwise an integer."""
    return "[" in text


def parse_list_expression(text: str) -> list[int]:
    tokens = _tokenize(text)
    parser = _Parser(tokens, text)
    result = parser.expr()
    if parser.pos != len(tokens):
        parser.fail(f"unexpected {tokens[parser.pos]!r}")
    return result


def _tokenize(text: str) -> list[str]:
    tokens = []
    for match in _TOKEN.finditer(text):
        number, other = match.groups()
        if number is not None:
            tokens.append(number)
        elif other is not None and not other.isspace():
            if other not in "[](),+*":
                raise ValueError(f"{text!r} is not a list expression like ([0]*3+[1]*12): "
                                 f"unexpected {other!r}")
            tokens.append(other)
    return tokens


class _Parser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.pos = 0
        self.depth = 0

    def fail(self, why: str) -> None:
        raise ValueError(f"{self.text!r} is not a list expression like ([0]*3+[1]*12): {why}")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None:
            self.fail("it ends too early")
        if expected is not None and token != expected:
            self.fail(f"expected {expected!r}, got {token!r}")
        self.pos += 1
        return token  # type: ignore[return-value]

    def integer(self) -> int:
        token = self.take()
        if not token.isdigit():
            self.fail(f"expected an integer, got {token!r}")
        if len(token) > MAX_DIGITS:
            self.fail(f"{token[:12]}... has more than {MAX_DIGITS} digits")
        return int(token)

    def expr(self) -> list[int]:
        result = self.term()
        while self.peek() == "+":
            self.take("+")
            result.extend(self.term())  # in place: `a + b` per term was quadratic
            self.check_length(len(result))
        return result

    def term(self) -> list[int]:
        if self.peek() is not None and self.peek().isdigit():  # type: ignore[union-attr]
            count = self.integer()
            self.take("*")
            return self.repeat(self.factor(), count)
        result = self.factor()
        while self.peek() == "*":
            self.take("*")
            result = self.repeat(result, self.integer())
        return result

    def factor(self) -> list[int]:
        token = self.take()
        if token == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self.fail(f"parentheses nested more than {MAX_DEPTH} deep")
            inner = self.expr()
            self.take(")")
            self.depth -= 1
            return inner
        if token != "[":
            self.fail(f"expected '[' or '(', got {token!r}")
        items = [self.integer()]
        while self.peek() == ",":
            self.take(",")
            if self.peek() == "]":
                break
            items.append(self.integer())
        self.take("]")
        return items

    def repeat(self, items: list[int], count: int) -> list[int]:
        self.check_length(len(items) * count)
        return items * count

    def check_length(self, length: int) -> None:
        if length > MAX_LENGTH:
            self.fail(f"it has {length} entries (more than {MAX_LENGTH})")
