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
from qaudit.load.yamlio import YamlList, YamlMap

MAX_DEPTH = 32


def document_of(obj: Any) -> YamlMap:
    """The document for `obj`: a ConfigContainer as is; a provider or TransformerConfig (or a
    mapping of its fields) under `model:` of a container."""
    node = _node(obj, 0)
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


def _node(value: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise InputError("config object nested too deeply (a cycle?)", file=label_of(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    kind = type(value)
    if kind.__name__ == "dtype" and kind.__module__ == "torch":
        return _lined({"_call_": False, "_target_": str(value)})  # "torch.bfloat16"
    if isinstance(value, enum.Enum):
        return _lined({"_call_": True, "_target_": _target(value), "_name_": value.name})
    if isinstance(value, dict):
        return _lined({str(k): _node(v, depth + 1) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return YamlList((_node(v, depth + 1) for v in value), line=None)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = {"_target_": _target(value)}
        for field in dataclasses.fields(value):
            if not field.name.startswith("__"):
                items[field.name] = _node(getattr(value, field.name, None), depth + 1)
        return _lined(items)
    if callable(value):
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", "")
        module = getattr(value, "__module__", None) or ""
        return _lined({"_call_": False, "_target_": f"{module}.{name}" if module else name})
    if hasattr(value, "__dict__"):  # a plain object with attributes (e.g. a RecipeConfig)
        items = {"_target_": _target(value)}
        for name, item in vars(value).items():
            if not name.startswith("_"):
                items[name] = _node(item, depth + 1)
        return _lined(items)
    return str(value)


def _lined(items: dict[str, Any]) -> YamlMap:
    result = YamlMap(items, line=None)
    result.key_lines = {k: None for k in items}
    return result
