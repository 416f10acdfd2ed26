"""A serialized RecipeConfig (placeholder)."""

from __future__ import annotations

from typing import Any


def recipe_from_node(node: Any, file: str, line: int | None):
    return None
