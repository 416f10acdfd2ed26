"""Megatron-LM's hybrid and T5 corpus files through --cross-check, a training run each (slow). The
family corpus is split in two files so that neither runs for more than a few minutes; the
other half is tests/test_families_corpus_bridge.py, the lists and helpers are in
tests/test_crosscheck_families.py."""

from __future__ import annotations

import pytest

from test_crosscheck_families import (CORPUS, MEGATRON_FILES, T5_FILES, ULTRA_FILE, check_corpus_file,
                                      hybrid_megatron)  # noqa: F401 (a fixture)


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", [f"megatron/{n}" for n in MEGATRON_FILES + (ULTRA_FILE,) + T5_FILES])
def test_hybrid_corpus_file_cross_checks(hybrid_megatron, monkeypatch, capsys, name):
    check_corpus_file(monkeypatch, capsys, name)
