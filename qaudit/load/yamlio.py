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
from qaudit.load import run_files

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
        self.merged_pairs: dict[int, tuple[list, int]] = {}  # _merged_pairs's memo

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
    # A key a merge (`<<: *x`) brought in, written again: plain YAML, refused only by the
    # strict loader.
    merged: bool = False


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> YamlMap:
    pairs, merged = _merged_pairs(node, loader.merged_pairs)
    result = YamlMap(line=node.start_mark.line + 1 if loader.lines else None)
    from_merge: set[Any] = set()  # keys whose value a merge key (`<<: *x`) brought in
    for index, (key_node, value_node) in enumerate(pairs):
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise InputError("mapping keys must be plain scalars", file=loader.file, line=line)
        if key in result:
            repeat = Duplicate(key, result.key_lines[key], line,
                               merged=index < merged or key in from_merge)
            if loader.duplicates is None:
                raise duplicate_error(repeat, loader.file)
            if not repeat.merged:
                loader.duplicates.append(repeat)
        if index < merged:
            from_merge.add(key)
        else:
            from_merge.discard(key)  # a written key overriding a merged one: plain YAML
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line if loader.lines else None
    return result


_MERGE = "tag:yaml.org,2002:merge"


def _merged_pairs(node: yaml.MappingNode, memo: dict[int, tuple[list, int]]
                  ) -> tuple[list, int]:
    """The mapping's (key, value) node pairs with its merge keys (`<<: *x`) replaced by the
    pairs they bring in, placed first and picked as the installed PyYAML's flatten_mapping
    picks them, and how many were brought in. Unlike flatten_mapping it leaves the node graph
    as parsed: each reader of a file builds its document from the run's one parse
    (run_files), and the MODEL_ARGS reader reads the merge keys themselves. `memo`: the
    mappings already done in this document (a chain of merges costs its length, not its
    square)."""
    if id(node) in memo:
        return memo[id(node)]
    merge: list = []
    seen: set[int] = set()  # a key node's text reached again through the same anchor

    def bring(source: yaml.MappingNode) -> None:
        for pair in _merged_pairs(source, memo)[0]:
            if id(pair[0].value) not in seen:
                seen.add(id(pair[0].value))
                merge.append(pair)

    written = []
    for key_node, value_node in node.value:
        if key_node.tag != _MERGE:
            if key_node.tag == "tag:yaml.org,2002:value":  # `=` as a key is a plain string
                key_node.tag = "tag:yaml.org,2002:str"
            written.append((key_node, value_node))
        elif isinstance(value_node, yaml.MappingNode):
            bring(value_node)
        elif isinstance(value_node, yaml.SequenceNode):
            for subnode in value_node.value:
                if not isinstance(subnode, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"expected a mapping for merging, but found {subnode.id}",
                        subnode.start_mark)
                bring(subnode)
        else:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"expected a mapping or list of mappings for merging, but found {value_node.id}",
                value_node.start_mark)
    memo[id(node)] = merge + written, len(merge)
    return memo[id(node)]


def duplicate_error(repeat: Duplicate, file: str) -> InputError:
    return InputError("duplicate key (the first value would be silently replaced)",
                      file=file, line=repeat.line, key=str(repeat.key))


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
    """Read a small UTF-8 text file, turning every failure into an InputError; within a run
    (run_files.one_run), a file already read is not read again."""
    return _read(path, display)[0]


def _read(path: Path, display: str) -> tuple[str, run_files.FileKey | None]:
    """The file's text and, within a run, its key there."""
    try:
        stat_result = os.stat(path)  # one stat: a link loop is said as such, not "not found"
    except FileNotFoundError:
        raise InputError("file not found", file=display) from None
    except (OSError, ValueError) as exc:  # link loop, name too long, NUL, no permission
        raise InputError(f"cannot open file: {getattr(exc, 'strerror', None) or exc}",
                         file=display) from None
    mode = stat_result.st_mode
    if stat.S_ISDIR(mode):
        raise InputError("is a directory, expected a YAML file", file=display)
    if not stat.S_ISREG(mode):
        # Devices and pipes report no size and may never end.
        raise InputError("not a regular file", file=display)
    if stat_result.st_size > MAX_FILE_BYTES:
        raise InputError(f"file is {stat_result.st_size} bytes; more than {MAX_FILE_BYTES} is "
                         "refused", file=display)
    files = run_files.current()
    key = run_files.file_key(path, stat_result) if files is not None else None
    if key is not None and key in files.texts:
        return files.texts[key], key
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror}", file=display) from None
    if len(data) > MAX_FILE_BYTES:  # it grew since the stat
        raise InputError(f"file is {len(data)} bytes; more than {MAX_FILE_BYTES} is refused",
                         file=display)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError("not UTF-8 text", file=display, line=line) from None
    if key is not None:
        files.texts[key] = text
    return text, key


def load_yaml(path: Path, display: str | None = None,
              duplicates: list[Duplicate] | None = None) -> Any:
    """Load one YAML document safely; errors carry the file and line. With `duplicates`, a
    key written twice is kept as PyYAML keeps it (last value) and recorded there. Within a
    run the file is parsed once; each call builds its own document from the parse."""
    display = display or str(path)
    return _construct(parse_file(path, display), display, duplicates, lines=True)


def parse_file(path: Path, display: str) -> yaml.Node:
    """The file's YAML node graph (parsed once per run, run_files), bounded as `load_yaml`."""
    text, key = _read(path, display)
    files = run_files.current()
    if key is None or files is None:
        return parse_text(text, display)
    if key not in files.parsed:
        try:
            files.parsed[key] = parse_text(text, display)
        except InputError as exc:
            files.parsed[key] = exc
    outcome = files.parsed[key]
    if isinstance(outcome, InputError):  # said about the file as this caller names it
        raise InputError(outcome.message, file=display, line=outcome.line,
                         key=outcome.key) from None
    return outcome


def load_yaml_text(text: str, display: str, duplicates: list[Duplicate] | None = None,
                   lines: bool = True) -> Any:
    """`load_yaml` on text already read (or given on the command line: `lines` False leaves
    every line unknown), within the same bounds: size, aliases, expansion, nesting, digits."""
    return _construct(parse_text(text, display, lines), display, duplicates, lines)


def parse_text(text: str, display: str, lines: bool = True) -> yaml.Node:
    """The one place YAML text is parsed (scanned and composed into PyYAML's node graph),
    within the bounds on size, aliases and nesting; every failure is an InputError."""
    if len(text) > MAX_FILE_BYTES:
        raise InputError(f"{len(text)} characters; more than {MAX_FILE_BYTES} is refused",
                         file=display)
    if "\x00" in text:
        raise InputError("binary data (NUL byte), expected YAML text", file=display)
    loader = None
    try:
        loader = _LineLoader(text, display, lines=lines)  # checks every character
        node = loader.get_single_node()
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1 if lines else None
        raise InputError(f"invalid YAML: unacceptable character #x{exc.character:04x}: "
                         f"{exc.reason}", file=display, line=line) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise _yaml_error(exc, display, lines) from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        raise InputError("empty file, expected a YAML mapping", file=display)
    return node


def _construct(node: yaml.Node, display: str, duplicates: list[Duplicate] | None,
               lines: bool) -> Any:
    """The document of a parsed node graph (YamlMap/YamlList, lines kept), bounded in size."""
    loader = _LineLoader("", display, duplicates, lines)
    try:
        document = loader.construct_document(node)
    except (yaml.YAMLError, RecursionError) as exc:
        raise _yaml_error(exc, display, lines) from None
    finally:
        loader.dispose()
    expanded = expanded_size(document)
    if expanded > MAX_EXPANDED_VALUES:
        raise InputError(f"aliases expand this document to {expanded} values; more than "
                         f"{MAX_EXPANDED_VALUES} is refused", file=display)
    return document


def _yaml_error(exc: BaseException, display: str, lines: bool) -> InputError:
    if isinstance(exc, RecursionError):
        return InputError("YAML nested too deeply", file=display)
    if isinstance(exc, NestedTooDeeply):
        return InputError(f"YAML nested too deeply (more than {MAX_NESTING} levels)",
                          file=display, line=exc.problem_mark.line + 1 if lines else None)
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark and lines else None
        problem = exc.problem or exc.context or "invalid YAML"
        return InputError(f"invalid YAML: {problem}", file=display, line=line)
    return InputError(f"invalid YAML: {str(exc).splitlines()[0] if str(exc) else 'error'}",
                      file=display)


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
