"""Bash launch scripts -> the argv they pass to Megatron, without running anything.

The argv is that of the first command launching a Python entry script with Megatron flags
(`torchrun ... pretrain_gpt.py --num-layers 32 ...`). A script without such a command (an
argument file such as `conf/<model>.sh` that only sets `MODEL_ARGS="..."`) contributes the
variables that hold Megatron flags, in the order they were first assigned.
"""

from __future__ import annotations

import gc
from typing import Mapping

from qaudit.load.config import SourceNote
from qaudit.errors import InputError
from qaudit.load.sources.shell_eval import Interpreter, Outcome
from qaudit.load.sources.shell_tree import Script
from qaudit.load.sources.shell_values import as_array, to_word
from qaudit.load.sources.tokens import Word
from qaudit.load.sources.upstream_flags import UPSTREAM_FLAGS

SHELLS = ("bash", "/sh", "zsh", "dash")


def looks_like_launch_script(path_suffix: str, first_line: str) -> bool:
    if path_suffix in (".sh", ".bash"):
        return True
    return first_line.startswith("#!") and any(shell in first_line for shell in SHELLS)


def _megatron_flag_count(words: list[Word]) -> int:
    return sum(1 for w in words if w.text.split("=", 1)[0] in UPSTREAM_FLAGS)


def launch_script_words(text: str, file: str, variables: Mapping[str, str]
                        ) -> tuple[list[Word], list[SourceNote], Word | None]:
    """The argv Megatron gets, notes, and the entry script word (None: the file launches
    nothing and only holds flag variables)."""
    # Reading creates millions of small acyclic objects (tokens, characters) that reference
    # counting frees; the cycle collector's passes over them cost more than the reading itself
    # on a 1 MiB script.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _launch_script_words(text, file, variables)
    finally:
        if collecting:
            gc.enable()


def _launch_script_words(text: str, file: str, variables: Mapping[str, str]
                         ) -> tuple[list[Word], list[SourceNote], Word | None]:
    outcome = Interpreter(file, dict(variables)).run(Script(text, file))
    notes = list(outcome.notes)
    launches = [launch for launch in outcome.launches if _megatron_flag_count(launch.argv)]
    if launches:
        chosen = launches[0]
        for other in launches[1:]:
            if [w.text for w in other.argv] != [w.text for w in chosen.argv]:
                notes.append(SourceNote(f"line {other.line} launches Megatron again with other "
                                        f"flags; only the launch at line {chosen.line} is "
                                        f"audited", other.line, "launch"))
        return chosen.argv, notes, chosen.script
    words = _flag_variables(outcome)
    if not words:
        raise InputError("no Megatron flags found: no command launching a Python entry script "
                         "with Megatron flags (torchrun ... pretrain_gpt.py --num-layers ...) "
                         "and no variable holding such flags", file=file)
    return words, notes, None


def _flag_variables(outcome: Outcome) -> list[Word]:
    """Words of every variable that holds Megatron flags, as an unquoted expansion gives them."""
    result: list[Word] = []
    for name in outcome.order:
        value = outcome.env.get(name)
        words: list[Word] = []
        for elem in as_array(value):
            words.extend(_split(elem.chars, elem.condition))
        if _megatron_flag_count(words):
            result.extend(words)
    return result


def _split(chars, condition) -> list[Word]:
    words, current = [], []
    for ch in chars:
        if ch[2] is None and ch[0] in " \t\n":
            if current:
                words.append(to_word(tuple(current), current[0][1], condition))
            current = []
        else:
            current.append(ch)
    if current:
        words.append(to_word(tuple(current), current[0][1], condition))
    return words

