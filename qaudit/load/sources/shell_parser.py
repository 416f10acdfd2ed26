"""A syntax tree for the bash found in launch scripts: commands, assignments, `if`, loops,
`case`, groups, functions. Built from `shell_lexer` tokens; nothing is executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from qaudit.errors import InputError
from qaudit.load.sources.shell_lexer import (REDIRECTIONS, ArithCmd, ArrayAssign, Lit, Op, WordTok,
                                        tokenize)

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")
DECLARATIONS = ("export", "declare", "local", "typeset", "readonly")
_RESERVED_ENDS = {"then", "elif", "else", "fi", "do", "done", "esac", "}"}
MAX_DEPTH = 200


@dataclass(slots=True)
class Assign:
    name: str
    line: int
    append: bool = False
    index: str | None = None
    value: WordTok | None = None  # scalar assignment
    array: list[WordTok] | None = None  # NAME=( ... )


@dataclass(slots=True)
class Simple:
    assigns: list[Assign]
    words: list[WordTok]
    line: int


@dataclass(slots=True)
class Test:
    """`[[ ... ]]`: words and the operators && || ( ) ! < > between them."""

    items: list  # WordTok or str
    line: int


@dataclass(slots=True)
class ArithTest:
    raw: str
    line: int


@dataclass(slots=True)
class If:
    branches: list[tuple[list, list]]  # (condition, body)
    orelse: list | None
    line: int


@dataclass(slots=True)
class Loop:
    until: bool
    condition: list
    body: list
    line: int


@dataclass(slots=True)
class For:
    var: str
    words: list[WordTok] | None  # None: "$@"
    body: list
    line: int


@dataclass(slots=True)
class Case:
    word: WordTok
    items: list[tuple[list[WordTok], list]]
    line: int


@dataclass(slots=True)
class Group:
    body: list
    subshell: bool
    line: int


@dataclass(slots=True)
class Function:
    name: str
    body: list
    line: int


@dataclass(slots=True)
class Pipeline:
    commands: list
    negated: bool
    line: int


@dataclass(slots=True)
class AndOr:
    first: Pipeline
    rest: list[tuple[str, Pipeline]] = field(default_factory=list)


class Parser:
    def __init__(self, tokens: list, file: str) -> None:
        self.tokens = tokens
        self.pos = 0
        self.file = file
        self.depth = 0

    def fail(self, message: str, line: int | None = None) -> InputError:
        return InputError(f"cannot read the script: {message}", file=self.file,
                          line=line if line is not None else self.line())

    def line(self) -> int:
        token = self.peek()
        if token is not None:
            return token.line
        return self.tokens[-1].line if self.tokens else 1

    def peek(self, offset: int = 0):
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def next(self):
        token = self.peek()
        self.pos += 1
        return token

    def is_op(self, *kinds: str) -> bool:
        token = self.peek()
        return isinstance(token, Op) and token.kind in kinds

    def is_word(self, *texts: str) -> bool:
        token = self.peek()
        return isinstance(token, WordTok) and token.literal() in texts

    def expect_word(self, text: str, opened_at: int) -> None:
        if not self.is_word(text):
            raise self.fail(f"expected '{text}' (for the block opened at line {opened_at})")
        self.next()

    def skip_newlines(self) -> None:
        while self.is_op("\n", ";"):
            self.next()

    # --- lists -------------------------------------------------------------------------------
    def script(self) -> list:
        body = self.compound_list(top=True)
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.describe(self.peek())}")
        return body

    def describe(self, token) -> str:
        if isinstance(token, Op):
            return repr(token.kind)
        if isinstance(token, WordTok):
            return repr(token.literal() or "word")
        return "token"

    def compound_list(self, top: bool = False) -> list:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail("nested too deeply")
        items: list = []
        while True:
            self.skip_newlines()
            token = self.peek()
            if token is None or self.is_op(")", ";;", ";&", ";;&"):
                break
            if isinstance(token, WordTok) and token.literal() in _RESERVED_ENDS:
                break
            items.append(self.and_or())
            if self.is_op("&"):
                self.next()
        self.depth -= 1
        return items

    def and_or(self) -> AndOr:
        node = AndOr(self.pipeline())
        while self.is_op("&&", "||"):
            op = self.next().kind
            while self.is_op("\n"):
                self.next()
            node.rest.append((op, self.pipeline()))
        return node

    def pipeline(self) -> Pipeline:
        line = self.line()
        negated = False
        if self.is_word("!"):
            self.next()
            negated = True
        commands = [self.command()]
        while self.is_op("|", "|&"):
            self.next()
            while self.is_op("\n"):
                self.next()
            commands.append(self.command())
        return Pipeline(commands, negated, line)

    # --- commands ----------------------------------------------------------------------------
    def command(self):
        token = self.peek()
        if token is None:
            raise self.fail("the script ends in the middle of a command")
        if isinstance(token, ArithCmd):
            self.next()
            node = ArithTest(token.raw, token.line)
        elif self.is_op("("):
            self.next()
            body = self.compound_list()
            if not self.is_op(")"):
                raise self.fail(f"'(' at line {token.line} is never closed")
            self.next()
            node = Group(body, True, token.line)
        elif isinstance(token, WordTok) and token.literal() in ("if", "while", "until", "for",
                                                                  "case", "{", "[[", "function"):
            node = getattr(self, "p_" + {"{": "group", "[[": "test"}.get(
                token.literal(), token.literal()))()
        elif isinstance(token, WordTok) and self._is_function_def():
            node = self.p_funcdef()
        else:
            return self.simple()
        self.redirections()
        return node

    def _is_function_def(self) -> bool:
        return (isinstance(self.peek(1), Op) and self.peek(1).kind == "("
                and isinstance(self.peek(2), Op) and self.peek(2).kind == ")")

    def redirections(self) -> None:
        while self.is_op(*REDIRECTIONS):
            self.next()
            if isinstance(self.peek(), WordTok):
                self.next()

    def simple(self) -> Simple:
        line = self.line()
        assigns: list[Assign] = []
        words: list[WordTok] = []
        while True:
            token = self.peek()
            if isinstance(token, ArrayAssign):
                self.next()
                if not words or words[0].literal() in DECLARATIONS:
                    assigns.append(Assign(token.name, token.line, token.append,
                                          array=token.elements))
            elif isinstance(token, WordTok):
                self.next()
                assign = None
                if not words or words[0].literal() in DECLARATIONS:
                    assign = split_assignment(token)
                if assign is not None:
                    assigns.append(assign)
                else:
                    words.append(token)
            elif self.is_op(*REDIRECTIONS):
                self.redirections()
            else:
                break
        if not assigns and not words:
            raise self.fail(f"unexpected {self.describe(self.peek())}")
        return Simple(assigns, words, line)

    def p_if(self) -> If:
        line = self.next().line
        branches = []
        orelse = None
        condition = self.compound_list()
        self.expect_word("then", line)
        branches.append((condition, self.compound_list()))
        while True:
            if self.is_word("elif"):
                self.next()
                condition = self.compound_list()
                self.expect_word("then", line)
                branches.append((condition, self.compound_list()))
            elif self.is_word("else"):
                self.next()
                orelse = self.compound_list()
            else:
                break
        self.expect_word("fi", line)
        return If(branches, orelse, line)

    def p_while(self) -> Loop:
        return self._loop(until=False)

    def p_until(self) -> Loop:
        return self._loop(until=True)

    def _loop(self, until: bool) -> Loop:
        line = self.next().line
        condition = self.compound_list()
        self.expect_word("do", line)
        body = self.compound_list()
        self.expect_word("done", line)
        return Loop(until, condition, body, line)

    def p_for(self) -> For:
        line = self.next().line
        if isinstance(self.peek(), ArithCmd):  # for (( ... )): C-style, never unrolled
            self.next()
            var, words = "", []
        else:
            name = self.next()
            if not isinstance(name, WordTok) or not name.literal():
                raise self.fail("expected a variable name after 'for'", line)
            var, words = name.literal(), None
            self.skip_newlines_only()
            if self.is_word("in"):
                self.next()
                words = []
                while isinstance(self.peek(), WordTok):
                    words.append(self.next())
        self.skip_newlines()
        self.expect_word("do", line)
        body = self.compound_list()
        self.expect_word("done", line)
        return For(var, words, body, line)

    def skip_newlines_only(self) -> None:
        while self.is_op("\n"):
            self.next()

    def p_case(self) -> Case:
        line = self.next().line
        word = self.next()
        if not isinstance(word, WordTok):
            raise self.fail("expected a word after 'case'", line)
        self.skip_newlines_only()
        self.expect_word("in", line)
        items = []
        while True:
            self.skip_newlines()
            if self.is_word("esac"):
                self.next()
                return Case(word, items, line)
            if self.is_op("("):
                self.next()
            patterns = []
            while True:
                token = self.next()
                if not isinstance(token, WordTok):
                    raise self.fail("expected a case pattern", line)
                patterns.append(token)
                if self.is_op("|"):
                    self.next()
                    continue
                break
            if not self.is_op(")"):
                raise self.fail("expected ')' after a case pattern", line)
            self.next()
            body = self.compound_list()
            if self.is_op(";;", ";&", ";;&"):
                self.next()
            items.append((patterns, body))
            if self.peek() is None:
                raise self.fail(f"'case' at line {line} is never closed with 'esac'", line)

    def p_group(self) -> Group:
        line = self.next().line
        body = self.compound_list()
        self.expect_word("}", line)
        return Group(body, False, line)

    def p_test(self) -> Test:
        line = self.next().line
        items: list = []
        while not self.is_word("]]"):
            token = self.next()
            if token is None:
                raise self.fail(f"'[[' at line {line} is never closed", line)
            if isinstance(token, Op):
                if token.kind != "\n":
                    items.append(token.kind)
            elif isinstance(token, WordTok):
                items.append(token)
        self.next()
        return Test(items, line)

    def p_function(self) -> Function:
        line = self.next().line
        name = self.next()
        if not isinstance(name, WordTok) or not name.literal():
            raise self.fail("expected a function name", line)
        if self.is_op("("):
            self.next()
            if self.is_op(")"):
                self.next()
        self.skip_newlines_only()
        return Function(name.literal(), [self.command()], line)

    def p_funcdef(self) -> Function:
        name = self.next()
        self.next()
        self.next()
        self.skip_newlines_only()
        return Function(name.literal() or "", [self.command()], name.line)


def split_assignment(word: WordTok) -> Assign | None:
    """`NAME=value`, `NAME+=value`, `NAME[i]=value` written as one word, else None."""
    if not word.parts or not isinstance(word.parts[0], Lit) or word.parts[0].quoted:
        return None
    first = word.parts[0]
    match = _ASSIGNMENT.match(first.text)
    if not match:
        return None
    cut = match.end()
    rest = Lit(first.text[cut:], first.lines[cut:], False)
    value = WordTok(([rest] if rest.text else []) + word.parts[1:], word.line)
    index = match.group(2)[1:-1] if match.group(2) else None
    return Assign(match.group(1), word.line, bool(match.group(3)), index, value=value)


def parse_script(text: str, file: str) -> list:
    return Parser(tokenize(text, file), file).script()
