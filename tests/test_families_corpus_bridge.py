"""Megatron-Bridge's hybrid dumps through --cross-check, a training run each (slow). The
family corpus is split in two files so that neither runs for more than a few minutes; the
other half is tests/test_families_corpus_megatron.py, the lists and helpers are in
tests/test_crosscheck_families.py."""

from __future__ import annotations

import pytest

from test_crosscheck_families import (CORPUS, _bridge_files, check_corpus_file, hybrid_megatron)  # noqa: F401 (a fixture)


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", _bridge_files())
def test_hybrid_corpus_file_cross_checks(hybrid_megatron, monkeypatch, capsys, name):
    check_corpus_file(monkeypatch, capsys, name)
