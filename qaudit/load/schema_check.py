"""Checking a JSON document against one of qaudit's shipped JSON Schemas, without jsonschema.

qaudit reads back its own reports (`qaudit diff`) and baselines (`--baseline`); a hand-edited
or hostile file must be refused with the key that is wrong, not crash later. The schemas in
`qaudit/schemas/` stay the single description of those files: this interprets the subset of
JSON Schema 2020-12 they use (`SUPPORTED`), and the tests check that nothing else appears in
them.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

# Keywords this checker applies; annotations are read and ignored.
SUPPORTED = frozenset({"type", "required", "properties", "additionalProperties", "items",
                       "const", "enum", "minimum", "maximum", "pattern", "$ref", "allOf"})
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description"})
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


class SchemaViolation(Exception):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.message = message


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    return json.loads(resources.files("qaudit").joinpath("schemas", name).read_text("utf-8"))


def check(document: Any, schema: dict) -> None:
    """Raise SchemaViolation (where: a JSON path like `findings[3].severity`) on the first
    value the schema does not accept."""
    _check(document, schema, schema, "")


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else \
        ("an object" if isinstance(value, dict) else "an array")
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    for name, test in _TYPES.items():
        if name != "number" and test(value):
            return name
    return "number"


def _child(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _check(value: Any, schema: dict, root: dict, where: str) -> None:
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, where)
    for part in schema.get("allOf", ()):
        _check(value, part, root, where)
    if "const" in schema and value != schema["const"]:
        raise SchemaViolation(where, f"expected {json.dumps(schema['const'])}, got {_shown(value)}")
    if "enum" in schema and not any(value == v and type(value) is type(v) for v in schema["enum"]):
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        raise SchemaViolation(where, f"expected one of {allowed}, got {_shown(value)}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            got = _shown(value) if value is None or isinstance(value, (dict, list)) \
                else f"{_type_name(value)} {_shown(value)}"
            raise SchemaViolation(where, f"expected {' or '.join(types)}, got {got}")
    if "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        raise SchemaViolation(where, f"must be >= {schema['minimum']}, got {_shown(value)}")
    if "maximum" in schema and _TYPES["number"](value) and value > schema["maximum"]:
        raise SchemaViolation(where, f"must be <= {schema['maximum']}, got {_shown(value)}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        raise SchemaViolation(where, f"does not match {schema['pattern']}: {_shown(value)}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                raise SchemaViolation(_child(where, key), "required key is missing")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                _check(item, properties[key], root, _child(where, key))
            elif isinstance(extra, dict):
                _check(item, extra, root, _child(where, key))
            elif extra is False:
                raise SchemaViolation(_child(where, key), "unknown key")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _check(item, schema["items"], root, _child(where, index))


def _resolve(ref: str, root: dict) -> dict:
    if not ref.startswith("#/"):
        raise ValueError(f"only local $ref are supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def keywords(schema: Any) -> set[str]:
    """Every keyword used anywhere in a schema (for the test that SUPPORTED covers them)."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            found.add(key)
            if key in ("properties", "$defs"):
                for sub in value.values():
                    found |= keywords(sub)
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                found |= keywords(value)
            elif key == "allOf":
                for sub in value:
                    found |= keywords(sub)
    return found
