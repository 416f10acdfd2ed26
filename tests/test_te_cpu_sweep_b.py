"""Shards 2, 3 of the cross-check sweep on TE's own Python (tests/te_cpu_sweep.py)."""

from __future__ import annotations

import pytest

from te_cpu_sweep import check_shard, needs_te_and_megatron


@pytest.mark.parametrize("index", [2, 3])
def test_every_file_of_the_shard_matches_on_tes_own_python(index):
    check_shard(index)


pytestmark = needs_te_and_megatron
