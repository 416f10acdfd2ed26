"""Reading back a JSON file qaudit wrote (a report, a baseline): bounded, parsed, schema checked."""

from __future__ import annotations

import json
import os

from qaudit.errors import InputError
from qaudit.files.paths import unreadable
from qaudit.load.schema_check import SchemaViolation, check, load_schema

MAX_DIGITS = 100  # integers in our files are counts and line numbers


class _Refused(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"an integer with more than {MAX_DIGITS} digits")
    return int(text)


def read_qaudit_json(path: str, *, kind: str, schema: str, schema_file: str, max_bytes: int,
                     not_found: str) -> dict:
    """The top-level object of `path`, checked against `schema_file` (qaudit/schemas/);
    anything else is an InputError (exit 2) naming the file and the line of a JSON syntax
    error or the key that is wrong. `kind` names the file in messages."""
    problem = unreadable(path)
    if problem == "not found":
        raise InputError(not_found, file=path)
    if problem:
        raise InputError(f"cannot read the {kind}: {problem}", file=path)
    try:
        if os.path.getsize(path) > max_bytes:
            raise InputError(f"{kind} file is larger than {max_bytes // 2**20} MiB", file=path)
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"cannot read the {kind}: {exc.strerror or exc}", file=path) from None
    try:
        data = json.loads(raw.decode("utf-8"), parse_int=_parse_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a qaudit {kind} (invalid JSON: {exc})", file=path,
                         line=getattr(exc, "lineno", None)) from None
    except _Refused as exc:
        raise InputError(f"not a qaudit {kind}: it holds {exc}", file=path) from None
    except RecursionError:
        raise InputError(f"not a qaudit {kind}: nested too deeply", file=path) from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise InputError(f"not a qaudit {kind} (expected \"schema\": \"{schema}\")", file=path,
                         key="schema")
    try:
        check(data, load_schema(schema_file))
    except SchemaViolation as exc:
        raise InputError(f"not a valid qaudit {kind}: {exc.message}", file=path,
                         key=exc.where or None) from None
    return data
