"""What translating a file's Megatron flags accumulates, and the helpers that read and write it.

The flag helpers (parser_refusals, startup_refusals, modelopt_flags, checked_flags) and each
family's flags.py take a `FlagState`; qaudit/load/sources/translate.py's `Translator` is one
and runs them. Below all of them, so none imports the translator that calls it.
"""

from __future__ import annotations

from typing import Any

from qaudit.errors import InputError
from qaudit.load.model_config import SourceNote
from qaudit.load.sources import megatron_flags as flags
from qaudit.load.sources.argv import Argv, Occurrence
from qaudit.load.sources.entry import Entry
from qaudit.load.sources.tokens import External
from qaudit.load.yamlio import YamlMap


def missing_value_error(file: str, occurrence: Occurrence, missing: tuple[External, ...],
                        conditional: bool = False) -> InputError:
    """One message naming the file, line, flag and the outside value, with the fix."""
    names = list(dict.fromkeys([d for e in missing for d in e.deciders] +
                               [e.name for e in missing if e.settable()]))
    fix = "pass " + " ".join(f"--set {n}=VALUE" for n in names) if names \
        else "write the value into the file"
    what = "is passed only if a condition holds that reads" if conditional else \
        "takes its value from"
    return InputError(f"{occurrence.flag} {what} {missing[0].describe()}, and the audit "
                      f"needs it; {fix}", file=file, line=occurrence.line, key=occurrence.flag)


class FlagState:
    """The flags a file passes (the last occurrence of each), the fields set from them, with
    the flag and line of each, and the notes for the report."""

    def __init__(self, argv: Argv, file: str, entry: Entry | None = None) -> None:
        self.file = file
        self.entry = entry or Entry(None, None, file)
        self.mapping = YamlMap(line=1)
        self.flag_of: dict[str, str] = {}  # field -> the flag that set it, for messages
        self.notes: list[SourceNote] = []
        # argparse: the last occurrence of a flag wins.
        self.last: dict[str, Occurrence] = {}
        for occurrence in argv.occurrences:
            self.last.pop(occurrence.flag, None)
            self.last[occurrence.flag] = occurrence
        self.loose = argv.loose
        self.modelled = flags.modelled_flags()

    # --- helpers ---------------------------------------------------------------------------
    def set(self, field: str, value: Any, line: int | None, flag: str) -> None:
        self.mapping[field] = value
        self.mapping.key_lines[field] = line
        self.flag_of[field] = flag

    def note(self, message: str, line: int | None, key: str | None,
             no_effect: bool = False) -> None:
        self.notes.append(SourceNote(message, line, key, no_effect=no_effect))

    def needed(self, occurrence: Occurrence) -> list[str]:
        """The occurrence's values, all known; otherwise an InputError (the audit needs them)."""
        if occurrence.word.condition:
            raise missing_value_error(self.file, occurrence, occurrence.word.condition, True)
        for value in occurrence.values:
            if value.depends_on():
                raise missing_value_error(self.file, occurrence, value.depends_on(),
                                          conditional=not value.unknown)
        return [value.text for value in occurrence.values]

    def given(self, flag: str) -> bool:
        return flag in self.last
