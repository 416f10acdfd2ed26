"""The only form in which anything crosses from the cross-check worker to qaudit's process:
JSON text of kinds, strings, numbers, lists and the dataclasses the caller names, rebuilt by
qaudit (docs/security.md, "The user's Megatron is fenced off").

Never pickle: unpickling runs whatever `__reduce__` the sender chose (a subclass of a qaudit
error defined by the user's Megatron could exit qaudit with 0, run code in it or hang it) and
imports the sender's modules. Here decoding builds only `dict`, `list`, `str`, numbers, `bool`,
`None` and instances of the named dataclasses, each field checked against its annotation.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Iterable

# A result is a module table and a run's records: far under this on the largest corpus model;
# a worker sending more is refused before its bytes are read further.
MAX_RESULT_BYTES = 64 << 20
_MAX_DEPTH = 40
# What JSON would build is counted before it is built: every `[` and `{` is a container and
# every `,` one more element (inside strings too, so the count only errs high). 64 MiB of `[]`
# was 22 million empty lists, 3.4 GB and 20 s of CPU in qaudit's process; with these bounds a
# payload that passes builds at most a few hundred MB.
MAX_CONTAINERS = 1_000_000
MAX_ELEMENTS = 4_000_000

_RECORD, _TUPLE, _MAP = "record", "tuple", "map"


class NotPlain(ValueError):
    """What was to cross is not qaudit's plain data."""


def encode(value: Any, kinds: Iterable[type]) -> bytes:
    """`value` as JSON bytes; raises NotPlain for anything but plain values and `kinds`."""
    named = {kind.__name__: kind for kind in kinds}
    text = json.dumps(_plain(value, named, 0), ensure_ascii=True, allow_nan=True)
    return text.encode("ascii")


def decode(payload: bytes, kinds: Iterable[type]) -> Any:
    """The value `encode` wrote, rebuilt; raises NotPlain for anything else."""
    if len(payload) > MAX_RESULT_BYTES:
        raise NotPlain(f"{len(payload)} bytes, over the {MAX_RESULT_BYTES} a result may have")
    containers = payload.count(b"[") + payload.count(b"{")
    if containers > MAX_CONTAINERS:
        raise NotPlain(f"over {MAX_CONTAINERS} lists and objects")
    if payload.count(b",") > MAX_ELEMENTS:
        raise NotPlain(f"over {MAX_ELEMENTS} elements")
    named = {kind.__name__: kind for kind in kinds}
    try:
        tree = json.loads(payload.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotPlain(f"not JSON: {type(exc).__name__}") from None
    return _rebuild(tree, named, 0)


def _plain(value: Any, named: dict[str, type], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise NotPlain("nested too deep")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        return [_plain(item, named, depth + 1) for item in value]
    if type(value) is tuple:
        return {_TUPLE: [_plain(item, named, depth + 1) for item in value]}
    if type(value) is dict:
        return {_MAP: [[_plain(key, named, depth + 1), _plain(item, named, depth + 1)]
                       for key, item in value.items()]}
    kind = type(value)
    if dataclasses.is_dataclass(value) and named.get(kind.__name__) is kind:
        return {_RECORD: kind.__name__,
                "fields": {field.name: _plain(getattr(value, field.name), named, depth + 1)
                           for field in dataclasses.fields(kind)}}
    raise NotPlain(f"a {kind.__name__} is not plain data")


def _rebuild(tree: Any, named: dict[str, type], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise NotPlain("nested too deep")
    if tree is None or type(tree) in (bool, int, float, str):
        return tree
    if type(tree) is list:
        return [_rebuild(item, named, depth + 1) for item in tree]
    if type(tree) is not dict or len(tree) not in (1, 2):
        raise NotPlain("an object of no known shape")
    if set(tree) == {_TUPLE} and type(tree[_TUPLE]) is list:
        return tuple(_rebuild(item, named, depth + 1) for item in tree[_TUPLE])
    if set(tree) == {_MAP} and type(tree[_MAP]) is list:
        pairs = tree[_MAP]
        if not all(type(pair) is list and len(pair) == 2 for pair in pairs):
            raise NotPlain("a map entry is not a pair")
        rebuilt = {}
        for key, item in pairs:
            key = _rebuild(key, named, depth + 1)
            if type(key) not in (str, int, float, bool, tuple) and key is not None \
                    or not _hashable(key):  # a tuple may hold a list
                raise NotPlain("a map key is not hashable plain data")
            rebuilt[key] = _rebuild(item, named, depth + 1)
        return rebuilt
    if set(tree) == {_RECORD, "fields"} and type(tree["fields"]) is dict:
        return _record(tree[_RECORD], tree["fields"], named, depth)
    raise NotPlain("an object of no known shape")


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _record(name: Any, values: dict, named: dict[str, type], depth: int) -> Any:
    kind = named.get(name) if type(name) is str else None
    if kind is None:
        raise NotPlain(f"a record of an unnamed kind {str(name)[:80]!r}")
    fields = {field.name: field for field in dataclasses.fields(kind)}
    if not set(values) <= set(fields):
        raise NotPlain(f"{name} has no field(s) {sorted(set(values) - set(fields))[:5]}")
    hints = typing.get_type_hints(kind)
    rebuilt = {}
    for key, raw in values.items():
        value = _rebuild(raw, named, depth + 1)
        if not _conforms(value, hints[key]):
            raise NotPlain(f"{name}.{key} is not a {hints[key]}")
        rebuilt[key] = value
    try:
        return kind(**rebuilt)
    except TypeError as exc:  # a required field missing
        raise NotPlain(f"{name}: {exc}") from None


def _conforms(value: Any, hint: Any) -> bool:
    """`value` is of the annotated type (the shapes qaudit's records use)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, option) for option in arguments)
    if hint is type(None) or hint is None:
        return value is None
    if hint is float:
        return type(value) in (int, float)
    if origin is None:
        return type(value) is hint
    if origin is list:
        return type(value) is list and all(_conforms(item, arguments[0]) for item in value)
    if origin is tuple:
        if type(value) is not tuple:
            return False
        if len(arguments) == 2 and arguments[1] is Ellipsis:
            return all(_conforms(item, arguments[0]) for item in value)
        return len(value) == len(arguments) and all(
            _conforms(item, option) for item, option in zip(value, arguments))
    if origin is dict:
        return type(value) is dict and all(
            _conforms(key, arguments[0]) and _conforms(item, arguments[1])
            for key, item in value.items())
    return False
