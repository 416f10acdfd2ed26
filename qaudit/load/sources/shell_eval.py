"""Follow a bash script's variables symbolically, to find the argv it passes to Megatron.

This is a reader, not a shell: it walks the syntax tree once, tracks variables (strings and
arrays) from the assignments it sees, expands words as bash would (quotes, `${VAR:-default}`,
arrays, word splitting, `$(( ))` on known values), decides `if`/`case`/`&&` on known values,
and records the commands that launch a Python entry script. It never runs a command, a
substitution or `eval`; a value it cannot know (unset variable, `$(...)`, a file test) becomes
an `External` hole. When a condition cannot be decided, both outcomes are followed and
variables that differ become holes that name what the condition reads.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from itertools import repeat

from qaudit.load.config import SourceNote
from qaudit.errors import InputError
from qaudit.load.sources import shell_parser as ast
from qaudit.load.sources.arith import ArithRefused, ArithUnknown, evaluate
from qaudit.load.sources.argv import HOLE
from qaudit.load.sources.shell_conditions import TestExpression
from qaudit.load.sources.shell_lexer import Arith, CmdSub, Lit, Param, WordTok
from qaudit.load.sources.shell_values import (UNSET, ArrayValue, Ch, Chars, Elem, as_array, as_scalar,
                                         chars_of, hole, holes, join, known, merge_values,
                                         text_of, to_word)
from qaudit.load.sources.tokens import External, Word

MAX_STEPS = 200_000  # commands followed; a bound on loops and function recursion
MAX_VALUE = 1_000_000  # characters in one variable
MAX_ELEMENTS = 10_000  # elements in one array
MAX_FOR_ITEMS = 1_000
MAX_CALL_DEPTH = 16
# The limits above hold one at a time; these two hold for the whole script (README, Security
# and limits: measured time and memory at these sizes). HELD bounds memory: the characters in
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
        self.literals: dict[int, Chars] = {}  # id(Lit) -> its characters, built once
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
    def run(self, tree: list) -> Outcome:
        try:
            self.block(tree)
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

    def and_or(self, node: ast.AndOr) -> None:
        status = self.pipeline(node.first)
        for op, pipeline in node.rest:
            if status is True and op == "||" or status is False and op == "&&":
                continue
            if status is None:
                externals = self.last_externals
                self.fork([lambda p=pipeline: self.pipeline(p)], externals, pipeline.line)
                status = None
                continue
            status = self.pipeline(pipeline)

    last_externals: tuple[External, ...] = ()

    def pipeline(self, node: ast.Pipeline) -> bool | None:
        """Run a pipeline; its status: True/False when known, None when it depends on
        `self.last_externals`. Ordinary commands are assumed to succeed."""
        if len(node.commands) > 1:
            saved, held = self.copy_env(), self.held
            for command in node.commands:
                self.command(command)  # each part runs in a subshell: variables do not leak
            self.env, self.held = saved, held
            status: bool | None = True
        else:
            status = self.command(node.commands[0])
        if node.negated and status is not None:
            status = not status
        return status

    def command(self, node) -> bool | None:
        self.step(getattr(node, "line", 0))
        if isinstance(node, ast.Simple):
            return self.simple(node)
        if isinstance(node, ast.Test):
            return self.status(self.test(node))
        if isinstance(node, ast.ArithTest):
            return self.status(self.arith_status(node.raw, node.line))
        if isinstance(node, ast.If):
            self.if_(node)
        elif isinstance(node, ast.Loop):
            self.loop(node)
        elif isinstance(node, ast.For):
            self.for_(node)
        elif isinstance(node, ast.Case):
            self.case(node)
        elif isinstance(node, ast.Group):
            if node.subshell:
                saved, held = self.copy_env(), self.held
                try:
                    self.block(node.body)
                except ExitPath:
                    pass
                self.env, self.held = saved, held
            else:
                self.block(node.body)
        elif isinstance(node, ast.Function):
            self.functions[node.name] = node.body  # one compound command
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

    def condition_and_or(self, node: ast.AndOr) -> tuple[bool | None, tuple[External, ...]]:
        status, externals = self.condition_pipeline(node.first)
        for op, pipeline in node.rest:
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

    def condition_pipeline(self, node: ast.Pipeline) -> tuple[bool | None, tuple[External, ...]]:
        self.last_externals = ()
        outer, self.in_condition = self.in_condition, True
        try:
            status = self.pipeline(node)
        finally:
            self.in_condition = outer
        return status, self.last_externals if status is None else ()

    def if_(self, node: ast.If) -> None:
        self.branches(list(node.branches), node.orelse, node.line)

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

    def loop(self, node: ast.Loop) -> None:
        status, externals = self.condition(node.condition)
        if node.until and status is not None:
            status = not status
        if status is False:
            return
        # Zero or more iterations: follow the body once and merge with not entering it.
        self.fork([lambda: self.loop_body(node.body)], externals or (
            External("a loop", node.line, "runs an unknown number of times"),), node.line)

    def loop_body(self, body: list) -> None:
        try:
            self.block(body)
        except BreakLoop:
            pass

    def for_(self, node: ast.For) -> None:
        items: list[Chars] | None = None
        if node.words is not None and node.var:
            items = []
            for word in node.words:
                for chars, _ in self.expand(word):
                    items.append(chars)
            self.spend(len(items))
            if len(items) > MAX_FOR_ITEMS or any(holes(c) for c in items):
                items = None
        if items is None:
            if node.var:
                self.assign_scalar(node.var, hole(External(node.var, node.line,
                                                           "set by a loop over unknown items")))
            self.fork([lambda: self.loop_body(node.body)],
                      (External("a loop", node.line, "runs over unknown items"),), node.line)
            return
        try:
            for chars in items:
                self.assign_scalar(node.var, chars)
                self.block(node.body)
        except BreakLoop:
            pass

    def case(self, node: ast.Case) -> None:
        subject = self.expand_joined(node.word)
        if holes(subject):
            self.fork([lambda b=body: self.block(b) for _, body in node.items],
                      holes(subject), node.line)
            return
        for i, (patterns, body) in enumerate(node.items):
            for pattern in patterns:
                chars = self.expand_joined(pattern)
                if holes(chars):
                    # From here on any item may match: follow each, or none.
                    self.fork([lambda b=b: self.block(b) for _, b in node.items[i:]],
                              holes(chars), node.line)
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
    def simple(self, node: ast.Simple) -> bool | None:
        if not node.words:
            for assign in node.assigns:
                self.assignment(assign)
            return True
        self.saw_arguments = False
        words = self.expand_words(node.words)
        name = words[0].text if words else ""
        if name in ast.DECLARATIONS:
            for assign in node.assigns:
                self.assignment(assign)
            return True
        if name in ("[", "test"):
            return self.status(self.bracket_test(node.words[1:], node.line, name == "["))
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
        if name == "unset":
            for word in words[1:]:
                if not word.text.startswith("-"):
                    self.hold(-size_of(self.env.get(word.text)))
                    self.env[word.text] = UNSET
                    self.dirty[word.text] = None
            return True
        if name == "shift" and self.positional is not None:
            self.positional = self.positional[1:]
            return True
        if name in ("source", ".", "eval"):
            shown = " ".join(w.text.replace(HOLE, "?") for w in words[:2])
            self.note(f"`{shown}` is not followed (qaudit never runs or reads what it names); "
                      f"flags or variables it would set are not seen", node.line, name)
            return True
        if name == "read":
            for word in words[1:]:
                if word.text.isidentifier():
                    self.assign_scalar(word.text, hole(External(word.text, node.line,
                                                                "read from input")))
            return True
        if name in self.functions:
            return self.call(name, words[1:], node.line)
        if self.in_condition:
            # A command's exit status decides the condition; qaudit never runs it.
            shown = (name.replace(HOLE, "?") or "a command")[:30]
            self.last_externals = (External(shown, node.line,
                                            "a command's exit status; qaudit never runs it"),)
            return None
        if self.maybe_launch(words, node.line) and self.saw_arguments:
            self.note("the launch forwards the script's own arguments (\"$@\"); the audit "
                      "assumes none (give them with --set 1=... 2=...)", node.line, "$@")
        return True

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
    def assignment(self, assign: ast.Assign) -> None:
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
        chars = self.expand_joined(assign.value) if assign.value else ()
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

    def assign_element(self, assign: ast.Assign, chars: Chars, old) -> None:
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
    def expand_words(self, words: list[WordTok]) -> list[Word]:
        result = []
        for word in words:
            for chars, condition in self.expand(word):
                self.spend(len(chars))
                result.append(to_word(chars, word.line, condition))
        return result

    def expand(self, word: WordTok, split: bool = True) -> list[tuple[Chars, tuple]]:
        fields = _Fields(split, self.expanded)
        for part in word.parts:
            self.expand_part(part, fields)
        return fields.result()

    def expand_joined(self, word: WordTok) -> Chars:
        """Expansion without word splitting (assignments, `case`, `[[ ]]` operands)."""
        out: list[Ch] = []
        for i, (chars, _) in enumerate(self.expand(word, split=False)):
            if i:
                out.append((" ", chars[0][1] if chars else word.line, None))
            out.extend(chars)
        self.spend(len(out))
        return tuple(out)

    def expand_part(self, part, fields: _Fields) -> None:
        if isinstance(part, Lit):
            chars = self.literals.get(id(part))
            if chars is None:  # built once: a literal in a loop shares its characters
                chars = tuple(map(self.known_char, part.text, part.lines))
                self.literals[id(part)] = chars
            fields.add(chars, False)
            if part.quoted:
                fields.mark()
        elif isinstance(part, Param):
            self.expand_param(part, fields)
        elif isinstance(part, CmdSub):
            shown = part.raw.strip().replace("\n", " ")
            shown = shown if len(shown) <= 30 else shown[:27] + "..."
            fields.add(hole(External(f"$({shown})", part.line,
                                     "a command's output; qaudit never runs it")), False)
            fields.mark()
        elif isinstance(part, Arith):
            fields.add(self.arith_value(part.raw, part.line), not part.quoted)
            if part.quoted:
                fields.mark()

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
        for sub in part.arg:
            self.expand_part(sub, fields)
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
    def test(self, node: ast.Test) -> tuple[bool | None, tuple[External, ...]]:
        items = [item if isinstance(item, str) else (self.expand_joined(item), item)
                 for item in node.items]
        self.spend_on_test([item[0] for item in items if not isinstance(item, str)])
        return TestExpression(items, node.line, double=True).run()

    def spend_on_test(self, operands: list[Chars]) -> None:
        """Comparing operands reads them again; glob-matching one against another costs up
        to the product of their lengths (bounded by all of them times the second longest)."""
        lengths = sorted(len(chars) for chars in operands)
        second = lengths[-2] if len(lengths) > 1 else 0
        self.spend(10 * sum(lengths) + sum(lengths) * second)

    def bracket_test(self, words: list[WordTok], line: int, bracket: bool):
        fields: list = []
        for word in words:
            for chars, _ in self.expand(word):
                fields.append((chars, word))
        if bracket:
            if not fields or text_of(fields[-1][0]) != "]":
                return None, (External("[", line, "is not closed with ]"),)
            fields = fields[:-1]
        self.spend_on_test([c for c, _ in fields])
        items = [text_of(c) if text_of(c) in ("!", "(", ")", "-a", "-o") and not holes(c)
                 else (c, w) for c, w in fields]
        return TestExpression(items, line, double=False).run()


class _Return(Exception):
    pass
