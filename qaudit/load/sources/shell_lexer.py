"""Tokens of a bash script: words (with their quoting and expansions), operators, arrays.

Only reads text. Nothing here (or anywhere in qaudit) runs a command, a substitution or an
`eval`: `$(...)` and backticks are kept as opaque parts whose value is unknown.

`bashlex` was tried first and rejected: it raises NotImplementedError on `$((...))` arithmetic
and a ParsingError on `$#`, both common in Megatron's launch scripts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from qaudit.errors import InputError

# --- word parts -------------------------------------------------------------------------------


@dataclass(slots=True)
class Lit:
    """Literal characters; `quoted` ones are never split into several words."""

    text: str
    lines: list[int]
    quoted: bool


@dataclass(slots=True)
class Param:
    """`$NAME`, `${NAME}`, `${NAME:-word}`, `${#NAME}`, `${NAME[@]}`, `$1`, `$@`, ..."""

    name: str
    line: int
    quoted: bool
    index: str | None = None  # '@', '*', a number, or other text inside [...]
    op: str | None = None  # ':-', '-', ':=', '=', ':+', '+', ':?', '?', '#len', 'other'
    arg: list = field(default_factory=list)  # parts of the word after the operator


@dataclass(slots=True)
class CmdSub:
    """`$(...)` or a backtick substitution: never run, its value is unknown."""

    raw: str
    line: int
    quoted: bool


@dataclass(slots=True)
class Arith:
    """`$((...))`: evaluated from known values only (see `arith`)."""

    raw: str
    line: int
    quoted: bool


@dataclass(slots=True)
class WordTok:
    parts: list
    line: int

    def literal(self) -> str | None:
        """The word's text when it is a plain unquoted literal (for reserved words)."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Lit) and not self.parts[0].quoted:
            return self.parts[0].text
        return None

    def static_text(self) -> str | None:
        """The text when the word has no expansions (quotes allowed), else None."""
        if all(isinstance(p, Lit) for p in self.parts):
            return "".join(p.text for p in self.parts)
        return None


@dataclass(slots=True)
class Op:
    kind: str  # '\n', ';', ';;', ';&', ';;&', '&', '&&', '|', '||', '|&', '(', ')', redirs
    line: int


@dataclass(slots=True)
class ArrayAssign:
    """`NAME=( words )` or `NAME+=( words )`."""

    name: str
    append: bool
    elements: list[WordTok]
    line: int


@dataclass(slots=True)
class ArithCmd:
    """`(( expression ))` used as a command."""

    raw: str
    line: int


REDIRECTIONS = ("<<<", "<<-", "&>>", "<<", ">>", "<&", ">&", "&>", "<>", ">|", "<", ">")
_OPERATORS = (";;&", ";;", ";&", "&&", "||", "|&", ";", "&", "|", "(", ")")
_META = set(" \t\n;&|()<>")
# Runs of characters with no meaning to the lexer, read in one step (a 1 MiB script must lex in
# about a second): outside quotes, anything but _META, backslash, quotes, `$` and backtick;
# inside double quotes, anything but the quote, backslash, `$`, backtick and newline.
_WORD_RUN = re.compile(r"[^ \t\n;&|()<>\\'\"$`]+")
_QUOTED_RUN = re.compile(r"[^\"\\$`\n]+")
_OPERATOR_START = set("<>&|;()")
# Words and operators in one script. Real launch scripts have a few hundred (the largest of
# the corpus: 366); each costs a few hundred bytes once parsed, so this bounds the memory of a
# 1 MiB script made of tiny commands.
MAX_TOKENS = 100_000  # the parts of a word (literal runs, $expansions, quotes) count too
_NAME_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | set("0123456789")
_SPECIAL_PARAMS = set("@*#?$!-0123456789")


class _WordParts:
    """The parts of a word being read: finished parts, and the literal run since the last one
    (its characters and the line of each)."""

    def __init__(self, quoted: bool, counted=lambda part: part) -> None:
        self.parts: list = []
        self.quoted = quoted
        self.counted = counted  # Lexer.counted: every part counts against MAX_TOKENS
        self._chars: list[str] = []
        self._lines: list[int] = []

    def char(self, c: str, line: int) -> None:
        self._chars.append(c)
        self._lines.append(line)

    def run(self, text: str, line: int) -> None:
        """Several characters of one line."""
        self._chars.append(text)
        self._lines.extend([line] * len(text))

    def pending(self) -> str:
        return "".join(self._chars)

    def flush(self, keep_empty: bool = False) -> None:
        """End the literal run; `keep_empty`: a word with no parts yet still gets one ("")."""
        if self._chars or (keep_empty and not self.parts):
            self.parts.append(self.counted(Lit("".join(self._chars), list(self._lines),
                                               self.quoted)))
            self._chars.clear()
            self._lines.clear()

    def add(self, *parts) -> None:
        self.flush()
        self.parts.extend(self.counted(part) for part in parts)


class Lexer:
    def __init__(self, text: str, file: str, line: int = 1) -> None:
        self.text = text
        self.file = file
        self.pos = 0
        self.line = line
        self.heredocs: list[tuple[str, bool]] = []
        self.count = 0  # tokens so far, array elements included

    def fail(self, message: str, line: int | None = None) -> InputError:
        return InputError(f"cannot read the script: {message}", file=self.file,
                          line=line or self.line)

    # --- low-level ---------------------------------------------------------------------------
    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.text[i] if i < len(self.text) else ""

    def advance(self, count: int = 1) -> str:
        chunk = self.text[self.pos:self.pos + count]
        self.line += chunk.count("\n")
        self.pos += count
        return chunk

    def skip_blanks(self) -> None:
        """Spaces, tabs, line continuations and comments (not newlines)."""
        while True:
            c = self.peek()
            if c in (" ", "\t"):
                self.advance()
            elif c == "\\" and self.peek(1) == "\n":
                self.advance(2)
            elif c == "#":
                while self.peek() not in ("", "\n"):
                    self.advance()
            else:
                return

    def counted(self, token):
        self.count += 1
        if self.count > MAX_TOKENS:
            raise self.fail(f"more than {MAX_TOKENS:,} words, operators and quoted or expanded "
                            f"parts (real launch scripts have a few hundred)")
        return token

    # --- tokens ------------------------------------------------------------------------------
    def tokens(self) -> list:
        result: list = []
        while True:
            self.skip_blanks()
            c = self.peek()
            if c == "":
                return result
            line = self.line
            if c == "\n":
                self.advance()
                result.append(self.counted(Op("\n", line)))
                self.read_heredoc_bodies()
                continue
            if c == "(" and self.peek(1) == "(":
                result.append(self.counted(self.arith_command()))
                continue
            op = self.operator()
            if op is not None:
                result.append(self.counted(Op(op, line)))
                if op in ("<<", "<<-"):
                    self.heredoc_delimiter(op == "<<-")
                continue
            word = self.word()
            if not word.parts:
                continue  # an fd number, dropped
            array = self.array_assignment(word)
            result.append(self.counted(array if array is not None else word))

    def operator(self) -> str | None:
        if self.peek() not in _OPERATOR_START:
            return None
        for op in REDIRECTIONS + _OPERATORS:
            if self.text.startswith(op, self.pos):
                self.advance(len(op))
                return op
        return None

    def arith_command(self) -> ArithCmd:
        line = self.line
        self.advance(2)
        raw = self.until_double_paren(line)
        return ArithCmd(raw, line)

    def until_double_paren(self, line: int) -> str:
        """Text up to the `))` that closes an arithmetic `((`, nested parens balanced."""
        depth = 0
        start = self.pos
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("unterminated (( ... ))", line)
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0 and self.peek(1) == ")":
                    raw = self.text[start:self.pos]
                    self.advance(2)
                    return raw
                depth -= 1
            self.advance()

    def heredoc_delimiter(self, strip_tabs: bool) -> None:
        self.skip_blanks()
        word = self.word()
        delimiter = "".join(p.text for p in word.parts if isinstance(p, Lit))
        self.heredocs.append((delimiter, strip_tabs))

    def read_heredoc_bodies(self) -> None:
        """Skip here-document bodies: their text is input to a command, never flags."""
        while self.heredocs:
            delimiter, strip_tabs = self.heredocs.pop(0)
            while self.pos < len(self.text):
                end = self.text.find("\n", self.pos)
                end = len(self.text) if end < 0 else end
                current = self.text[self.pos:end]
                self.advance(end - self.pos + (1 if end < len(self.text) else 0))
                if (current.lstrip("\t") if strip_tabs else current) == delimiter:
                    break

    def array_assignment(self, word: WordTok) -> ArrayAssign | None:
        text = word.literal()
        if text is None or self.peek() != "(" or not text.endswith("="):
            return None
        name = text[:-2] if text.endswith("+=") else text[:-1]
        if not name or name[0] not in _NAME_START or not set(name) <= _NAME_CHARS:
            return None
        line = word.line
        self.advance()
        elements: list[WordTok] = []
        while True:
            self.skip_blanks()
            c = self.peek()
            if c == "":
                raise self.fail(f"array {name}=( is never closed", line)
            if c == "\n":
                self.advance()
                continue
            if c == ")":
                self.advance()
                return ArrayAssign(name, text.endswith("+="), elements, line)
            if c in _META:
                raise self.fail(f"unexpected {c!r} inside the array {name}=( ... )")
            word = self.word()
            if word.parts:
                elements.append(self.counted(word))

    # --- words -------------------------------------------------------------------------------
    def _take_char(self, word: _WordParts) -> None:
        line = self.line
        word.char(self.advance(), line)

    def _take_run(self, word: _WordParts, pattern: re.Pattern) -> None:
        """A run of plain characters (never a newline), or one character."""
        match = pattern.match(self.text, self.pos)
        if match is None:
            self._take_char(word)
            return
        word.run(match.group(), self.line)
        self.pos = match.end()

    def word(self) -> WordTok:
        line = self.line
        word = _WordParts(quoted=False, counted=self.counted)
        while True:
            c = self.peek()
            if c == "" or c in _META:
                if c in "<>" and word.pending().isdigit() and not word.parts:
                    return WordTok([], line)  # an fd number before a redirection ("2>&1")
                break
            if c == "\\":
                if self.peek(1) == "\n":
                    self.advance(2)
                    continue
                self.advance()
                escaped_line = self.line
                escaped = self.advance() if self.peek() else ""
                word.add(Lit(escaped, [escaped_line] * len(escaped), True))
            elif c == "'":
                word.add(self.single_quoted())
            elif c == '"':
                word.add(*self.double_quoted())
            elif c == "$" and self.peek(1) == "'":
                word.add(self.ansi_c_quoted())
            elif c == "$" and self.peek(1) == '"':
                self.advance()
                word.add(*self.double_quoted())
            elif c == "$":
                part = self.dollar(quoted=False)
                if part is None:
                    self._take_char(word)
                else:
                    word.add(part)
            elif c == "`":
                word.add(self.backtick(quoted=False))
            else:
                self._take_run(word, _WORD_RUN)
        word.flush()
        return WordTok(word.parts, line)

    def single_quoted(self) -> Lit:
        line = self.line
        self.advance()
        end = self.text.find("'", self.pos)
        if end < 0:
            raise self.fail("unterminated single quote", line)
        return self._literal_until(end, quoted=True, skip=1)

    def _literal_until(self, end: int, quoted: bool, skip: int) -> Lit:
        text = self.text[self.pos:end]
        lines: list[int] = []
        pieces = text.split("\n")
        for offset, piece in enumerate(pieces):  # a newline belongs to the line it ends
            lines.extend([self.line + offset] * (len(piece) + (offset < len(pieces) - 1)))
        self.advance(end - self.pos)
        self.advance(skip)
        return Lit(text, lines, quoted)

    def ansi_c_quoted(self) -> Lit:
        line = self.line
        self.advance(2)
        chars, lines = [], []
        escapes = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "a": "\a", "r": "\r",
                   "e": "\x1b", "E": "\x1b", "0": "\0"}
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("unterminated $'...' quote", line)
            if c == "'":
                self.advance()
                return Lit("".join(chars), lines, True)
            lines.append(self.line)
            if c == "\\" and self.peek(1):
                self.advance()
                chars.append(escapes.get(self.peek(), "\\" + self.peek()))
                self.advance()
            else:
                chars.append(self.advance())

    def double_quoted(self) -> list:
        line = self.line
        self.advance()
        word = _WordParts(quoted=True, counted=self.counted)
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("unterminated double quote", line)
            if c == '"':
                self.advance()
                word.flush(keep_empty=True)
                return word.parts
            if c == "\\" and self.peek(1) in ("$", "`", '"', "\\", "\n"):
                self.advance()
                if self.peek() == "\n":
                    self.advance()
                    continue
                self._take_char(word)
            elif c == "$":
                part = self.dollar(quoted=True)
                if part is None:
                    self._take_char(word)
                else:
                    word.add(part)
            elif c == "`":
                word.add(self.backtick(quoted=True))
            else:
                self._take_run(word, _QUOTED_RUN)

    def backtick(self, quoted: bool) -> CmdSub:
        line = self.line
        self.advance()
        start = self.pos
        while self.peek() not in ("`", ""):
            self.advance(2 if self.peek() == "\\" else 1)
        if self.peek() == "":
            raise self.fail("unterminated backtick", line)
        raw = self.text[start:self.pos]
        self.advance()
        return CmdSub(raw, line, quoted)

    # --- $ expansions ------------------------------------------------------------------------
    def dollar(self, quoted: bool):
        """The expansion starting at '$', or None when the '$' is a plain character."""
        line = self.line
        nxt = self.peek(1)
        if nxt == "(" and self.peek(2) == "(":
            self.advance(3)
            return Arith(self.until_double_paren(line), line, quoted)
        if nxt == "(":
            self.advance(2)
            return CmdSub(self.until_close_paren(line), line, quoted)
        if nxt == "{":
            self.advance(2)
            return self.braced(line, quoted)
        if nxt in _NAME_START:
            self.advance()
            start = self.pos
            while self.peek() in _NAME_CHARS and self.peek():
                self.advance()
            return Param(self.text[start:self.pos], line, quoted)
        if nxt and nxt in _SPECIAL_PARAMS:
            self.advance(2)
            return Param(nxt, line, quoted)
        return None

    def until_close_paren(self, line: int) -> str:
        """Raw text of a `$(...)`, skipping quoted and nested parentheses."""
        depth = 0
        start = self.pos
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("unterminated $( ... )", line)
            if c == "\\":
                self.advance(2)
                continue
            if c in ("'", '"'):
                end = self._closing_quote(c)
                self.advance(end + 1 - self.pos)
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    raw = self.text[start:self.pos]
                    self.advance()
                    return raw
                depth -= 1
            self.advance()

    def _closing_quote(self, quote: str) -> int:
        i = self.pos + 1
        while i < len(self.text):
            if self.text[i] == "\\" and quote == '"':
                i += 2
                continue
            if self.text[i] == quote:
                return i
            i += 1
        raise self.fail(f"unterminated {quote} quote")

    def braced(self, line: int, quoted: bool) -> Param:
        """`${...}` after the '${'."""
        if self.peek() == "#" and self.peek(1) not in ("}", ""):
            self.advance()
            name, index = self.param_name()
            self.expect_close(line)
            return Param(name, line, quoted, index, "#len")
        if self.peek() == "!":
            # Indirection (${!name}): the value names another variable; not followed.
            self.skip_braced(line)
            return Param("!", line, quoted, None, "other")
        name, index = self.param_name()
        if not name:
            self.skip_braced(line)
            return Param("?", line, quoted, None, "other")
        if self.peek() == "}":
            self.advance()
            return Param(name, line, quoted, index)
        for op in (":-", ":=", ":+", ":?", "-", "=", "+", "?"):
            if self.text.startswith(op, self.pos):
                self.advance(len(op))
                arg = self.braced_word(line, quoted)
                return Param(name, line, quoted, index, op, arg)
        self.skip_braced(line)
        return Param(name, line, quoted, index, "other")

    def param_name(self) -> tuple[str, str | None]:
        start = self.pos
        if self.peek() and self.peek() in _SPECIAL_PARAMS and not self.peek().isdigit():
            self.advance()
        else:
            while self.peek() and self.peek() in _NAME_CHARS:
                self.advance()
        name = self.text[start:self.pos]
        index = None
        if self.peek() == "[":
            end = self.text.find("]", self.pos)
            if end < 0:
                raise self.fail("unterminated ${name[...]}")
            index = self.text[self.pos + 1:end]
            self.advance(end + 1 - self.pos)
        return name, index

    def expect_close(self, line: int) -> None:
        if self.peek() != "}":
            self.skip_braced(line)
        else:
            self.advance()

    def skip_braced(self, line: int) -> None:
        depth = 0
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("unterminated ${...}", line)
            if c == "\\":
                self.advance(2)
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                if depth == 0:
                    self.advance()
                    return
                depth -= 1
            self.advance()

    def braced_word(self, line: int, quoted: bool) -> list:
        """The word after `${name:-`, up to the matching '}' (quotes and expansions allowed)."""
        word = _WordParts(quoted, counted=self.counted)
        while True:
            c = self.peek()
            if c == "":
                raise self.fail("unterminated ${...}", line)
            if c == "}":
                self.advance()
                word.flush()
                return word.parts
            if c == "\\":
                self.advance()
                if self.peek() == "\n":
                    self.advance()
                    continue
                self._take_char(word)
            elif c == "'" and not quoted:
                word.add(self.single_quoted())
            elif c == '"':
                word.add(*self.double_quoted())
            elif c == "$":
                part = self.dollar(quoted)
                if part is None:
                    self._take_char(word)
                else:
                    word.add(part)
            elif c == "`":
                word.add(self.backtick(quoted))
            else:
                self._take_char(word)


def tokenize(text: str, file: str) -> list:
    return Lexer(text, file).tokens()
