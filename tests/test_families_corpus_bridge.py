"""Megatron-Bridge's hybrid dumps through --cross-check, a training run each (slow). The
family corpus is split in two files so that neither runs for more than a few minutes; the
other half is tests/test_families_corpus_megatron.py, the lists and helpers are in
tests/test_crosscheck_families.py.

Dumps that differ only where qaudit's reader takes nothing (the GPU's environment variables,
batch sizes, logging, checkpointing) give the cross-check the same input, and so the same
build, run and comparison: one dump per distinct input is cross-checked (the first in name
order; 32 of Bridge's 64 hybrid dumps), every dump is still audited (tests/test_bridge_corpus.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from test_crosscheck_families import (CORPUS, _bridge_files, check_corpus_file, hybrid_megatron)  # noqa: F401 (a fixture)

# Where a value was read, not what it is.
_WHERE = frozenset({"file", "path", "line", "lines", "origins"})


def _canonical(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in _WHERE}
    if isinstance(value, Mapping):
        return {str(key): _canonical(item) for key, item in value.items() if key not in _WHERE}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return repr(value)


def cross_check_input(name: str) -> str:
    """Everything the cross-check is given for the dump `name`: the model config qaudit's
    reader produced (the fields upstream is built from among them) and the quant recipe,
    without the file and line each value came from."""
    from qaudit.commands.check import load_inputs

    config, recipe = load_inputs(str(CORPUS / name))
    serialized = recipe is not None and recipe.file == config.file
    return json.dumps([_canonical(config), _canonical(recipe), serialized], sort_keys=True)


@functools.cache
def cross_check_groups() -> dict[str, list[str]]:
    """The hybrid dumps by cross-check input, each group in name order."""
    groups: dict[str, list[str]] = {}
    for name in _bridge_files():
        groups.setdefault(cross_check_input(name), []).append(name)
    return groups


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ != "test_hybrid_corpus_file_cross_checks":
        return
    # Reading every dump costs seconds: only where the slow tests run (skipped otherwise).
    everything = metafunc.config.getoption("--run-slow") or metafunc.config.getoption("-m")
    names = ([members[0] for members in cross_check_groups().values()]
             if everything and CORPUS.is_dir() else _bridge_files())
    metafunc.parametrize("name", names)


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
def test_hybrid_corpus_file_cross_checks(hybrid_megatron, monkeypatch, capsys, name):
    check_corpus_file(monkeypatch, capsys, name)


_PRECISION = re.compile(r"_(bf16|fp8cs|fp8mx|nvfp4)_")


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
def test_one_dump_per_cross_check_input_stands_for_the_others():
    """The grouping sees what tells dumps apart: never two models, two precision recipes or
    Megatron-FSDP and not in one group; every dump in exactly one."""
    groups = cross_check_groups()
    members = [name for group in groups.values() for name in group]
    assert sorted(members) == sorted(_bridge_files())
    assert 30 <= len(groups) < len(members)
    for group in groups.values():
        stems = [Path(name).name for name in group]
        assert len({stem.split("_pretrain")[0] for stem in stems}) == 1, group
        assert len({m.group(1) for stem in stems if (m := _PRECISION.search(stem))}) <= 1, group
        assert len({"fsdp" in stem for stem in stems}) == 1, group
