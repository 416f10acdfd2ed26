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


# The tests that take minutes, longest first (CI's --durations on an idle 2-core machine:
# the TE-side sweep's shards 91-148 s each, TE's own modules per release 31-94 s, the
# Nemotron-3 Ultra cross-check 62 s). In collection order they came last, and for minutes
# one worker ran them alone while the other had finished.
LONGEST_FIRST = ("tests/test_te_cpu_sweep_b.py", "tests/test_te_cpu_sweep_a.py",
                 "tests/test_te_standin.py", "tests/test_families_corpus_megatron.py",
                 "tests/test_guard_pretrain.py", "tests/test_guard_run.py",
                 "tests/test_crosscheck_te_cpu.py")


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle, which it keeps within a rank
def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or config.getoption("-m"):
        rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
        return  # asked for everything, or chose with -m
    skip = pytest.mark.skip(reason="slow: run with --run-slow (CI does)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


def pytest_configure(config):
    # pytest-xdist hands out tests in the order above, one at a time as a worker frees up
    # (its default sends a quarter of a worker's share at once: the longest would all have
    # gone to one worker). A chunk size the caller chose is kept.
    if getattr(config.option, "maxschedchunk", "absent") is None:
        config.option.maxschedchunk = 1
