"""A live config object (a Bridge ConfigContainer, a model provider or TransformerConfig, or
a plain mapping) as the YAML document Bridge's `to_yaml()` would write for it, so that the one
reader audits it. Attributes are read; nothing is imported, called or resolved: a dtype, a
function or an enum member becomes the same `_target_` node Bridge writes, by its type's
module and name.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from qaudit.errors import InputError
from qaudit.load.yamlio import MAX_EXPANDED_VALUES, YamlList, YamlMap

MAX_DEPTH = 32


def document_of(obj: Any) -> YamlMap:
    """The document for `obj`: a ConfigContainer as is; a provider or TransformerConfig (or a
    mapping of its fields) under `model:` of a container."""
    node = _Reader(label_of(obj)).node(obj, "", 0)
    if not isinstance(node, YamlMap):
        raise InputError(f"expected a ConfigContainer, a model provider / TransformerConfig or "
                         f"a mapping, got {type(obj).__name__}", file=label_of(obj))
    target = node.get("_target_")
    if isinstance(target, str) and target.rsplit(".", 1)[-1].endswith("ConfigContainer"):
        return node
    if "model" in node and isinstance(node["model"], YamlMap):
        wrapped = YamlMap(node, line=None)
        wrapped.key_lines = {k: None for k in node}
    else:
        wrapped = YamlMap({"model": node}, line=None)
        wrapped.key_lines = {"model": None}
    wrapped["_target_"] = "qaudit.api.ConfigContainer"
    return wrapped


def label_of(obj: Any) -> str:
    return f"<{type(obj).__name__} object>"


def _target(value: Any) -> str:
    kind = value if isinstance(value, type) else type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


class _Reader:
    """Reads one object. An object reached twice (a list shared by many fields) becomes one
    node, as a YAML alias does, and each reach counts its values again: the document's
    expanded size is bounded by the YAML route's cap in time linear in what is read. The
    caller's code that runs while reading (properties, `__getattribute__`, `items()`,
    `__iter__`, `__str__`) may raise: that is an InputError naming the attribute."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.values = 0
        # id -> (the object, kept alive so its id stays its own; its node; its values)
        self.seen: dict[int, tuple[Any, Any, int]] = {}

    def spend(self, count: int, path: str) -> None:
        self.values += count
        if self.values > MAX_EXPANDED_VALUES:
            raise InputError(f"the object expands to more than {MAX_EXPANDED_VALUES} values "
                             "(shared lists and objects counted each time they are reached); "
                             "refused, as for a YAML file", file=self.label, key=path or None)

    def node(self, value: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise InputError("config object nested too deeply (a cycle?)", file=self.label,
                             key=path or None)
        if value is None or type(value) in (bool, int, float, str):
            self.spend(1, path)
            return value
        known = self.seen.get(id(value))
        if known is not None and known[0] is value:
            self.spend(known[2], path)
            return known[1]
        before = self.values
        try:
            node = self._read(value, path, depth)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - the caller's own code, whatever it raises
            raise InputError(f"reading {path or 'the object'} raised {type(exc).__name__}: "
                             f"{exc}", file=self.label, key=path or None) from None
        self.spend(1, path)
        self.seen[id(value)] = (value, node, self.values - before)
        return node

    def _read(self, value: Any, path: str, depth: int) -> Any:
        def child(name: Any) -> str:
            return f"{path}.{name}" if path else str(name)

        if isinstance(value, (bool, int, float, str)):  # subclasses: their plain value
            return value
        kind = type(value)
        if kind.__name__ == "dtype" and kind.__module__ == "torch":
            return _lined({"_call_": False, "_target_": str(value)})  # "torch.bfloat16"
        if isinstance(value, enum.Enum):
            return _lined({"_call_": True, "_target_": _target(value), "_name_": value.name})
        if isinstance(value, dict):
            items = {}
            for k, v in value.items():
                items[str(k)] = self.node(v, child(k), depth + 1)
            return _lined(items)
        if isinstance(value, (list, tuple)):
            return YamlList([self.node(v, f"{path}[{i}]", depth + 1)
                             for i, v in enumerate(value)], line=None)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            items = {"_target_": _target(value)}
            for field in dataclasses.fields(value):
                if not field.name.startswith("__"):
                    name = child(field.name)
                    items[field.name] = self.node(self._attribute(value, field.name, name),
                                                  name, depth + 1)
            return _lined(items)
        if callable(value):
            name = getattr(value, "__qualname__", None) or getattr(value, "__name__", "")
            module = getattr(value, "__module__", None) or ""
            return _lined({"_call_": False, "_target_": f"{module}.{name}" if module else name})
        if hasattr(value, "__dict__"):  # a plain object with attributes (e.g. a RecipeConfig)
            items = {"_target_": _target(value)}
            for name, item in vars(value).items():
                if isinstance(name, str) and not name.startswith("_"):
                    items[name] = self.node(item, child(name), depth + 1)
            return _lined(items)
        return str(value)

    def _attribute(self, value: Any, name: str, path: str) -> Any:
        try:
            return getattr(value, name, None)
        except Exception as exc:  # noqa: BLE001 - a property of the caller's class
            raise InputError(f"reading {path} raised {type(exc).__name__}: {exc}",
                             file=self.label, key=path) from None


def _lined(items: dict[str, Any]) -> YamlMap:
    result = YamlMap(items, line=None)
    result.key_lines = {k: None for k in items}
    return result
