"""Follow a bash script's variables symbolically, to find the argv it passes to Megatron.

This is a reader, not a shell: it walks the syntax tree once, tracks variables (strings and
arrays) from the assignments it sees, expands words as bash would (quotes, `${VAR:-default}`,
arrays, word splitting, `$(( ))` on known values), decides `if`/`case`/`&&` on known values,
and records the commands that launch a Python entry script. It never runs a command, a
substitution or `eval`; a value it cannot know (unset variable, `$(...)`, a file test) becomes
an `External` hole. When a condition cannot be decided, both outcomes are followed and
variables that differ become holes that name what the condition reads.

The largest file of load/ on purpose: one recursive walk over bash's node types, whose cases
share the variable state and the work budget; split, each part would reach back into the
others (parsing, the budget and the argv reading it feeds are their own modules).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from itertools import repeat

from qaudit.load.config import SourceNote
from qaudit.errors import InputError
from qaudit.load.sources import shell_tree as tree
from qaudit.load.sources.arith import ArithRefused, ArithUnknown, evaluate
from qaudit.load.sources.argv import HOLE
from qaudit.load.sources.shell_conditions import TestExpression
from qaudit.load.sources.shell_tree import Script, body_of, statements
from qaudit.load.sources.shell_words import Param, literal, param
from qaudit.load.sources.shell_values import (UNSET, ArrayValue, Ch, Chars, Elem, as_array, as_scalar,
                                         chars_of, hole, holes, join, known, merge_values,
                                         text_of, to_word)
from qaudit.load.sources.tokens import External, Word

MAX_STEPS = 200_000  # commands followed; a bound on loops and function recursion
MAX_VALUE = 1_000_000  # characters in one variable
MAX_ELEMENTS = 10_000  # elements in one array
MAX_FOR_ITEMS = 1_000
MAX_CALL_DEPTH = 16
# The limits above hold one at a time; these two hold for the whole script (docs/security.md:
# measured time and memory at these sizes). HELD bounds memory: the characters in
# all variables at once (array elements included). WORK bounds time: every character copied
# while expanding, assigning, comparing and merging the outcomes of undecided conditions (and
# every variable and array element copied with them), summed over the whole run.
MAX_HELD = 4_000_000
MAX_WORK = 20_000_000
ARITH_LOOKUP_COST = 200  # work units per variable read in $(( )), measured against copying
ARITH_CHAR_COST = 100  # per character of a $(( )) expression: tokenizing and parsing it
FIELD_COST = 32  # per word an expansion yields: a word costs far more memory than a character
LAUNCHERS = {"torchrun", "python", "python3", "uv", "srun", "mpirun", "deepspeed", "accelerate",
             "nsys", "numactl", "ft_launcher", "exec", "env", "time", "nohup"}
_BLANKS = " \t\n"
# Nodes inside a word that are expanded or quoted; any other node is literal text.
_EXPANDED = {"simple_expansion", "expansion", "string", "raw_string", "ansi_c_string",
             "concatenation", "command_substitution", "process_substitution",
             "arithmetic_expansion"}


class ExitPath(Exception):
    """`exit` (or `return` at top level): this path of the script ends here."""


class BreakLoop(Exception):
    pass


@dataclass
class Launch:
    line: int
    argv: list[Word]  # the words after the entry script
    script: Word | None = None  # the entry script itself (which model it builds: sources.entry)


@dataclass
class Outcome:
    env: dict
    launches: list[Launch]
    notes: list[SourceNote]
    order: list[str]  # variable names in the order they were first assigned


def size_of(value) -> int:
    """Characters a variable's value holds (an array: its elements' and one per element)."""
    if isinstance(value, ArrayValue):
        return len(value.elems) + sum(len(elem.chars) for elem in value.elems)
    if value is None or value is UNSET:
        return 0
    return len(value)


class _Fields:
    """Builds the fields (words) of one expanded word, with bash's splitting rules."""

    def __init__(self, split: bool, expanded) -> None:
        self.split = split
        self.expanded = expanded  # Interpreter.expanded: the budgets
        self.fields: list[tuple[list[Ch], tuple[External, ...]]] = []
        self.current: list[Ch] = []
        self.condition: tuple[External, ...] = ()
        self.started = False

    def add(self, chars: Chars, splittable: bool, condition: tuple[External, ...] = ()) -> None:
        self.expanded(len(chars))
        if not (splittable and self.split) and not condition:
            if chars:  # nothing to split or mark: copy at C speed
                self.current.extend(chars)
                self.started = True
            return
        for ch in chars:
            if splittable and self.split and ch[2] is None and ch[0] in _BLANKS:
                self.boundary()
            else:
                self.current.append(ch)
                self.started = True
                if condition and not set(condition) <= set(self.condition):
                    self.condition = tuple(dict.fromkeys(self.condition + condition))

    def mark(self) -> None:
        """A quoted part: the field exists even if empty (`""`)."""
        self.started = True

    def boundary(self) -> None:
        if self.started:
            self.expanded(FIELD_COST)
            self.fields.append((self.current, self.condition))
        self.current, self.condition, self.started = [], (), False

    def result(self) -> list[tuple[Chars, tuple[External, ...]]]:
        self.boundary()
        return [(tuple(chars), condition) for chars, condition in self.fields]


class Interpreter:
    def __init__(self, file: str, variables: dict[str, str]) -> None:
        self.file = file
        self.script: Script | None = None
        self.pinned = {name: known(value, 0) for name, value in variables.items()}
        self.env: dict = {}
        self.order: dict[str, None] = {}  # an ordered set: names by first assignment
        self.functions: dict[str, list] = {}
        self.positional: list[Chars] | None = None  # None: the script's own (unknown) args
        self.launches: list[Launch] = []
        self.notes: list[SourceNote] = []
        self.noted: set[tuple[str, int, str]] = set()
        self.steps = 0
        self.line = 0  # of the command being followed, for the budget errors
        self.held = 0  # characters in variables: self.env's and those of finished fork paths
        self.pending = 0  # characters expanded by the current command, not stored yet
        self.work = 0  # characters copied so far
        self.dirty: dict[str, None] = {}  # variables assigned since the enclosing fork began
        # (start, end, quoting) -> the characters of a literal, built once
        self.literals: dict[tuple[int, int, str], Chars] = {}
        self.char_tuples: dict[tuple[str, int], Ch] = {}
        self.call_depth = 0
        self.in_condition = False
        self.saw_arguments = False  # "$@" of the script itself in the current command

    def note(self, message: str, line: int, key: str) -> None:
        """A note, once (a loop would repeat it at every pass)."""
        found = SourceNote(message, line, key)
        if (message, line, key) not in self.noted:
            self.noted.add((message, line, key))
            self.hold(len(message) + FIELD_COST)
            self.notes.append(found)

    # --- entry -------------------------------------------------------------------------------
    def run(self, script: Script) -> Outcome:
        self.script = script
        try:
            self.block(body_of(script.root))
        except ExitPath:
            pass
        except RecursionError:
            raise InputError("cannot read the script: nested too deeply", file=self.file) from None
        return Outcome(self.env, self.launches, self.notes, list(self.order))

    def step(self, line: int) -> None:
        self.line = line or self.line
        self.pending = 0
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise InputError(f"cannot read the script: more than {MAX_STEPS} commands to follow "
                             f"(a loop that does not end?)", file=self.file, line=line)

    def known_char(self, char: str, line: int) -> Ch:
        """One shared tuple per (character, line): a long literal costs a pointer per
        character, not a tuple."""
        key = (char, line)
        found = self.char_tuples.get(key)
        if found is None:
            found = self.char_tuples[key] = (char, line, None)
        return found

    def spend(self, characters: int) -> None:
        """Count copied characters against MAX_WORK."""
        self.work += characters
        if self.work > MAX_WORK:
            raise InputError(f"cannot read the script: following it copies more than "
                             f"{MAX_WORK:,} characters (values copied over and over, e.g. "
                             f"doubled or copied in a loop); qaudit stops here",
                             file=self.file, line=self.line)

    def hold(self, delta: int) -> None:
        """Count characters kept in variables against MAX_HELD."""
        self.held += delta
        if self.held + self.pending > MAX_HELD:
            raise InputError(f"cannot read the script: its variables would hold more than "
                             f"{MAX_HELD:,} characters at once (values doubled or copied "
                             f"into many variables); qaudit stops here",
                             file=self.file, line=self.line)

    def expanded(self, characters: int) -> None:
        """Characters a command's expansion produced: copied, and held until it ends."""
        self.spend(characters)
        self.pending += characters
        self.hold(0)

    def copy_env(self) -> dict:
        return self.copy_env_of(self.env)

    def copy_env_of(self, env: dict) -> dict:
        self.spend(len(env))
        return dict(env)

    # --- statements --------------------------------------------------------------------------
    def block(self, items: list) -> None:
        for item in items:
            self.and_or(item)

    def and_or(self, node) -> None:
        (_, first), *rest = tree.and_or(node)
        status = self.pipeline(first)
        for op, pipeline in rest:
            if status is True and op == "||" or status is False and op == "&&":
                continue
            if status is None:
                externals = self.last_externals
                self.fork([lambda p=pipeline: self.pipeline(p)], externals,
                          self.script.line(pipeline))
                status = None
                continue
            status = self.pipeline(pipeline)

    last_externals: tuple[External, ...] = ()

    def pipeline(self, node) -> bool | None:
        """Run a pipeline; its status: True/False when known, None when it depends on
        `self.last_externals`. Ordinary commands are assumed to succeed."""
        node = tree.unwrap(node)
        negated = node.type == "negated_command"
        if negated:
            node = tree.unwrap(node.named_children[-1])
        commands = statements(node.children) if node.type == "pipeline" else [node]
        if commands[0].type == "negated_command":  # `! a | b` negates the whole pipeline
            negated, commands[0] = True, commands[0].named_children[-1]
        if len(commands) > 1:
            saved, held = self.copy_env(), self.held
            for command in commands:
                self.command(command)  # each part runs in a subshell: variables do not leak
            self.env, self.held = saved, held
            status: bool | None = True
        else:
            status = self.command(commands[0])
        if negated and status is not None:
            status = not status
        return status

    def command(self, node) -> bool | None:
        node = tree.unwrap(node)
        kind = node.type
        if kind in ("list", "pipeline", "negated_command"):
            if kind == "list":
                self.and_or(node)
                return True
            return self.pipeline(node)
        self.step(self.script.line(node))
        if kind == "command":
            return self.simple(node)
        if kind in ("variable_assignment", "variable_assignments"):
            for assign in ([node] if kind == "variable_assignment" else node.named_children):
                self.assignment(assign)
        elif kind == "declaration_command":
            self.declaration(node)
        elif kind == "unset_command":
            self.unset([[n] for n in node.named_children])
        elif kind == "test_command":
            return self.status(self.test(node))
        elif kind == "compound_statement" and node.children[0].type == "((":
            return self.status(self.arith_status(tree.inner(self.script, node),
                                                 self.script.line(node)))
        elif kind == "if_statement":
            self.branches(*tree.if_branches(node), self.script.line(node))
        elif kind == "while_statement":
            self.loop(node)
        elif kind in ("for_statement", "c_style_for_statement"):
            self.for_(node)
        elif kind == "case_statement":
            self.case(node)
        elif kind == "subshell":
            saved, held = self.copy_env(), self.held
            try:
                self.block(body_of(node))
            except ExitPath:
                pass
            self.env, self.held = saved, held
        elif kind == "compound_statement":
            self.block(body_of(node))
        elif kind == "function_definition":
            name = node.child_by_field_name("name")
            # One compound command (the body).
            self.functions[self.script.text(name)] = [node.child_by_field_name("body")]
        return True

    def status(self, result: tuple[bool | None, tuple[External, ...]]) -> bool | None:
        value, externals = result
        self.last_externals = externals
        return value

    # --- control flow ------------------------------------------------------------------------
    def condition(self, items: list) -> tuple[bool | None, tuple[External, ...]]:
        """The status of a condition list (the last and-or decides)."""
        status: bool | None = True
        externals: tuple[External, ...] = ()
        for item in items:
            status, externals = self.condition_and_or(item)
        return status, externals

    def condition_and_or(self, node) -> tuple[bool | None, tuple[External, ...]]:
        (_, first), *rest = tree.and_or(node)
        status, externals = self.condition_pipeline(first)
        for op, pipeline in rest:
            if status is True and op == "||" or status is False and op == "&&":
                continue
            right, more = self.condition_pipeline(pipeline)
            if status is None:
                if op == "&&" and right is False or op == "||" and right is True:
                    status, externals = right, more
                else:
                    externals = externals + more
            else:
                status, externals = right, more
        return status, externals

    def condition_pipeline(self, node) -> tuple[bool | None, tuple[External, ...]]:
        self.last_externals = ()
        outer, self.in_condition = self.in_condition, True
        try:
            status = self.pipeline(node)
        finally:
            self.in_condition = outer
        return status, self.last_externals if status is None else ()

    def branches(self, branches: list, orelse: list | None, line: int) -> None:
        if not branches:
            if orelse is not None:
                self.block(orelse)
            return
        (condition, body), rest = branches[0], branches[1:]
        status, externals = self.condition(condition)
        if status is True:
            self.block(body)
        elif status is False:
            self.branches(rest, orelse, line)
        else:
            self.fork([lambda: self.block(body), lambda: self.branches(rest, orelse, line)],
                      externals, line, complete=True)

    def loop(self, node) -> None:
        until, condition, body = tree.loop_parts(node)
        line = self.script.line(node)
        status, externals = self.condition(condition)
        if until and status is not None:
            status = not status
        if status is False:
            return
        # Zero or more iterations: follow the body once and merge with not entering it.
        self.fork([lambda: self.loop_body(body)], externals or (
            External("a loop", line, "runs an unknown number of times"),), line)

    def loop_body(self, body: list) -> None:
        try:
            self.block(body)
        except BreakLoop:
            pass

    def for_(self, node) -> None:
        """`for NAME in WORDS`; `for NAME` (the script's arguments) and C-style loops are
        followed as a loop over unknown items."""
        var, words, body = tree.for_parts(self.script, node)
        line = self.script.line(node)
        items: list[Chars] | None = None
        if words is not None and var:
            items = []
            for word in words:
                for chars, _ in self.expand(word):
                    items.append(chars)
            self.spend(len(items))
            if len(items) > MAX_FOR_ITEMS or any(holes(c) for c in items):
                items = None
        if items is None:
            if var:
                self.assign_scalar(var, hole(External(var, line,
                                                      "set by a loop over unknown items")))
            self.fork([lambda: self.loop_body(body)],
                      (External("a loop", line, "runs over unknown items"),), line)
            return
        try:
            for chars in items:
                self.assign_scalar(var, chars)
                self.block(body)
        except BreakLoop:
            pass

    def case(self, node) -> None:
        word, items = tree.case_parts(node)
        line = self.script.line(node)
        subject = self.expand_joined([word])
        if holes(subject):
            self.fork([lambda b=body: self.block(b) for _, body in items], holes(subject), line)
            return
        for i, (patterns, body) in enumerate(items):
            for pattern in patterns:
                chars = self.expand_joined([pattern])
                if holes(chars):
                    # From here on any item may match: follow each, or none.
                    self.fork([lambda b=b: self.block(b) for _, b in items[i:]],
                              holes(chars), line)
                    return
                # Matching costs up to the subject's length per pattern character;
                # compiling, the pattern's length (fnmatch caches compiled patterns).
                self.spend(len(subject) * (1 + len(chars)) + 10 * len(chars))
                if fnmatch.fnmatchcase(text_of(subject), text_of(chars)):
                    self.block(body)
                    return

    def fork(self, paths: list, externals: tuple[External, ...], line: int,
             complete: bool = False) -> None:
        """Follow each path from the current state and merge the results. Unless `complete`,
        not taking any path is one more outcome. A path that exits does not count.

        Only the variables a path assigned (`self.dirty`) are compared, so a fork costs the
        copy of the variables plus what the paths changed, not a walk over every value; what a
        finished path keeps counts as held while the next path runs."""
        start, start_positional, start_held = self.copy_env(), self.positional, self.held
        outer_dirty = self.dirty
        results: list[tuple[dict, dict]] = []
        kept = 0
        for path in paths:
            self.env, self.positional = self.copy_env_of(start), start_positional
            self.held, self.dirty = start_held + kept, {}
            try:
                path()
            except ExitPath:
                continue
            except (BreakLoop, _Return):
                pass  # the loop or function ends on this path; keep its variables
            results.append((self.env, self.dirty))
            kept += sum(size_of(self.env.get(name)) for name in self.dirty)
        if not complete:
            results.append((start, {}))
        self.positional = start_positional
        if not results:
            self.dirty = outer_dirty
            raise ExitPath()
        names: dict[str, None] = {}
        for _, dirty in results:
            names.update(dirty)
        self.env = self.merge(start, [env for env, _ in results], names, externals, line)
        self.held = start_held
        self.hold(sum(size_of(self.env.get(name)) - size_of(start.get(name)) for name in names))
        self.dirty = outer_dirty
        self.dirty.update(names)

    def merge(self, start: dict, envs: list[dict], names: dict[str, None],
              externals: tuple[External, ...], line: int) -> dict:
        """The variables after a fork: `start` with each of `names` (those some path assigned)
        merged over the outcomes `envs`."""
        if len(envs) == 1:
            return envs[0]
        why = externals or (External("a condition", line, "cannot be decided"),)
        merged = self.copy_env_of(start)
        deciders = tuple(dict.fromkeys(n for e in why for n in (e.deciders or (
            (e.name,) if e.settable() else ()))))
        reads = ", ".join(dict.fromkeys(e.display() for e in why))
        for name in names:
            values = [env.get(name) for env in envs]
            if all(value is values[0] for value in values):
                merged[name] = values[0]  # the same object on every path: nothing to compare
                continue
            self.spend(sum(size_of(value) for value in values))
            # A variable that differs between outcomes is named itself (`--set NAME=...` pins
            # it), with what decided it.
            differs = External(name, line, f"set depending on line {line}, which reads {reads}",
                               deciders)
            merged[name] = merge_values(values, why, differs)
            self.order.setdefault(name)
        return merged

    # --- simple commands ---------------------------------------------------------------------
    def simple(self, node) -> bool | None:
        assigns, word_nodes, alone = tree.split_command(self.script, node)
        line = self.script.line(node)
        if alone:  # `A=1 B=2` on a line of its own, then a command on the next
            for assign in assigns:
                self.assignment(assign)
            line = self.script.line(word_nodes[0])
            self.step(line)
        # Otherwise the assignments are the command's environment only: not followed.
        self.saw_arguments = False
        groups = tree.words_of(self.script, word_nodes)
        words = self.expand_words(groups)
        name = words[0].text if words else ""
        if name == "test":
            return self.status(self.bracket_test(groups[1:], line))
        if name in ("true", ":"):
            return True
        if name == "false":
            return False
        if name == "exit":
            raise ExitPath()
        if name == "return":
            raise ExitPath() if self.call_depth == 0 else _Return()
        if name in ("break", "continue"):
            raise BreakLoop()
        if name == "shift" and self.positional is not None:
            self.positional = self.positional[1:]
            return True
        if name in ("source", ".", "eval"):
            shown = " ".join(w.text.replace(HOLE, "?") for w in words[:2])
            self.note(f"`{shown}` is not followed (qaudit never runs or reads what it names); "
                      f"flags or variables it would set are not seen", line, name)
            return True
        if name == "read":
            for word in words[1:]:
                if word.text.isidentifier():
                    self.assign_scalar(word.text, hole(External(word.text, line,
                                                                "read from input")))
            return True
        if name in self.functions:
            return self.call(name, words[1:], line)
        if self.in_condition:
            # A command's exit status decides the condition; qaudit never runs it.
            shown = (name.replace(HOLE, "?") or "a command")[:30]
            self.last_externals = (External(shown, line,
                                            "a command's exit status; qaudit never runs it"),)
            return None
        if self.maybe_launch(words, line) and self.saw_arguments:
            self.note("the launch forwards the script's own arguments (\"$@\"); the audit "
                      "assumes none (give them with --set 1=... 2=...)", line, "$@")
        return True

    def declaration(self, node) -> None:
        """`export`, `declare`, `local`, `readonly`, `typeset`: their assignments hold (the
        other words are expanded for their side effects, e.g. `${X:=default}`)."""
        self.saw_arguments = False
        self.expand_words([[n] for n in node.named_children if n.type != "variable_assignment"])
        for child in node.named_children:
            if child.type == "variable_assignment":
                self.assignment(child)

    def unset(self, words: list[list]) -> None:
        for word in self.expand_words(words):
            if not word.text.startswith("-"):
                self.hold(-size_of(self.env.get(word.text)))
                self.env[word.text] = UNSET
                self.dirty[word.text] = None

    def call(self, name: str, args: list[Word], line: int) -> bool:
        if self.call_depth >= MAX_CALL_DEPTH:
            raise InputError(f"cannot read the script: function {name} calls itself too deeply",
                             file=self.file, line=line)
        saved = self.positional
        size = sum(len(word.text) + FIELD_COST for word in args)
        self.spend(size)
        self.positional = [self.word_chars(word, line) for word in args]
        self.call_depth += 1
        self.hold(size)  # the arguments live until the call returns
        try:
            for command in self.functions[name]:
                self.command(command)
        except _Return:
            pass
        finally:
            self.call_depth -= 1
            self.positional = saved
            self.held -= size
        return True

    def word_chars(self, word: Word, line: int) -> Chars:
        """A word's characters again (a function's argument), sharing the known ones."""
        if word.unknown:
            return chars_of(word, line)
        return tuple(map(self.known_char, word.text, repeat(word.line or line)))

    def maybe_launch(self, words: list[Word], line: int) -> bool:
        """A command that runs a Python entry script (`torchrun ... pretrain_gpt.py --flags`)."""
        launcher = False  # a launcher among the words before (one pass, not one per word)
        for i, word in enumerate(words):
            base = word.text.rsplit("/", 1)[-1]
            if base.endswith(".py") and (i == 0 or launcher):
                argv = words[i + 1:]
                # What a launch keeps stays in memory to the end: it counts as held.
                self.hold(sum(len(w.text) + FIELD_COST for w in argv))
                self.launches.append(Launch(line, argv, word))
                return True
            launcher = launcher or base in LAUNCHERS or word.text.startswith("python")
        return False

    # --- assignments -------------------------------------------------------------------------
    def assignment(self, node) -> None:
        assign = tree.assignment_parts(self.script, node)
        if assign.name in self.pinned:
            return  # --set wins over the script's own assignments
        if assign.array is not None:
            elems = []
            for word in assign.array:
                elems.extend(Elem(chars, condition) for chars, condition in self.expand(word))
            old = self.env.get(assign.name)
            if assign.append:
                self.spend(len(as_array(old)))
                elems = list(as_array(old)) + elems
            if len(elems) > MAX_ELEMENTS:
                elems = [Elem(hole(External(assign.name, assign.line,
                                            f"has more than {MAX_ELEMENTS} elements")))]
            self.set(assign.name, ArrayValue(tuple(elems)))
            return
        chars = self.expand_joined([assign.value]) if assign.value is not None else ()
        chars = self.name_unsettable(assign.name, chars, assign.line)
        old = self.env.get(assign.name)
        if assign.index is not None:
            self.assign_element(assign, chars, old)
        elif assign.append and isinstance(old, ArrayValue):
            first = old.elems[0].chars if old.elems else ()
            self.spend(len(first) + len(chars) + len(old.elems))
            self.set(assign.name, ArrayValue((Elem(first + chars),) + old.elems[1:]))
        elif assign.append:
            self.spend(len(as_scalar(old)) + len(chars))
            self.assign_scalar(assign.name, as_scalar(old) + chars)
        else:
            self.assign_scalar(assign.name, chars)

    def name_unsettable(self, name: str, chars: Chars, line: int) -> Chars:
        """`X=$(cmd)`: the hole names X, so that `--set X=...` can supply it."""
        self.spend(len(chars))
        if not holes(chars):
            return chars
        result = []
        for ch in chars:
            if ch[2] is not None and not ch[2].settable():
                ch = (ch[0], ch[1], External(name, line, f"assigned from {ch[2].display()}, "
                                                         f"{ch[2].why}"))
            result.append(ch)
        return tuple(result)

    def assign_element(self, assign: tree.Assignment, chars: Chars, old) -> None:
        index_chars = self.expand_text(assign.index or "", assign.line)
        try:
            index = int(text_of(index_chars)) if not holes(index_chars) else None
        except ValueError:
            index = None
        elems = list(as_array(old))
        self.spend(len(elems) + 1)
        if index is None or index < 0 or index > MAX_FOR_ITEMS:
            self.set(assign.name, ArrayValue((Elem(hole(External(
                assign.name, assign.line, "has an element at an unknown index"))),)))
            return
        while len(elems) <= index:
            elems.append(Elem(()))
        elems[index] = Elem(chars)
        self.set(assign.name, ArrayValue(tuple(elems)))

    def assign_scalar(self, name: str, chars: Chars) -> None:
        if name in self.pinned:
            return
        if len(chars) > MAX_VALUE:
            chars = hole(External(name, chars[0][1], f"is longer than {MAX_VALUE} characters"))
        self.set(name, chars)

    def set(self, name: str, value) -> None:
        self.hold(size_of(value) - size_of(self.env.get(name)))
        self.env[name] = value
        self.dirty[name] = None
        self.order.setdefault(name)

    # --- expansion ---------------------------------------------------------------------------
    # A word is the list of nodes bash reads as one word (`shell_tree.words_of`), most often one.
    def expand_words(self, words: list[list]) -> list[Word]:
        result = []
        for word in words:
            line = self.script.line(word[0])
            for chars, condition in self.expand(word):
                self.spend(len(chars))
                result.append(to_word(chars, line, condition))
        return result

    def expand(self, word: list, split: bool = True) -> list[tuple[Chars, tuple]]:
        fields = _Fields(split, self.expanded)
        for i, node in enumerate(word):
            if i:  # the escapes between the nodes of one word (`tree.words_of`)
                fields.add(self.literal(word[i - 1].end_byte, node.start_byte, "none"), False)
            self.expand_node(node, fields, False)
        return fields.result()

    def expand_joined(self, word: list) -> Chars:
        """Expansion without word splitting (assignments, `case`, `[[ ]]` operands)."""
        out: list[Ch] = []
        for i, (chars, _) in enumerate(self.expand(word, split=False)):
            if i:
                out.append((" ", chars[0][1] if chars else self.script.line(word[0]), None))
            out.extend(chars)
        self.spend(len(out))
        return tuple(out)

    def literal(self, start: int, end: int, quoting: str) -> Chars:
        key = (start, end, quoting)
        chars = self.literals.get(key)
        if chars is None:  # built once: a literal in a loop shares its characters
            chars = tuple(self.known_char(c, line) for c, line, _ in
                          literal(self.script, start, end, quoting))
            self.literals[key] = chars
        return chars

    def expand_node(self, node, fields: _Fields, quoted: bool) -> None:
        """One node of a word; `quoted`: inside double quotes."""
        kind = node.type
        if kind in ("simple_expansion", "expansion"):
            part, rest = param(self.script, node, quoted)
            self.expand_param(part, fields)
            if rest:
                fields.add(tuple(self.known_char(c, line) for c, line, _ in rest), False)
        elif kind == "string":
            self.expand_span(node, node.start_byte + 1, node.end_byte - 1, fields, True)
            if not any(child.type in _EXPANDED for child in node.children):
                fields.mark()  # `""` is a word; `"$@"` with no arguments is none (its own)
        elif kind == "concatenation":
            self.expand_span(node, node.start_byte, node.end_byte, fields, quoted)
        elif kind == "raw_string":  # inside double quotes the quotes are plain characters
            fields.add(self.literal(node.start_byte + (not quoted), node.end_byte - (not quoted),
                                    "single"), False)
            fields.mark()
        elif kind == "ansi_c_string":
            fields.add(self.literal(node.start_byte + 2, node.end_byte - 1, "ansi"), False)
            fields.mark()
        elif kind == "arithmetic_expansion" or kind == "command_substitution" and \
                self.script.source.startswith(b"$((", node.start_byte):
            # tree-sitter-bash reads `${X:-$((1 + 2))}` as `$( (1 + 2) )`; bash as arithmetic.
            raw = tree.inner(self.script, node) if kind == "arithmetic_expansion" else \
                self.script.text(None, node.start_byte + 3, node.end_byte - 2)
            fields.add(self.arith_value(raw, self.script.line(node)), not quoted)
            if quoted:
                fields.mark()
        elif kind in ("command_substitution", "process_substitution"):
            shown = tree.inner(self.script, node).strip().replace("\n", " ")
            shown = shown if len(shown) <= 30 else shown[:27] + "..."
            fields.add(hole(External(f"$({shown})", self.script.line(node),
                                     "a command's output; qaudit never runs it")), False)
            fields.mark()
        else:  # words, numbers, patterns, operators: their text
            fields.add(self.literal(node.start_byte, node.end_byte,
                                    "double" if quoted else "none"), False)

    def expand_span(self, node, start: int, end: int, fields: _Fields, quoted: bool) -> None:
        """The bytes [start, end) of `node`: its expansions and quotes, and the text between
        them as literal characters."""
        quoting = "double" if quoted else "none"
        for child in node.children:
            if child.type not in _EXPANDED or child.start_byte < start or child.end_byte > end:
                continue
            if child.start_byte > start:
                fields.add(self.literal(start, child.start_byte, quoting), False)
            self.expand_node(child, fields, quoted)
            start = child.end_byte
        if end > start:
            fields.add(self.literal(start, end, quoting), False)

    def expand_param(self, part: Param, fields: _Fields) -> None:
        value = self.param_value(part)
        if isinstance(value, ArrayValue):
            for i, elem in enumerate(value.elems):
                if i:
                    fields.boundary() if fields.split or part.quoted else fields.add(
                        ((" ", elem.chars[0][1] if elem.chars else part.line, None),), False)
                fields.add(elem.chars, not part.quoted, elem.condition)
                if part.quoted:
                    fields.mark()
            return
        fields.add(value, not part.quoted)
        if part.quoted:
            fields.mark()

    def param_value(self, part: Param):
        """A Param's value: Chars, or an ArrayValue for `${NAME[@]}` / `$@` forms."""
        name, line = part.name, part.line
        if part.op == "other":
            return hole(External(name if name not in "!?" else "${...}", line,
                                 "uses a ${...} form qaudit does not evaluate"))
        if name in ("@", "*"):
            self.saw_arguments = self.saw_arguments or self.positional is None
            elems = tuple(Elem(c) for c in self.arguments())
            if name == "@" or not part.quoted:
                return ArrayValue(elems)
            self.spend(sum(len(e.chars) + 1 for e in elems))
            return join(elems, line)
        if name == "#" and part.op is None:
            return known(str(len(self.arguments())), line)
        if name in ("?", "$", "!", "-"):
            return hole(External("$" + name, line, "known only at run time"))
        if name == "0":
            return hole(External("$0", line, "the script's name"))
        state = self.lookup(name, part.index, line)
        if part.op == "#len":
            if isinstance(state, ArrayValue) and part.index in ("@", "*"):
                return known(str(len(state.elems)), line)
            chars = as_scalar(state)
            return hole(External(name, line, "not set in the script")) if state is None \
                else (known(str(len(chars)), line) if not holes(chars) else hole(holes(chars)[0]))
        if part.op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            return self.operator(part, state)
        if state is None:
            return hole(self.unset_external(name, line))
        if state is UNSET:
            return ()
        if isinstance(state, ArrayValue):
            if part.index in ("@", "*"):
                if part.index == "@" or not part.quoted:
                    return state
                self.spend(size_of(state))
                return join(state.elems, line)
            return state.elems[0].chars if state.elems else ()
        return state

    def lookup(self, name: str, index: str | None, line: int):
        """The variable's state: None (never set: from outside), UNSET, Chars or ArrayValue."""
        if name.isdigit() and self.positional is not None:  # inside a function
            position = int(name)
            return self.positional[position - 1] if 0 < position <= len(self.positional) \
                else UNSET
        if name in self.pinned:
            state = self.pinned[name]
        elif name.isdigit():
            return None  # a script argument not given with --set
        else:
            state = self.env.get(name)
        if index is None or index in ("@", "*") or state is None or state is UNSET:
            return state
        index_chars = self.expand_text(index, line)
        try:
            position = int(text_of(index_chars))
        except ValueError:
            return hole(External(name, line, "is indexed by an unknown value"))
        elems = as_array(state)
        return elems[position].chars if 0 <= position < len(elems) else UNSET

    def arguments(self) -> list[Chars]:
        """Positional parameters. The script itself is taken as run without arguments, except
        those given with `--set 1=...`; a function gets the words it was called with."""
        if self.positional is not None:
            return self.positional
        numbers = [int(n) for n in self.pinned if n.isdigit() and int(n) > 0]
        return [self.pinned.get(str(i), ()) for i in range(1, max(numbers, default=0) + 1)]

    def unset_external(self, name: str, line: int) -> External:
        if name.isdigit():
            return External(name, line, "a script argument, not known")
        return External(name, line, "not set in the script")

    def operator(self, part: Param, state):
        op, name, line = part.op, part.name, part.line
        # Never set in the script (state None) counts as unset: with a default written in the
        # script, the default is what a plain run gets. A value with unknown parts counts as
        # set and non-empty.
        chars = as_scalar(state) if state is not None and state is not UNSET else None
        is_set = chars is not None
        empty = chars is not None and not chars
        use_default = not is_set or (op.startswith(":") and empty)
        if op.lstrip(":") == "+":
            return self.expand_arg(part) if not use_default else ()
        if op.lstrip(":") == "?":
            return chars if not use_default else hole(External(name, line, "required but unset"))
        if not use_default:
            return chars if not isinstance(state, ArrayValue) or part.index not in ("@", "*") \
                else state
        default = self.expand_arg(part)
        if op.lstrip(":") == "=" and not name.isdigit():
            self.assign_scalar(name, default)
        return default

    def expand_arg(self, part: Param) -> Chars:
        out: list[Ch] = []
        fields = _Fields(False, self.expanded)
        quoting, start = "double" if part.quoted else "none", None
        for sub in part.arg:  # with the text between them (`${X:-$A $B}`)
            if start is not None and sub.start_byte > start:
                fields.add(self.literal(start, sub.start_byte, quoting), False)
            self.expand_node(sub, fields, part.quoted)
            start = sub.end_byte
        for i, (chars, _) in enumerate(fields.result()):
            if i:
                out.append((" ", part.line, None))
            out.extend(chars)
        self.spend(len(out))
        return tuple(out)

    def expand_text(self, text: str, line: int) -> Chars:
        """`$VAR` / `${VAR}` references in a small raw text (array indexes, arithmetic)."""
        out: list[Ch] = []
        pos = 0
        for match in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*|\d+)\}|\$([A-Za-z_][A-Za-z0-9_]*|\d)",
                                 text):
            out.extend(known(text[pos:match.start()], line))
            name = match.group(1) or match.group(2)
            out.extend(self.param_value(Param(name, line, True)))
            pos = match.end()
        out.extend(known(text[pos:], line))
        self.spend(len(out))
        if "$(" in text or "`" in text:
            return hole(External(f"$({text.strip()[:30]})", line,
                                 "a command's output; qaudit never runs it"))
        return tuple(out)

    def arith_value(self, raw: str, line: int) -> Chars:
        result, externals = self.arith_status_value(raw, line)
        if result is None:
            return hole(externals[0])
        return known(str(result), line)

    def arith_status_value(self, raw: str, line: int) -> tuple[int | None, tuple[External, ...]]:
        chars = self.expand_text(raw, line)
        if holes(chars):
            return None, holes(chars)
        self.spend(ARITH_CHAR_COST * len(chars))
        missing: list[External] = []

        def variable(name: str) -> str | None:
            state = self.lookup(name, None, line)
            if state is None:
                missing.append(self.unset_external(name, line))
                return None
            value = as_scalar(state) if state is not UNSET else ()
            if holes(value):
                missing.extend(holes(value))
                return None
            # Each reference parses the value again (`a=b+b; b=c+c; ...` doubles per level):
            # a parse costs far more than copying a character.
            self.spend(ARITH_LOOKUP_COST + len(value))
            return text_of(value)

        try:
            return evaluate(text_of(chars), variable), ()
        except ArithRefused as exc:
            raise InputError(f"cannot read the script: $(( )) holds {exc}", file=self.file,
                             line=line) from None
        except ArithUnknown as exc:
            return None, tuple(missing) or (External(f"$(({raw.strip()[:30]}))", line,
                                                     f"cannot be evaluated: {exc}"),)

    def arith_status(self, raw: str, line: int) -> tuple[bool | None, tuple[External, ...]]:
        value, externals = self.arith_status_value(raw, line)
        return (None, externals) if value is None else (value != 0, ())

    # --- tests -------------------------------------------------------------------------------
    def test(self, node) -> tuple[bool | None, tuple[External, ...]]:
        """`[[ ... ]]` and `[ ... ]`: operands expanded, then decided (`shell_conditions`)."""
        line = self.script.line(node)
        operands = tree.test_operands(node)
        if node.children[0].type == "[":
            return self.bracket_test(operands, line)
        items = [self.script.text(w[0]) if len(w) == 1 and (
                     not w[0].is_named or w[0].type == "test_operator")
                 else (self.expand_joined(w), any(map(self.is_pattern, w))) for w in operands]
        self.spend_on_test([item[0] for item in items if not isinstance(item, str)])
        return TestExpression(items, line, double=True).run()

    def is_pattern(self, node) -> bool:
        """Whether an operand has unquoted glob characters (`[[ $a == b* ]]` matches)."""
        if node.type == "concatenation":
            return any(self.is_pattern(child) for child in node.children)
        if node.type in _EXPANDED:
            return False
        return any(not quoted and c in "*?[" for c, _, quoted in
                   literal(self.script, node.start_byte, node.end_byte, "none"))

    def spend_on_test(self, operands: list[Chars]) -> None:
        """Comparing operands reads them again; glob-matching one against another costs up
        to the product of their lengths (bounded by all of them times the second longest)."""
        lengths = sorted(len(chars) for chars in operands)
        second = lengths[-2] if len(lengths) > 1 else 0
        self.spend(10 * sum(lengths) + sum(lengths) * second)

    def bracket_test(self, words: list[list], line: int):
        """`[ ... ]` and `test ...`: bash parses their operands after expansion."""
        fields = [chars for word in words for chars, _ in self.expand(word)]
        self.spend_on_test(fields)
        items = [text_of(c) if text_of(c) in ("!", "(", ")", "-a", "-o") and not holes(c)
                 else (c, False) for c in fields]
        return TestExpression(items, line, double=False).run()


class _Return(Exception):
    pass
