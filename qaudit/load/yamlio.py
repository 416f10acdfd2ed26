"""Safe YAML loading that remembers the line of every mapping key.

Findings and errors point at the YAML line that causes them, so plain dicts are not enough:
`YamlMap` is a dict that also knows where each of its keys was written.
"""

from __future__ import annotations

import difflib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from qaudit.errors import InputError

# Real configs, recipes and launch scripts are a few KB; PyYAML's pure-Python scanner needs
# seconds per MB, so this also bounds the time any input can take to parse.
MAX_FILE_BYTES = 1024 * 1024
# Aliases are legal YAML, but a few dozen nested ones expand to gigabytes ("billion laughs").
MAX_ALIASES = 100
# What aliases may expand to: more values than any real config has, far fewer than a bomb.
MAX_EXPANDED_VALUES = 1_000_000
# Integers longer than this are refused while loading: no config needs them, and Python cannot
# even print one past 4300 digits (YAML 1.1's base-60 `1:2:3...` reaches that from a short line).
MAX_INT_DIGITS = 100
# Levels of nested collections (flow plus block); real configs use a handful.
MAX_NESTING = 64


class YamlMap(dict):
    """A mapping from YAML with `line` (its own) and `key_lines` (per key), 1-based."""

    def __init__(self, *args: Any, line: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line = line
        self.key_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int | None:
        return self.key_lines.get(key, self.line)


class YamlList(list):
    """A sequence from YAML with its own `line`."""

    def __init__(self, *args: Any, line: int | None = None) -> None:
        super().__init__(*args)
        self.line = line


class NestedTooDeeply(yaml.scanner.ScannerError):
    """More than MAX_NESTING levels of YAML collections."""


class BoundedSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no Python tags) that stops past MAX_NESTING levels of nesting.

    PyYAML's pure-Python scanner is quadratic in flow nesting (`[[[[...`: 5,000 levels take
    seconds, a 4 MB file hours) and its composer recursive: real configs nest a few levels.
    """

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML hook
        if self.flow_level >= MAX_NESTING:
            raise NestedTooDeeply(None, None, "nested too deeply", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:  # PyYAML hook: a block collection opens
        if len(self.indents) >= MAX_NESTING:
            raise NestedTooDeeply(None, None, "nested too deeply", self.get_mark())
        return super().add_indent(column)


class _LineLoader(BoundedSafeLoader):
    """The bounded safe loader, building YamlMap/YamlList."""

    def __init__(self, stream: str, file: str, duplicates: list[Duplicate] | None = None,
                 lines: bool = True) -> None:
        super().__init__(stream)
        self.file = file
        self.alias_count = 0
        # False for text that is not a file (an override argument): no line to point at.
        self.lines = lines
        # None: a duplicate key is an error. A list: PyYAML's own behaviour (the last value
        # wins, at the first one's position in the mapping), each duplicate recorded here.
        self.duplicates = duplicates

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D401 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            self.alias_count += 1
            if self.alias_count > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise InputError(f"more than {MAX_ALIASES} YAML aliases; refusing to expand them",
                                 file=self.file, line=mark.line + 1)
        return super().compose_node(parent, index)

    def construct_object(self, node: Any, deep: bool = False) -> Any:  # noqa: D401 - PyYAML hook
        """PyYAML's constructors raise plain Python errors for some bad values (an integer past
        Python's 4300-digit limit, `!!timestamp 2001-13-45`, `!!bool maybe`, `!!map [1, 2]`);
        report them at the node's line instead."""
        try:
            value = super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError, LookupError, AttributeError) as exc:
            message = str(exc).split("\n", 1)[0]
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            if "integer string conversion" in message:
                message = "integer with more than 4300 digits"
            elif isinstance(exc, (TypeError, AttributeError)):  # e.g. `!!map [1, 2]`
                kind = {"MappingNode": "mapping", "SequenceNode": "list"}.get(
                    type(node).__name__, "scalar")
                message = f"tag {tag} does not fit a {kind}"
            elif isinstance(exc, LookupError):  # e.g. `!!bool maybe`
                message = f"tag {tag} does not accept {short_repr(node.value)}"
            raise InputError(f"invalid YAML value: {message}", file=self.file,
                             line=node.start_mark.line + 1) from None
        if isinstance(value, int) and not isinstance(value, bool) and \
                value.bit_length() > MAX_INT_DIGITS * 3.33:
            raise InputError(f"integer with more than {MAX_INT_DIGITS} digits", file=self.file,
                             line=node.start_mark.line + 1)
        return value


@dataclass(frozen=True)
class Duplicate:
    """A key written twice in one mapping: `line` the later one, which PyYAML keeps."""

    key: Any
    first_line: int
    line: int


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> YamlMap:
    written = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)
    merged = len(node.value) - written  # flatten_mapping puts merged pairs first
    result = YamlMap(line=node.start_mark.line + 1 if loader.lines else None)
    from_merge: set[Any] = set()  # keys whose value a merge key (`<<: *x`) brought in
    for index, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise InputError("mapping keys must be plain scalars", file=loader.file, line=line)
        if loader.duplicates is not None:
            if index < merged:
                from_merge.add(key)
            elif key in from_merge:
                from_merge.discard(key)  # a written key overriding a merged one: plain YAML
            elif key in result:
                loader.duplicates.append(Duplicate(key, result.key_lines[key], line))
        elif key in result:
            raise InputError("duplicate key (the first value would be silently replaced)",
                             file=loader.file, line=line, key=str(key))
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line if loader.lines else None
    return result


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> YamlList:
    return YamlList((loader.construct_object(child, deep=True) for child in node.value),
                    line=node.start_mark.line + 1 if loader.lines else None)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def value_loader(file: str) -> BoundedSafeLoader:
    """A loader for constructing single nodes as `load_yaml` does: bad scalars (huge
    integers, impossible timestamps) raise InputError at the node's line in `file`."""
    return _LineLoader("", file)


def read_text(path: Path, display: str) -> str:
    """Read a small UTF-8 text file, turning every failure into an InputError."""
    try:
        mode = os.stat(path).st_mode  # one stat: a link loop is said as such, not "not found"
    except FileNotFoundError:
        raise InputError("file not found", file=display) from None
    except (OSError, ValueError) as exc:  # link loop, name too long, NUL, no permission
        raise InputError(f"cannot open file: {getattr(exc, 'strerror', None) or exc}",
                         file=display) from None
    if stat.S_ISDIR(mode):
        raise InputError("is a directory, expected a YAML file", file=display)
    if not stat.S_ISREG(mode):
        # Devices and pipes report no size and may never end.
        raise InputError("not a regular file", file=display)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InputError(f"file is {size} bytes; more than {MAX_FILE_BYTES} is refused",
                             file=display)
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror}", file=display) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError("not UTF-8 text", file=display, line=line) from None


def load_yaml(path: Path, display: str | None = None,
              duplicates: list[Duplicate] | None = None) -> Any:
    """Load one YAML document safely; errors carry the file and line. With `duplicates`, a
    key written twice is kept as PyYAML keeps it (last value) and recorded there."""
    display = display or str(path)
    return load_yaml_text(read_text(path, display), display, duplicates)


def load_yaml_text(text: str, display: str, duplicates: list[Duplicate] | None = None,
                   lines: bool = True) -> Any:
    """`load_yaml` on text already read (or given on the command line: `lines` False leaves
    every line unknown), within the same bounds: size, aliases, expansion, nesting, digits."""
    if len(text) > MAX_FILE_BYTES:
        raise InputError(f"{len(text)} characters; more than {MAX_FILE_BYTES} is refused",
                         file=display)
    if "\x00" in text:
        raise InputError("binary data (NUL byte), expected YAML text", file=display)
    loader = None
    try:
        loader = _LineLoader(text, display, duplicates, lines)  # checks every character
        node = loader.get_single_node()
        if node is None:
            raise InputError("empty file, expected a YAML mapping", file=display)
        document = loader.construct_document(node)
        expanded = expanded_size(document)
        if expanded > MAX_EXPANDED_VALUES:
            raise InputError(f"aliases expand this document to {expanded} values; more than "
                             f"{MAX_EXPANDED_VALUES} is refused", file=display)
        return document
    except NestedTooDeeply as exc:
        raise InputError(f"YAML nested too deeply (more than {MAX_NESTING} levels)", file=display,
                         line=exc.problem_mark.line + 1 if lines else None) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark and lines else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise InputError(f"invalid YAML: {problem}", file=display, line=line) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1 if lines else None
        raise InputError(f"invalid YAML: unacceptable character #x{exc.character:04x}: "
                         f"{exc.reason}", file=display, line=line) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else 'error'}",
                         file=display) from None
    except RecursionError:
        raise InputError("YAML nested too deeply", file=display) from None
    finally:
        if loader is not None:
            loader.dispose()


def expanded_size(value: Any) -> int:
    """Values in `value` once aliases (shared lists and mappings) are expanded, counted in
    time linear in the distinct objects; past MAX_EXPANDED_VALUES the count stops there
    (a cycle counts as past it)."""
    return _expanded_size(value, {})


def _expanded_size(value: Any, memo: dict[int, int]) -> int:
    """Number of values once aliases are expanded; shared objects are counted once each."""
    if not isinstance(value, (list, dict)):
        return 1
    known = memo.get(id(value))
    if known is not None:
        return known
    memo[id(value)] = MAX_EXPANDED_VALUES + 1  # a cycle counts as too big
    items = value.values() if isinstance(value, dict) else value
    total = 1
    for item in items:
        total += _expanded_size(item, memo)
        if total > MAX_EXPANDED_VALUES:
            break
    memo[id(value)] = total
    return total


def short_repr(value: Any, limit: int = 60) -> str:
    """repr() cut to `limit` characters, so a huge value never floods an error message."""
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 20 else \
        f"<{type_name(value)} of {len(value)} items>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix when a close match exists, else ''."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__
