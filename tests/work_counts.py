"""Counting calls instead of timing them: a budget a test guards is a number of nodes,
characters or calls, which a loaded machine does not change (timings live in scripts/bench*)."""

from __future__ import annotations

import functools
from typing import Any


class CallCount:
    def __init__(self) -> None:
        self.calls = 0
        self.instances: list[Any] = []


def count_calls(monkeypatch, owner: Any, name: str) -> CallCount:
    """Wrap `owner.name` (a function or method) so that every call is counted; for methods
    the receiving instances are remembered too."""
    counted = CallCount()
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        counted.calls += 1
        if args and isinstance(owner, type) and isinstance(args[0], owner):
            if not counted.instances or counted.instances[-1] is not args[0]:
                counted.instances.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return counted
