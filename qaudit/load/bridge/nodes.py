"""`_target_` / `_call_` / `_partial_` nodes of a Bridge YAML, read as data.

Bridge's `ConfigContainer.to_yaml()` writes each dataclass as a mapping with `_target_` (its
class path), a dtype or function as `{_call_: false, _target_: torch.bfloat16}`, an enum member
as `{_call_: true, _target_: ...CudaGraphModule, _name_: attn, _args_: [1]}`. The target's name
is only ever looked at: nothing is imported or called.
"""

from __future__ import annotations

from typing import Any

from qaudit.load.yamlio import YamlList, YamlMap

NODE_KEYS = ("_target_", "_call_", "_partial_", "_args_", "_name_")


def target_of(value: Any) -> str | None:
    """The class or function path a node names, or None for a plain value."""
    if isinstance(value, dict) and isinstance(value.get("_target_"), str):
        return value["_target_"]
    return None


def short_name(target: str) -> str:
    return target.rsplit(".", 1)[-1]


def is_reference(value: Any) -> bool:
    """A node that stands for an object (a dtype, a function, an enum member), not a
    dataclass with fields of its own."""
    if target_of(value) is None:
        return False
    return all(key in NODE_KEYS for key in value)


def plain(value: Any) -> Any:
    """The value as a TransformerConfig YAML would write it: a reference node becomes its
    name (`torch.bfloat16` -> "bfloat16", an enum member -> its `_name_`), a dataclass node
    loses its `_target_`, lists and mappings keep their lines."""
    if is_reference(value):
        name = value.get("_name_")
        return name if isinstance(name, str) else short_name(value["_target_"])
    if isinstance(value, YamlMap):
        result = YamlMap(line=value.line)
        for key, item in value.items():
            if key in NODE_KEYS:
                continue
            result[key] = plain(item)
            result.key_lines[key] = value.line_of(key)
        return result
    if isinstance(value, YamlList):
        return YamlList((plain(item) for item in value), line=value.line)
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
