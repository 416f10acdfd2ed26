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

Arguments are read with Hydra's override grammar (qaudit/load/bridge/override_grammar.py:
values typed as the grammar types them, not as YAML would); interpolations (`${...}`, which
resolve from the environment or run resolvers), sweeps (`a=1,2`) and grammar functions are
refused. Nothing is imported or resolved. Each key set is traced to the file and line, or the
argument, that set it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from qaudit.errors import InputError
from qaudit.load.bridge.override_grammar import GrammarError, ParsedOverride, parse_override
from qaudit.load.yamlio import (MAX_EXPANDED_VALUES, MAX_FILE_BYTES, MAX_NESTING, YamlMap,
                                expanded_size, load_yaml, type_name)

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
    deleted: set[str] = set()
    for item in items:
        if item.text is not None:
            removed = _apply_argument(document, item, origins, budget)
            if removed is not None:
                deleted.add(removed)
                remarks.append(f"{item.label}: Bridge writes back only the keys left after the "
                               "overrides, so a deleted key keeps the recipe's value")
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

def _apply_argument(document: YamlMap, item: Override, origins: dict[str, Where],
                    budget: _Budget) -> str | None:
    """Apply one argument as hydra's `_apply_overrides_to_config` does on Bridge's struct
    config (OmegaConf.update with merge; `+`/`++` with force_add); the key of a deletion
    (which changes nothing in Bridge), else None."""
    text = item.text or ""
    key: str | None = None

    def fail(message: str) -> InputError:
        return InputError(message, file=item.label, key=key)

    if len(text) > MAX_FILE_BYTES:
        raise fail(f"{len(text)} characters; more than {MAX_FILE_BYTES} is refused, as for a file")
    try:
        parsed = parse_override(text)
    except GrammarError as exc:
        raise fail(str(exc)) from None
    key = parsed.key
    parts = key.split(".")
    if len(parts) > MAX_NESTING:
        raise fail(f"a key {len(parts)} levels deep; more than {MAX_NESTING} is refused, as for "
                   "a file")
    budget.spend(parsed.value, item)
    if key == "" and (parsed.kind in ("delete", "change")
                      or parsed.kind == "add" and not isinstance(parsed.value, (YamlMap, list))):
        # hydra's empty key is the root: it cannot be deleted or changed, and `+` of a plain
        # value finds it already there; `++`, or `+` of a mapping or list, adds a key ''.
        raise fail("the empty key names the whole config: only ++=value or +={...}/[...] "
                   "add a key '' (Hydra refuses the others)")
    if parsed.kind == "delete":
        _check_deletion(document, parsed, fail)
        return key  # Bridge keeps the recipe's value: nothing changes
    current = _select(document, parts)
    if parsed.kind == "add" and current is not None \
            and not isinstance(parsed.value, (YamlMap, list)):
        raise fail(f"already in the config: '+' adds a new key only (Hydra raises); use "
                   f"{key}=... or ++{key}=...")
    _update(document, parts, parsed.value, parsed.kind != "change", fail)
    _record(parsed.value, key, (item.label, None), origins)
    return None


def _select(document: YamlMap, parts: list[str]) -> Any:
    """OmegaConf.select: the value at the dotted key, None when a part is missing."""
    node: Any = document
    for part in parts:
        node = _child(node, part)
        if node is None:
            return None
    return node


def _child(node: Any, part: str) -> Any:
    if isinstance(node, YamlMap):
        return node.get(part)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return None


def _check_deletion(document: YamlMap, parsed: ParsedOverride, fail) -> None:
    current = _select(document, parsed.key.split("."))
    if current is None:  # hydra's test: a key set to null cannot be deleted either
        raise fail("cannot delete a key that is not in the config or is null (Hydra raises)")
    if parsed.has_value and parsed.value is not None and parsed.value != current:
        raise fail(f"cannot delete: its value is {current!r}, not {parsed.value!r} (Hydra "
                   "raises)")


def _update(document: YamlMap, parts: list[str], value: Any, force_add: bool, fail) -> None:
    """OmegaConf.update(merge=True): the parents must exist (or are made, with force_add);
    a mapping merges into a mapping, anything else replaces."""
    parent: Any = document
    for depth, part in enumerate(parts[:-1]):
        child = _child(parent, part)
        if force_add and isinstance(parent, YamlMap) and not isinstance(child, (YamlMap, list)):
            # `+`/`++` make the missing parent, and replace a plain value on the way with a
            # mapping (OmegaConf.update with force_add).
            child = parent[part] = YamlMap(line=None)
            parent.key_lines[part] = None
        if not isinstance(child, (YamlMap, list)):
            where = ".".join(parts[:depth + 1])
            raise fail(f"'{where}' is {'not in the config' if child is None else type_name(child)}"
                       f", so '{'.'.join(parts)}' cannot be set (Hydra: Could not override)")
        parent = child
    leaf = parts[-1]
    if isinstance(parent, list):
        if not (leaf.isdigit() and int(leaf) < len(parent)):
            raise fail(f"'{leaf}' is not an index of the list (Hydra: Could not override)")
        parent[int(leaf)] = value
        return
    if leaf not in parent and not force_add:
        raise fail("not in the config: Hydra refuses to add a key without '+' (and Bridge "
                   "would skip a field its dataclass lacks)")
    _check_kinds(parent.get(leaf), value, ".".join(parts), fail)
    if isinstance(value, YamlMap) and isinstance(parent.get(leaf), YamlMap):
        _merge_mapping(parent[leaf], value, force_add, ".".join(parts), fail)
        return
    parent[leaf] = value
    parent.key_lines[leaf] = None


def _merge_mapping(target: YamlMap, update: YamlMap, force_add: bool, dotted: str,
                   fail) -> None:
    """OmegaConf.merge on Bridge's struct config: a key the target lacks is an error
    unless the override is `+`/`++` (which opens the struct)."""
    for key, value in update.items():
        if key not in target and not force_add:
            raise fail(f"'{dotted}.{key}' is not in the config: merging a mapping into a "
                       "section cannot add keys without '+' (Hydra: Could not override)")
        _check_kinds(target.get(key), value, f"{dotted}.{key}", fail)
        if isinstance(value, YamlMap) and isinstance(target.get(key), YamlMap):
            _merge_mapping(target[key], value, force_add, f"{dotted}.{key}", fail)
            continue
        target[key] = value
        target.key_lines[key] = None


def _check_kinds(current: Any, value: Any, dotted: str, fail) -> None:
    """OmegaConf cannot merge a list into a mapping or a mapping into a list."""
    if isinstance(current, YamlMap) and isinstance(value, list) \
            or isinstance(current, list) and isinstance(value, YamlMap):
        raise fail(f"'{dotted}' is {type_name(current)}: a {type_name(value)} cannot be "
                   "merged into it (Hydra: Error merging override)")
