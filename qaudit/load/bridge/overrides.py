"""Overrides on a ConfigContainer, applied as Bridge applies them
(`training/utils/omegaconf_utils.py`, `process_config_with_overrides`), on data:

1. each override YAML file is merged into the config (`OmegaConf.merge`: mappings merge key by
   key, anything else replaces); a file whose only section is `ConfigContainer:` (the old perf
   scripts' shape, beside `perf_matrix:`) is read from that section;
2. then each `key=value` argument, with Hydra's override grammar on a struct config:
   `a.b=c` sets an existing key (an unknown one is an error), `+a.b=c` adds a new key (an
   existing one is an error), `++a.b=c` sets or adds, `~a.b` deletes it from the merged
   mapping, which in Bridge leaves the dataclass field as the recipe set it (its
   `_apply_overrides` only writes the keys present);
3. Bridge writes the result back onto the dataclasses, key by key.

Values are Hydra's primitives (null, true/false in any case, integers, floats, quoted strings,
`[...]` lists and `{...}` mappings); interpolations (`${...}`, which resolve from the
environment or run resolvers), sweeps (`a=1,2`) and grammar functions are refused. Nothing is
imported or resolved. Each key set is traced to the file and line, or the argument, that set it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from qaudit.errors import InputError
from qaudit.load.yamlio import (MAX_EXPANDED_VALUES, MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_NESTING,
                                YamlMap, expanded_size, load_yaml, load_yaml_text, type_name)

Where = tuple[str, "int | None"]


@dataclass(frozen=True)
class Override:
    """One override: an override YAML file (`path`) or a `key=value` argument (`text`)."""

    path: str | None = None
    text: str | None = None
    index: int = 0  # the argument's position on the command line, for messages

    @property
    def label(self) -> str:
        if self.path is not None:
            return self.path
        return f"argument {self.index} ({self.text})"


def apply_overrides(document: YamlMap, display: str, overrides: Sequence[Override | str]
                    ) -> tuple[dict[str, Where], set[str], list[str]]:
    """Apply in Bridge's order (files, then arguments). Returns where each dotted key was set
    by an override, the set of those keys, and remarks for the report header."""
    origins: dict[str, Where] = {}
    remarks: list[str] = []
    items = [o if isinstance(o, Override) else Override(text=o, index=i + 1)
             for i, o in enumerate(overrides)]
    budget = _Budget()
    files: dict[str, YamlMap] = {}  # each override file is read once, however often named
    for item in items:
        if item.path is not None:
            update = files.get(_file_key(item.path))
            if update is None:
                update = files[_file_key(item.path)] = read_override_file(item.path)
            budget.spend(update, item)
            _merge(document, update, "", item.path, origins)
    for item in items:
        if item.text is not None:
            if _apply_argument(document, item, origins, budget):
                remarks.append(f"{item.label}: Bridge writes back only the keys left after the "
                               "overrides, so a deleted key keeps the recipe's value")
    deleted = {o.text.lstrip("~").partition("=")[0] for o in items
               if o.text is not None and o.text.startswith("~")}
    return origins, set(origins) - deleted, remarks


class _Budget:
    """Values the overrides bring in, all of them together, aliases expanded: each file and
    argument is bounded on its own by the loader, and this bounds many of them named at once
    (the same file 200 times, thousands of aliased arguments)."""

    def __init__(self) -> None:
        self.spent = 0

    def spend(self, value: Any, item: Override) -> None:
        self.spent += expanded_size(value)
        if self.spent > MAX_EXPANDED_VALUES:
            raise InputError(f"the overrides up to this one bring in more than "
                             f"{MAX_EXPANDED_VALUES} values (aliases expanded); refused",
                             file=item.label)


def _file_key(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):  # a NUL in the name: read_override_file says what is wrong
        return path


# --- override files ------------------------------------------------------------------------

def read_override_file(path: str) -> YamlMap:
    document = load_yaml(Path(path), path)
    if not isinstance(document, YamlMap):
        raise InputError(f"expected a mapping of ConfigContainer sections, got "
                         f"{type_name(document)}", file=path, line=getattr(document, "line", 1))
    wrapped = document.get("ConfigContainer")
    if isinstance(wrapped, YamlMap) and set(document) <= {"ConfigContainer", "perf_matrix"}:
        return wrapped
    return document


def _merge(base: YamlMap, update: YamlMap, prefix: str, file: str,
           origins: dict[str, Where]) -> None:
    for key, value in update.items():
        dotted = f"{prefix}{key}"
        line = update.line_of(key)
        if isinstance(value, YamlMap) and isinstance(base.get(key), YamlMap) \
                and "_target_" not in value:
            _merge(base[key], value, dotted + ".", file, origins)
            continue
        base[key] = value
        base.key_lines[key] = line
        _record(value, dotted, (file, line), origins)


def _record(value: Any, dotted: str, at: Where, origins: dict[str, Where]) -> None:
    origins[dotted] = at
    if isinstance(value, YamlMap):
        for key in value:
            _record(value[key], f"{dotted}.{key}", (at[0], value.line_of(key)), origins)


# --- key=value arguments -------------------------------------------------------------------

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_0-9][A-Za-z0-9_]*)*$")
_INT = re.compile(r"^[+-]?(0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"^[+-]?(\d[\d_]*\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan)$",
                    re.IGNORECASE)
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\(.*\)$", re.DOTALL)


def _apply_argument(document: YamlMap, item: Override, origins: dict[str, Where],
                    budget: _Budget) -> bool:
    """Apply one argument; True for a deletion (which changes nothing in Bridge)."""
    text = item.text or ""
    where = (item.label, None)

    def fail(message: str, key: str | None = None) -> InputError:
        return InputError(message, file=item.label, key=key)

    if len(text) > MAX_FILE_BYTES:
        raise fail(f"{len(text)} characters; more than {MAX_FILE_BYTES} is refused, as for a file")
    prefix = "++" if text.startswith("++") else text[:1] if text[:1] in "+~" else ""
    body = text[len(prefix):]
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not _KEY.match(key):
        raise fail("expected key=value (Hydra override syntax: a.b=c, +a.b=c, ++a.b=c, ~a.b)")
    if prefix != "~" and not sep:
        raise fail("missing '=value' (Hydra override syntax: a.b=c, +a.b=c, ++a.b=c, ~a.b)", key)
    parts = key.split(".")
    if len(parts) > MAX_NESTING:
        raise fail(f"a key {len(parts)} levels deep; more than {MAX_NESTING} is refused, as for "
                   "a file", key)
    value = parse_value(raw, fail, key) if prefix != "~" else None
    budget.spend(value, item)
    parent = document
    for depth, part in enumerate(parts[:-1]):
        child = parent.get(part)
        if child is None and prefix in ("+", "++"):
            child = YamlMap(line=None)
            parent[part] = child
            parent.key_lines[part] = None
        if not isinstance(child, YamlMap):
            raise fail(f"'{'.'.join(parts[:depth + 1])}' is "
                       f"{'not in the config' if child is None else type_name(child)}, so "
                       f"'{key}' cannot be set (Hydra: Could not override)", key)
        parent = child
    leaf = parts[-1]
    exists = leaf in parent
    if prefix == "~":
        if not exists:
            raise fail("cannot delete a key that is not in the config (Hydra raises)", key)
        return True  # Bridge keeps the recipe's value: nothing changes
    if prefix == "" and not exists:
        raise fail("not in the config: Hydra refuses to add a key without '+' (and Bridge "
                   "would skip a field its dataclass lacks)", key)
    if prefix == "+" and exists:
        raise fail("already in the config: '+' adds a new key only (Hydra raises); use "
                   f"{key}=... or ++{key}=...", key)
    if isinstance(value, YamlMap) and isinstance(parent.get(leaf), YamlMap):
        for sub, sub_value in value.items():
            parent[leaf][sub] = sub_value
            parent[leaf].key_lines[sub] = None
            _record(sub_value, f"{key}.{sub}", where, origins)
        return False
    parent[leaf] = value
    parent.key_lines[leaf] = None
    _record(value, key, where, origins)
    return False


def parse_value(raw: str, fail, key: str) -> Any:
    """A Hydra override value as Hydra's grammar reads its primitives."""
    text = raw.strip()
    if "${" in text:
        raise fail("interpolations (${...}) are refused: they resolve from the environment or "
                   "run resolvers", key)
    if text == "":
        return ""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.match(text):
        digits = len(text.lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:
            raise fail(f"an integer of {digits} digits; more than {MAX_INT_DIGITS} is refused, "
                       "as in a file", key)
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    if text[0] in "[{":
        # The loader of files, with its bounds (aliases, expansion, nesting, digits) and its
        # messages for bad tagged values; an argument has no lines to point at.
        try:
            return load_yaml_text(text, "argument", lines=False)
        except InputError as exc:
            raise fail(f"cannot read the value as a list or mapping: {exc.message}",
                       key) from None
    if _FUNCTION.match(text):
        raise fail(f"Hydra grammar functions ({text.split('(')[0]}(...)) are not supported", key)
    if "," in text:
        raise fail("a sweep (a=1,2) needs Hydra's multirun, which Bridge does not use", key)
    return text
