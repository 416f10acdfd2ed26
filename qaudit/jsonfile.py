"""Reading back a JSON file qaudit wrote (a report, a baseline): bounded, parsed, schema checked."""

from __future__ import annotations

import json
from pathlib import Path

from qaudit.errors import InputError


def read_qaudit_json(path: str, *, kind: str, schema: str, max_bytes: int,
                     not_found: str) -> dict:
    """The top-level object of `path`; anything else is an InputError (exit 2) naming the file,
    the line of a JSON syntax error, or the `schema` key. `kind` names the file in messages."""
    file = Path(path)
    if not file.is_file():
        raise InputError(not_found, file=path)
    if file.stat().st_size > max_bytes:
        raise InputError(f"{kind} file is larger than {max_bytes // 2**20} MiB", file=path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a qaudit {kind} (invalid JSON: {exc})", file=path,
                         line=getattr(exc, "lineno", None)) from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise InputError(f"not a qaudit {kind} (expected \"schema\": \"{schema}\")", file=path,
                         key="schema")
    return data
