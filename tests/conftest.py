from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

# Fixtures shared by the tests that read a real Megatron (megatron, forget_megatron).
pytest_plugins = ["megatron_env"]

REPO = Path(__file__).resolve().parent.parent
# One torch thread per process, here and in every process a test starts (they inherit it):
# pytest-xdist already runs a worker per core, so torch's own intra-op threads only
# oversubscribe the cores, and idle ones spin. On the busy 2-core machine TE's case matrix
# (tests/te_standin.py) took 7x the CPU time with two. A value set by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode is kept for the hundreds of Python processes the tests start (`python -m qaudit`,
# the guard's jobs): on a machine set to write none (PYTHONDONTWRITEBYTECODE, as this
# project's machines are), each of them compiled qaudit's modules afresh, about 0.15 s of CPU
# a process. It goes under .cache/ (git ignores it), never beside the sources; a prefix the
# caller chose is kept.
os.environ.setdefault("PYTHONPYCACHEPREFIX", str(REPO / ".cache" / "pycache"))
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
sys.dont_write_bytecode = False
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


@pytest.fixture(autouse=True)
def _auto_runtime_is_reference(request, monkeypatch):
    """Golden files and expectations are the reference runtime's: on a machine with TE and
    CUDA, `--runtime auto` would pick te. Tests marked `gpu` choose their runtime themselves."""
    if request.node.get_closest_marker("gpu") is None:
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is not None:
            monkeypatch.setattr("qaudit.runtime.te_unavailable_reason",
                                lambda device=None: "pinned to reference for the CPU test suite")
            monkeypatch.setattr("qaudit.runtime.te_installed", lambda: False)


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true",
                     help="Also run tests marked slow (corpus, torchrun, whole-model "
                          "cross-checks, real-size audits); CI runs them.")
    parser.addoption("--regen-goldens", action="store_true",
                     help="Rewrite tests/golden/ with the CLI first (minutes), then run the "
                          "tests against the new files; read git diff tests/golden after.")


def pytest_sessionstart(session):
    if session.config.getoption("--regen-goldens"):
        from goldens import regenerate

        for line in regenerate():
            print(f"regenerated {line}")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or config.getoption("-m"):
        return  # asked for everything, or chose with -m
    skip = pytest.mark.skip(reason="slow: run with --run-slow (CI does)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
