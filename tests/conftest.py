from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


@pytest.fixture
def write_yaml(tmp_path: Path):
    """Write dedented YAML text to tmp_path/name and return the path as a string."""

    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return str(path)

    return write


@pytest.fixture
def repo_configs() -> Path:
    return CONFIGS
