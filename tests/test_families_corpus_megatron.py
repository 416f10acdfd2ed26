"""Megatron-LM's hybrid and T5 corpus files through --cross-check, a training run each (slow). The
family corpus is split in two files so that neither runs for more than a few minutes; the
other half is tests/test_families_corpus_bridge.py, the lists and helpers are in
tests/test_crosscheck_families.py."""

from __future__ import annotations

import os

import pytest

from test_crosscheck_families import (CORPUS, MEGATRON_FILES, T5_FILES, ULTRA_FILE, check_corpus_file,
                                      hybrid_megatron)  # noqa: F401 (a fixture)


# The TE-side sweep (tests/te_cpu_sweep.py) cross-checks every other hybrid and T5 file (the
# even places) with the same Megatron and comparison on TE's own Python: here the odd places,
# and every file when that sweep cannot run (no TE fetched).
TE_SIDE_RUNS = bool(os.environ.get("QAUDIT_TEST_TE_DIRS"))


def standin_files() -> list[str]:
    step = (lambda files: files[1::2]) if TE_SIDE_RUNS else (lambda files: files)
    return [f"megatron/{n}" for n in step(MEGATRON_FILES) + (ULTRA_FILE,) + step(T5_FILES)]


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", standin_files())
def test_hybrid_corpus_file_cross_checks(hybrid_megatron, monkeypatch, capsys, name):
    check_corpus_file(monkeypatch, capsys, name)


def test_every_family_file_is_cross_checked_on_one_side_or_both():
    """A file left out here is one the TE-side sweep cross-checks (tests/te_cpu_sweep.py)."""
    from te_cpu_sweep import corpus_selection

    te_side = {str(CORPUS / "megatron" / name) for name in MEGATRON_FILES + T5_FILES} \
        & set(corpus_selection())
    every = {f"megatron/{n}" for n in MEGATRON_FILES + (ULTRA_FILE,) + T5_FILES}
    left_out = every - set(standin_files())
    assert not left_out or TE_SIDE_RUNS
    assert {str(CORPUS / name) for name in left_out} <= te_side
