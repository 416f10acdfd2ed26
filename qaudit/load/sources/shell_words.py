"""The pieces of a bash word in tree-sitter's tree: literal characters with their source lines
and quoting, and what a `$NAME` / `${...}` asks for. The evaluator (`shell_eval`) expands them.
"""

from __future__ import annotations

from dataclasses import dataclass

from qaudit.load.sources.shell_tree import Script

# A literal character: (text, source line, quoted). Quoted ones are never glob patterns.
Piece = tuple[str, int, bool]
# How backslashes read in each quoting (bash's rules): outside quotes `\c` is `c`; inside
# double quotes only before these; inside single quotes never.
_DOUBLE_QUOTE_ESCAPES = set('$`"\\\n')
_ANSI_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "a": "\a", "r": "\r",
                 "e": "\x1b", "E": "\x1b", "0": "\0"}
# `${NAME<op>word}` operators the evaluator follows; any other form is unknown.
DEFAULT_OPERATORS = (":-", ":=", ":+", ":?", "-", "=", "+", "?")


def literal(script: Script, start: int, end: int, quoting: str) -> list[Piece]:
    """The characters bytes [start, end) stand for: `quoting` is 'none' (unquoted), 'double'
    (inside "..."), 'single' ('...') or 'ansi' ($'...'). A line continuation (backslash,
    newline) disappears; every other character keeps the line it was written on."""
    text = script.text(None, start, end)
    line = script.line_at(start)
    quoted = quoting != "none"
    out: list[Piece] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quoting != "single" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "\n" and quoting != "ansi":
                i, line = i + 2, line + 1
                continue
            if quoting == "none":
                out.append((nxt, line, True))
                line += nxt == "\n"
                i += 2
                continue
            if quoting == "double" and nxt in _DOUBLE_QUOTE_ESCAPES:
                out.append((nxt, line, True))
                i += 2
                continue
            if quoting == "ansi":
                out.extend((c, line, True) for c in _ANSI_ESCAPES.get(nxt, "\\" + nxt))
                line += nxt == "\n"
                i += 2
                continue
        out.append((c, line, quoted))
        line += c == "\n"
        i += 1
    return out


@dataclass(slots=True)
class Param:
    """`$NAME`, `${NAME}`, `${NAME:-word}`, `${#NAME}`, `${NAME[@]}`, `$1`, `$@`, ..."""

    name: str
    line: int
    quoted: bool
    index: str | None = None  # '@', '*', a number, or other text inside [...]
    op: str | None = None  # one of DEFAULT_OPERATORS, '#len', or 'other' (not evaluated)
    arg: tuple = ()  # the nodes of the word after the operator


def param(script: Script, node, quoted: bool) -> tuple[Param, list[Piece]]:
    """A `simple_expansion` or `expansion` node; the literal characters that follow it in the
    same node (`$10` is `$1` then `0` to bash)."""
    line = script.line(node)
    if node.type == "simple_expansion":
        name = script.text(node.named_children[0]) if node.named_child_count else "?"
        if name.isdigit() and len(name) > 1:
            first = node.named_children[0].start_byte + 1
            return Param(name[0], line, quoted), literal(script, first, node.end_byte,
                                                         "double" if quoted else "none")
        return Param(name, line, quoted), []
    children = node.children[1:-1]  # between '${' and '}'
    prefix = children[0].type if children and not children[0].is_named else None
    if prefix is not None:
        children = children[1:]
    subject = children[0] if children and children[0].type in (
        "variable_name", "special_variable_name", "subscript") else None
    name, index = _name_of(script, subject)
    rest = children[1:] if subject is not None else children
    if prefix == "#":
        if subject is None and not rest:
            return Param("#", line, quoted), []  # ${#}: the argument count
        return Param(name, line, quoted, index, "#len" if not rest else "other"), []
    if prefix is not None or subject is None:
        return Param("!" if prefix == "!" else "?", line, quoted, None, "other"), []
    if not rest:
        return Param(name, line, quoted, index), []
    op = script.text(rest[0]) if not rest[0].is_named else None
    if op not in DEFAULT_OPERATORS or any(not n.is_named for n in rest[1:]):
        return Param(name, line, quoted, index, "other"), []
    return Param(name, line, quoted, index, op, tuple(rest[1:])), []


def _name_of(script: Script, subject) -> tuple[str, str | None]:
    if subject is None:
        return "", None
    if subject.type != "subscript":
        return script.text(subject), None
    name = subject.child_by_field_name("name")
    index = subject.child_by_field_name("index")
    return (script.text(name) if name else "",
            script.text(index) if index is not None else "")
