"""Hydra's override grammar (hydra-core 1.3, the version Bridge's `parse_hydra_overrides`
uses), read into data: `key=value`, `+key=value`, `++key=value`, `~key[=value]`.

Bridge parses each `a.b=c` argument with hydra's OverridesParser, so the value's type is
the grammar's, not YAML's: `[on, 0x10, 1e3]` is `['on', '0x10', 1000.0]` (PyYAML would read
`[True, 16, '1e3']`), `\\,` and `\\ ` are escapes, a token hydra's lexer does not know (`#`,
`&`, `!`, a non-ASCII letter) is a parse error. docs/bridge.md (Overrides) lists the rules;
tests/test_override_grammar.py compares this reader with hydra-core itself where installed.

What the grammar accepts but qaudit refuses, because it would run code or read the
environment: interpolations (`${...}`, resolved by OmegaConf), grammar functions (`int(3)`,
`choice(...)`) and sweeps (`a=1,2`, which Bridge cannot apply either). Work is linear in the
text: one pass of the tokenizer, one of the parser, nesting bounded by the loader's limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from qaudit.load.yamlio import MAX_INT_DIGITS, MAX_NESTING, YamlMap


class GrammarError(Exception):
    """The argument is not a valid override (or uses a part qaudit refuses); says why."""


@dataclass(frozen=True)
class ParsedOverride:
    kind: str  # "change", "add" (+), "force_add" (++), "delete" (~)
    key: str
    value: Any  # None for `~key` without a value (has_value False)
    has_value: bool


# --- the key side --------------------------------------------------------------------------

_ID = r"[A-Za-z_$][A-Za-z0-9_$-]*"
_SEGMENT = rf"(?:{_ID}|0|[1-9](?:_?[0-9])*)"
# hydra's key: empty, an ID, or a dotted path whose parts may be integers (`0.a`, `a.0`); a
# lone integer (`0=1`, `+0=1`) is no key to its lexer.
_KEY = re.compile(rf"|{_ID}|{_SEGMENT}(?:\.{_SEGMENT})+")
_GROUP_OR_PACKAGE = re.compile(r"[A-Za-z0-9_$./@-]+")


def parse_override(text: str) -> ParsedOverride:
    if text.startswith("++"):
        kind, rest = "force_add", text[2:]
    elif text.startswith("+"):
        kind, rest = "add", text[1:]
    elif text.startswith("~"):
        kind, rest = "delete", text[1:]
    else:
        kind, rest = "change", text
    key, sep, raw = rest.partition("=")
    if not sep and kind != "delete":
        raise GrammarError("missing '=value' (Hydra override syntax: a.b=c, +a.b=c, ++a.b=c, "
                           "~a.b)")
    if not _KEY.fullmatch(key):
        if key and _GROUP_OR_PACKAGE.fullmatch(key) and ("/" in key or "@" in key):
            raise GrammarError(f"'{key}' is a config group or package override (`/`, `@`); "
                               "Bridge's ConfigContainer has no config groups")
        raise GrammarError("expected key=value (Hydra override syntax: a.b=c, +a.b=c, "
                           "++a.b=c, ~a.b)")
    if not sep:
        return ParsedOverride(kind, key, None, False)
    return ParsedOverride(kind, key, parse_value(raw), True)


# --- the value side: tokens ----------------------------------------------------------------

_WS = r"[ \t]+"
_INT_UNSIGNED = r"(?:0|[1-9](?:_?[0-9])*)"
_POINT_FLOAT = rf"(?:{_INT_UNSIGNED}?\.[0-9](?:_?[0-9])*|{_INT_UNSIGNED}\.)"
_EXPONENT_FLOAT = rf"(?:(?:{_POINT_FLOAT}|{_INT_UNSIGNED})[eE][+-]?[0-9](?:_?[0-9])*)"
_ESC_ONE = r"(?:\\\\|\\\(|\\\)|\\\[|\\\]|\\\{|\\\}|\\:|\\=|\\,|\\ |\\\t)"

# In the lexer's order: on two matches of one length, the earlier kind wins (`inf` is a
# float, `null` a null, not identifiers); otherwise the longest match wins.
_TOKENS: list[tuple[str, re.Pattern[str]]] = [(kind, re.compile(pattern)) for kind, pattern in (
    ("POPEN", rf"(?:{_WS})?\((?:{_WS})?"),
    ("COMMA", rf"(?:{_WS})?,(?:{_WS})?"),
    ("PCLOSE", rf"(?:{_WS})?\)"),
    ("BRACKET_OPEN", rf"\[(?:{_WS})?"),
    ("BRACKET_CLOSE", rf"(?:{_WS})?\]"),
    ("BRACE_OPEN", rf"\{{(?:{_WS})?"),
    ("BRACE_CLOSE", rf"(?:{_WS})?\}}"),
    ("COLON", rf"(?:{_WS})?:(?:{_WS})?"),
    ("EQUAL", rf"(?:{_WS})?=(?:{_WS})?"),
    ("FLOAT", rf"[+-]?(?:{_EXPONENT_FLOAT}|{_POINT_FLOAT}|[Ii][Nn][Ff]|[Nn][Aa][Nn])"),
    ("INT", rf"[+-]?{_INT_UNSIGNED}"),
    ("BOOL", r"[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]"),
    ("NULL", r"[Nn][Uu][Ll][Ll]"),
    ("UNQUOTED_CHAR", r"[/\-\\+.$%*@?|]"),
    ("ID", r"[A-Za-z_][A-Za-z0-9_-]*"),
    ("ESC", rf"{_ESC_ONE}+"),
    ("WS", _WS),
    ("INTERPOLATION", r"\$\{[^}]+\}"),
)]


def _candidates(char: str) -> list[tuple[str, re.Pattern[str]]]:
    """The token kinds that can start with `char`, in the lexer's order."""
    starts = {
        "POPEN": " \t(", "COMMA": " \t,", "PCLOSE": " \t)", "BRACKET_OPEN": "[",
        "BRACKET_CLOSE": " \t]", "BRACE_OPEN": "{", "BRACE_CLOSE": " \t}", "COLON": " \t:",
        "EQUAL": " \t=", "FLOAT": "+-.0123456789iInN", "INT": "+-0123456789", "BOOL": "tTfF",
        "NULL": "nN", "UNQUOTED_CHAR": "/-\\+.$%*@?|", "ESC": "\\", "WS": " \t",
        "INTERPOLATION": "$"}
    return [(kind, pattern) for kind, pattern in _TOKENS
            if char in starts.get(kind, "") or kind == "ID" and (char.isascii() and char.isalpha()
                                                                 or char == "_")]


# Each character's candidate kinds, computed once: most characters start one or two kinds.
_BY_FIRST = {chr(code): _candidates(chr(code)) for code in range(128)}
_PRIMITIVE_PARTS = frozenset({"ID", "NULL", "INT", "FLOAT", "BOOL", "INTERPOLATION",
                              "UNQUOTED_CHAR", "COLON", "ESC", "WS"})
_DICT_KEY_PARTS = _PRIMITIVE_PARTS - {"INTERPOLATION", "COLON"}


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    at = 0
    while at < len(text):
        if text[at] in "'\"":
            end = _quoted_end(text, at)
            out.append(("QUOTED", text[at:end]))
            at = end
            continue
        best: tuple[str, str] | None = None
        for kind, pattern in _BY_FIRST.get(text[at], ()):
            match = pattern.match(text, at)
            if match and match.end() > at and (best is None or len(match.group()) > len(best[1])):
                best = (kind, match.group())
        if best is None:
            raise GrammarError(f"Hydra's grammar has no token for {text[at]!r} (at character "
                               f"{at + 1} of the value); quote the value")
        out.append(best)
        at += len(best[1])
    return out


def _quoted_end(text: str, start: int) -> int:
    """The end of the quoted value opened at `start`: the first same quote not escaped by an
    odd number of backslashes."""
    quote = text[start]
    at = start + 1
    while True:
        at = text.find(quote, at)
        if at < 0:
            raise GrammarError(f"a {quote} quote that is never closed")
        backslashes = 0
        while text[at - 1 - backslashes] == "\\" and at - 1 - backslashes > start:
            backslashes += 1
        if backslashes % 2 == 0:
            return at + 1
        at += 1


def _unquoted(token: str) -> str:
    """A quoted value's text: `\\<quote>` is the quote, and the backslashes before the closing
    quote are halved; every other backslash stays."""
    quote, body = token[0], token[1:-1]
    trailing = len(body) - len(body.rstrip("\\"))
    body, tail = body[:len(body) - trailing], "\\" * (trailing // 2)
    out, run = [], 0
    for char in body:
        if char == "\\":
            run += 1
            continue
        if char == quote:  # an odd run of backslashes escapes it: halve the rest
            out.append("\\" * (run // 2) + quote)
        else:
            out.append("\\" * run + char)
        run = 0
    return "".join(out) + "\\" * run + tail


# --- the value side: the parser ------------------------------------------------------------

def parse_value(raw: str) -> Any:
    tokens = _tokens(raw.lstrip(" \t"))  # the `=` token takes the blanks after it
    if not tokens:
        return ""
    parser = _Parser(tokens)
    value = parser.element(0)
    if parser.peek() == "COMMA":
        raise GrammarError("a sweep (a=1,2) needs Hydra's multirun, which Bridge does not use")
    if parser.at < len(tokens):
        raise GrammarError(f"unexpected {tokens[parser.at][1].strip()!r} after the value")
    return value


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at][0] if self.at < len(self.tokens) else None

    def take(self, kind: str) -> str:
        if self.peek() != kind:
            found = self.tokens[self.at][1].strip() if self.at < len(self.tokens) else "the end"
            raise GrammarError(f"expected {_SHOWN.get(kind, kind)}, found {found!r}")
        self.at += 1
        return self.tokens[self.at - 1][1]

    def element(self, depth: int) -> Any:
        """`depth`: the collections around this element. A file's bound counts collections
        (PyYAML's flow level), so the 65th opened is refused, empty or not."""
        kind = self.peek()
        if kind in ("BRACKET_OPEN", "BRACE_OPEN") and depth >= MAX_NESTING:
            raise GrammarError(f"nested more than {MAX_NESTING} levels; refused, as in a file")
        if kind == "BRACKET_OPEN":
            return self.sequence(depth)
        if kind == "BRACE_OPEN":
            return self.mapping(depth)
        if kind == "ID" and self.at + 1 < len(self.tokens) \
                and self.tokens[self.at + 1][0] == "POPEN":
            raise GrammarError(f"Hydra grammar functions ({self.tokens[self.at][1]}(...)) are "
                               "not supported")
        return self.primitive(_PRIMITIVE_PARTS)

    def sequence(self, depth: int) -> list[Any]:
        self.take("BRACKET_OPEN")
        items: list[Any] = []
        if self.peek() != "BRACKET_CLOSE":
            items.append(self.element(depth + 1))
            while self.peek() == "COMMA":
                self.at += 1
                items.append(self.element(depth + 1))
        self.take("BRACKET_CLOSE")
        return items

    def mapping(self, depth: int) -> YamlMap:
        self.take("BRACE_OPEN")
        result = YamlMap(line=None)
        if self.peek() != "BRACE_CLOSE":
            while True:
                if self.peek() == "QUOTED":  # hydra's dictKey has no quoted form
                    raise GrammarError("a quoted mapping key; Hydra's grammar takes unquoted "
                                       "keys only ({a: 1})")
                key = self.primitive(_DICT_KEY_PARTS)
                if key is None:  # OmegaConf refuses a None key
                    raise GrammarError("a null mapping key (Hydra refuses it)")
                self.take("COLON")
                result[key] = self.element(depth + 1)
                if self.peek() != "COMMA":
                    break
                self.at += 1
        self.take("BRACE_CLOSE")
        return result

    def primitive(self, parts: frozenset[str]) -> Any:
        if self.peek() == "QUOTED":
            return self._quoted(self.take("QUOTED"))
        start = self.at
        while self.peek() in parts:
            self.at += 1
        run = self.tokens[start:self.at]
        if not run:
            found = self.tokens[self.at][1].strip() if self.at < len(self.tokens) else "the end"
            raise GrammarError(f"expected a value, found {found!r}")
        if run[0][0] == "WS":
            run = run[1:]
        if run and run[-1][0] == "WS":
            run = run[:-1]
        if not run:
            raise GrammarError("a value of blanks only")
        if len(run) == 1:
            return _typed(*run[0])
        return _text("".join(text[1::2] if kind == "ESC" else text for kind, text in run))

    @staticmethod
    def _quoted(token: str) -> str:
        return _text(_unquoted(token))


_SHOWN = {"BRACKET_CLOSE": "']'", "BRACE_CLOSE": "'}'", "COLON": "':'", "QUOTED": "a quoted value"}


def _typed(kind: str, text: str) -> Any:
    if kind == "INT":
        digits = len(text.lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:
            raise GrammarError(f"an integer of {digits} digits; more than {MAX_INT_DIGITS} is "
                               "refused, as in a file")
        return int(text)
    if kind == "FLOAT":
        return float(text)
    if kind == "NULL":
        return None
    if kind == "BOOL":
        return text.lower() == "true"
    if kind == "ESC":
        return text[1::2]
    return _text(text)


def _text(value: str) -> str:
    if "${" in value:
        raise GrammarError("interpolations (${...}) are refused: they resolve from the "
                           "environment or run resolvers")
    return value
