"""A bash script's syntax tree, from tree-sitter-bash; nothing is executed.

tree-sitter reads every corpus script (`$((...))` and `$#` included, which `bashlex` could not).
A script it cannot read (ERROR or MISSING nodes) is refused with the first such line. The
walk over the tree is the evaluator's (`shell_eval`); this module parses, bounds the tree's
size, and answers the questions about nodes the evaluator asks.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

import tree_sitter
import tree_sitter_bash

from qaudit.errors import InputError

# Syntax nodes in one script (words, operators, quotes, expansions, each counted). The largest
# corpus script has about 3,000; the bound keeps the walk over a 1 MiB script of tiny commands
# to about a second.
MAX_NODES = 100_000
_LANGUAGE = tree_sitter.Language(tree_sitter_bash.language())
_PARSER = tree_sitter.Parser(_LANGUAGE)
# Assignments that tree-sitter-bash may have joined to what follows them on the next line.
_PREFIX_ASSIGNMENTS = tree_sitter.Query(_LANGUAGE, "(command (variable_assignment) @a) "
                                                   "(variable_assignments (variable_assignment) @a)")
_BLANK_AFTER = re.compile(rb"(?<!\\)[ \t\n]")
MAX_REPAIRS = 50  # parses per script; each repairs every misread line it finds
# tree-sitter-bash's own time grows with the square of the expansions (`$`) and here-document
# starts (`<<`) on one line: an unquoted here-document line of 40,000 `$A ` takes 10 s to
# parse, 8,000 `<<E` on one line 5 s. Before parsing, each line costs the square of its count
# of both; real scripts have at most 4 per line (100 in all in the corpus), the bound allows
# a line of 1,000 and keeps the parse under 0.1 s.
MAX_LINE_WORK = 1_000_000
_LINE_STARTS = re.compile(rb"\$|<<")
# tree-sitter-bash's error recovery after a long pipeline takes memory growing with the square
# of its stages (5,000 `cat |` then a syntax error: 0.3 GB; 33,000: past 5 GB). Real scripts
# have at most 3 `|` in all (the corpus); every `|` but those of `||` counts, quoted or not.
MAX_PIPES = 1_000
_PIPE = re.compile(rb"(?<!\|)\|(?!\|)")
# tree-sitter-bash's time grows with the square of how many `[[` tests are open at once
# (`[[ ( ` nested 8,000 deep: 1.1 s; 50,000: 99 s; `if [[ (` 8,000 deep: 7.5 s), and so does
# its error recovery over lines that leave one open. Real scripts never open a `[[` inside
# another: the depth (each `[[` word opens, each `]]` closes) is bounded. Quoted strings and
# comments are skipped, coarsely (a `[[` inside `"$( )"` may be skipped with its string: a
# nesting through such strings is still counted every other level).
MAX_TEST_NESTING = 50
_TEST_BRACKET = re.compile(rb"'[^']*'|\"(?:\\.|[^\"\\])*\"|(?:^|(?<=\s))#[^\n]*"
                           rb"|(?:^|(?<=[\s;&|(!]))(\[\[)(?=\s)|(?<=\s)(\]\])(?=$|[\s;&|)])")
# Node types of whole statements (and comments).
_STATEMENTS = {"comment", "command", "variable_assignment", "variable_assignments",
               "declaration_command", "unset_command", "test_command", "if_statement",
               "while_statement", "for_statement", "c_style_for_statement", "case_statement",
               "compound_statement", "subshell", "function_definition", "pipeline", "list",
               "negated_command", "redirected_statement"}
# Node types that only carry text for their statement (comments, here-document parts).
_NOT_STATEMENTS = {"comment", "heredoc_body", "heredoc_start", "heredoc_end"}


class Script:
    """The tree of one script and its source, with the line of any byte."""

    def __init__(self, text: str, file: str) -> None:
        self.file = file
        # Lone surrogates cannot come from a file (read_text decodes strictly) but may come
        # from a caller; they travel through as they are.
        self.source = text.encode("utf-8", "surrogatepass")
        self._line_starts = [0] + [i + 1 for i, b in enumerate(self.source) if b == 10]
        self.prescan_work = self._prescan()
        self.root = self._parse()
        self._refuse_broken()

    def _parse(self):
        """The tree, with tree-sitter-bash's misreading of `A=1 B=2<newline>cmd` repaired.

        There it may read the next lines as part of the same command (`cmd` with `A` and `B`
        as its environment, or worse, several lines of assignments and a `while` as one
        command), where bash ends the command at the newline. An assignment followed by a
        newline before its next sibling gets a `;` in place of the blank after it (same
        length: every byte keeps its offset, and lines are counted on the original source),
        and the script is parsed again."""
        source = bytearray(self.source)
        for _ in range(MAX_REPAIRS):
            root = _PARSER.parse(bytes(source)).root_node
            # Before any query: a query's time grows with the tree's size times its depth
            # (a 120,000-term `a && b && ...` is one left-deep chain).
            self._refuse_large(root)
            repairs = []
            for node in tree_sitter.QueryCursor(_PREFIX_ASSIGNMENTS).captures(root).get("a", []):
                after = node.next_named_sibling
                gap = bytes(source[node.end_byte:after.start_byte]) if after is not None else b""
                blank = _BLANK_AFTER.search(gap)
                if blank is not None and b"\n" in gap.replace(b"\\\n", b""):
                    repairs.append(node.end_byte + blank.start())
            if not repairs:
                return root
            for offset in repairs:
                source[offset] = ord(";")
        raise InputError("cannot read the script: too many lines of several assignments "
                         "followed by a command", file=self.file)

    def _prescan(self) -> int:
        """The counted work of the bound above (the sum over lines of the square of their
        `$` and `<<`); InputError naming the line where it passes MAX_LINE_WORK."""
        work, pipes, start = 0, 0, 0
        for piece in self.source.split(b"\n"):
            count = len(_LINE_STARTS.findall(piece))
            work += count * count
            if work > MAX_LINE_WORK:
                raise InputError(f"cannot read the script: more than {MAX_LINE_WORK:,} units of "
                                 "parsing work (each line costs the square of its `$` and `<<`; "
                                 "real launch scripts have a few per line)", file=self.file,
                                 line=self.line_at(start))
            pipes += len(_PIPE.findall(piece))
            if pipes > MAX_PIPES:
                raise InputError(f"cannot read the script: more than {MAX_PIPES:,} pipes `|` "
                                 "(real launch scripts have a few)", file=self.file,
                                 line=self.line_at(start))
            start += len(piece) + 1
        depth = 0
        for bracket in _TEST_BRACKET.finditer(self.source):
            if bracket.group(1):
                depth += 1
            elif bracket.group(2):
                depth = max(0, depth - 1)
            if depth > MAX_TEST_NESTING:
                raise InputError(f"cannot read the script: more than {MAX_TEST_NESTING} `[[` "
                                 "tests open at once (real launch scripts never nest them)",
                                 file=self.file, line=self.line_at(bracket.start()))
        return work

    def _refuse_large(self, root) -> None:
        if root.descendant_count > MAX_NODES:
            raise InputError(f"cannot read the script: more than {MAX_NODES:,} words, operators "
                             f"and quoted or expanded parts (real launch scripts have a few "
                             f"thousand)", file=self.file, line=1)

    def _refuse_broken(self) -> None:
        if not self.root.has_error:
            return
        node = self.root
        while not node.is_missing:
            # Inside an ERROR node, the statements it could read come first: the problem is
            # the first thing that is not one (the whole script may be one ERROR node).
            inner = next((c for c in node.children if not (
                c.is_named and not c.has_error and c.type in _STATEMENTS)), None) \
                if node.is_error else \
                next((c for c in node.children if c.has_error or c.is_missing), None)
            if inner is None:
                break
            node = inner
            if not (node.has_error or node.is_missing):
                break
        if node.is_missing and node.parent is not None:  # named where it was opened
            what = f"{node.parent.type.replace('_', ' ')} never closed: expected {node.type!r}"
            node = node.parent
        elif node.is_missing:
            what = f"expected {node.type!r}"
        else:
            what = f"bash syntax qaudit cannot read near {self.snippet(node)!r}"
        raise InputError(f"cannot read the script: {what}", file=self.file, line=self.line(node))

    def snippet(self, node) -> str:
        text = self.text(node).strip().split("\n", 1)[0]
        return text if len(text) <= 30 else text[:27] + "..."

    def text(self, node, start: int | None = None, end: int | None = None) -> str:
        start = node.start_byte if start is None else start
        end = node.end_byte if end is None else end
        return self.source[start:end].decode("utf-8", "surrogatepass")

    def line(self, node) -> int:
        return self.line_at(node.start_byte)

    def line_at(self, offset: int) -> int:
        return bisect_right(self._line_starts, offset)


def statements(nodes) -> list:
    """The statements among `nodes` (keywords, separators and comments dropped)."""
    return [n for n in nodes if n.is_named and n.type not in _NOT_STATEMENTS]


def body_of(node) -> list:
    """The statements of a `{ }`, `( )`, `do ... done` or the whole program."""
    return statements(node.children)


def and_or(node) -> list:
    """`a && b || c` as [(None, a), ('&&', b), ('||', c)] (tree-sitter nests it leftwards)."""
    chain = []
    while node.type == "list":
        left, op, right = node.children[0], node.children[1], node.children[-1]
        chain.append((op.type, right))
        node = left
    chain.append((None, node))
    return chain[::-1]


def split_command(script: Script, node) -> tuple[list, list, bool]:
    """A command's prefix assignments, its words (name first, redirections left out), and
    whether the assignments stand alone.

    tree-sitter-bash joins `A=1 B=2<newline>cmd` into one command with prefix assignments;
    bash ends the first command at the newline: the assignments are a statement of their own
    (True), not the environment of `cmd` only."""
    assigns, words, alone = [], [], False
    for child in node.children:
        if child.type == "variable_assignment" and not words:
            assigns.append(child)
        elif child.type == "command_name":
            alone = bool(assigns) and "\n" in script.text(
                node, assigns[-1].end_byte, child.start_byte).replace("\\\n", "")
            words.append(child.named_children[0] if child.named_child_count else child)
        elif words and (child.is_named and child.type not in _REDIRECTS or child.type == "$"):
            words.append(child)
    return assigns, words, alone


_REDIRECTS = {"file_redirect", "heredoc_redirect", "herestring_redirect", "comment"}


def words_of(script: Script, nodes: list) -> list[list]:
    """Argument nodes grouped into bash words (the evaluator expands the escapes between the
    nodes of a group). tree-sitter reads `$"..."` (a translated string) as a lone `$` then a
    string, and splits a word at a line continuation or after a quote at an escaped blank
    (`ab\\<newline>c`, `"a"\\ b`); bash reads one word."""
    groups: list[list] = []
    previous = None
    for node in nodes:
        if previous is not None and previous.type == "$" and not previous.is_named \
                and node.type == "string" and previous.end_byte == node.start_byte:
            groups[-1] = [node]
        elif previous is not None and _ESCAPES.fullmatch(
                script.source[previous.end_byte:node.start_byte]):
            groups[-1].append(node)
        else:
            groups.append([node])
        previous = node
    return groups


_ESCAPES = re.compile(rb"(?:\\.)+", re.DOTALL)


def unwrap(node):
    """The statement a redirection applies to (redirections change no variable)."""
    while node.type == "redirected_statement" and node.child_by_field_name("body") is not None:
        node = node.child_by_field_name("body")
    return node


def inner(script: Script, node) -> str:
    """The text between a node's first and last child: `(( x ))`, `$(( x ))`, `$(x)`."""
    return script.text(None, node.children[0].end_byte, node.children[-1].start_byte)


def if_branches(node) -> tuple[list, list | None]:
    """`if`/`elif` as (condition, body) pairs, and the `else` body (None without one)."""
    branches, orelse = [], None
    for clause in [node] + [c for c in node.children if c.type in ("elif_clause", "else_clause")]:
        condition, body, target = [], [], None
        for child in clause.children:
            if child.type in ("if", "elif"):
                target = condition
            elif child.type in ("then", "else"):
                target = body
            elif child.type in ("elif_clause", "else_clause", "fi"):
                target = None
            elif target is not None:
                target.append(child)
        if clause.type == "else_clause":
            orelse = statements(body)
        else:
            branches.append((statements(condition), statements(body)))
    return branches, orelse


def loop_parts(node) -> tuple[bool, list, list]:
    """A `while`/`until` loop: (until, condition, body)."""
    body = node.child_by_field_name("body")
    return (node.children[0].type == "until",
            statements(node.children_by_field_name("condition")),
            body_of(body) if body is not None else [])


def for_parts(script: Script, node) -> tuple[str, list | None, list]:
    """(variable, words, body); words None for `for NAME` without `in`, variable '' for a
    C-style loop."""
    body = node.child_by_field_name("body")
    body = body_of(body) if body is not None else []
    if node.type == "c_style_for_statement":
        return "", [], body
    variable = node.child_by_field_name("variable")
    if not any(child.type == "in" for child in node.children):
        return script.text(variable), None, body
    return script.text(variable), words_of(script, node.children_by_field_name("value")), body


def case_parts(node) -> tuple:
    """The subject of a `case`, and its items as (patterns, body)."""
    items = []
    for item in (c for c in node.children if c.type == "case_item"):
        patterns, body = [], []
        for i, child in enumerate(item.children):
            if item.field_name_for_child(i) == "value":
                patterns.append(child)
            elif child.is_named and child.type not in _NOT_STATEMENTS:
                body.append(child)
        items.append((patterns, body))
    return node.child_by_field_name("value"), items


_TEST_GROUPS = {"binary_expression", "unary_expression", "parenthesized_expression",
                "ternary_expression", "postfix_expression"}


def test_operands(node) -> list[list]:
    """The words of a `[ ]` / `[[ ]]` in source order, each a list of nodes (the test is
    decided on their expanded values, as bash decides `[` after expansion). Nodes that touch
    are one word: tree-sitter reads `-2**2` as the operator `-` then `2**2`."""
    words: list[list] = []
    stack = list(reversed(node.children[1:-1]))
    while stack:
        child = stack.pop()
        if child.type in _TEST_GROUPS:
            stack.extend(reversed(child.children))
        elif child.type == "comment":
            continue
        elif words and words[-1][-1].end_byte == child.start_byte:
            words[-1].append(child)
        else:
            words.append([child])
    return words


@dataclass(slots=True)
class Assignment:
    """`NAME=value`, `NAME+=value`, `NAME[i]=value`, `NAME=( words )`."""

    name: str
    line: int
    append: bool
    index: str | None  # the raw text inside [...]
    value: object | None  # the value's node (None: `NAME=`)
    array: list | None  # the elements' words of `NAME=( ... )`


def assignment_parts(script: Script, node) -> Assignment:
    target = node.child_by_field_name("name")
    value = node.child_by_field_name("value")
    index = None
    if target.type == "subscript":
        index_node = target.child_by_field_name("index")
        index = script.text(index_node) if index_node is not None else ""
        target = target.child_by_field_name("name")
    append = any(child.type == "+=" for child in node.children)
    array = None
    if value is not None and value.type == "array":
        array = words_of(script, statements(value.children))
        value = None
    return Assignment(script.text(target), script.line(node), append, index, value, array)
