"""Shards 0, 1 of the cross-check sweep on TE's own Python (tests/te_cpu_sweep.py)."""

from __future__ import annotations

import pytest

from te_cpu_sweep import check_shard, needs_te_and_megatron


@pytest.mark.parametrize("index", [0, 1])
def test_every_file_of_the_shard_matches_on_tes_own_python(index):
    check_shard(index)


pytestmark = needs_te_and_megatron


def test_the_sweep_covers_the_bundled_configs_and_sixty_corpus_files():
    from te_cpu_sweep import SHARDS, corpus_selection, every_file, shard

    corpus = corpus_selection()
    assert len(corpus) >= 60
    assert any("hybrid__" in path for path in corpus) and any("t5__" in path for path in corpus)
    assert sorted(sum((shard(i) for i in range(SHARDS)), [])) == sorted(every_file())
