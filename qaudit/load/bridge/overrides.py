"""Overrides, applied as Bridge applies them (placeholder until the merge is written)."""

from __future__ import annotations

from typing import Sequence

from qaudit.load.yamlio import YamlMap


def apply_overrides(document: YamlMap, display: str, overrides: Sequence[str]):
    return {}, set()
