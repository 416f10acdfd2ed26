"""Checks for config field values: each takes (key, value), returns the value to keep and
raises ValueError with what was wrong. Shared by the config's own fields (qaudit/load/config.py)
and every family's (qaudit/families/<name>/fields.py)."""

from __future__ import annotations

from typing import Any, Callable

from qaudit.load.yamlio import did_you_mean, short_repr, type_name

Check = Callable[[str, Any], Any]


def int_at_least(minimum: int) -> Check:
    def check(key: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {type_name(value)} {short_repr(value)}")
        if value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value}")
        if value > 1_000_000:
            raise ValueError(f"{value} is not a plausible size (limit 1,000,000)")
        return value
    return check


def optional(inner: Check) -> Check:
    def check(key: str, value: Any) -> Any:
        return None if value is None else inner(key, value)
    return check


def boolean(key: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {type_name(value)} {short_repr(value)}")
    return value


def choice(*choices: str, nullable: bool = False) -> Check:
    def check(key: str, value: Any) -> Any:
        if value is None and nullable:
            return None
        if not isinstance(value, str) or value not in choices:
            allowed = ", ".join(choices) + (", null" if nullable else "")
            hint = did_you_mean(value, choices) if isinstance(value, str) else ""
            raise ValueError(f"expected one of {allowed}; got {short_repr(value)}{hint}")
        return value
    return check


def string(key: str, value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"expected a path string, got {type_name(value)} {short_repr(value)}")
    return value


def ratio(key: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"expected a number from 0 to 1, got {short_repr(value)}")
    return float(value)


POSITIVE = int_at_least(1)
