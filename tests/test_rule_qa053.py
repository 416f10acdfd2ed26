"""QA053 (Megatron-LM #6660): Megatron-FSDP with sharded gradients reduces every backward,
whatever a buffer's data-parallel group size, in every Megatron qaudit knows (PR #6773's fix
came later). A warning on the sharded strategies only; the line it quotes is checked against
the unpacked megatron-core."""

from __future__ import annotations

import re

import pytest

from qaudit.commands.check import audit_files
from qaudit.judge.rules.qa053_fsdp_single_rank_doubling import EVERY_BPROP_LINES
from qaudit.run.options import AuditOptions

GPT = ("num_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\nuse_megatron_fsdp: true\n")


@pytest.fixture
def qa053(write_yaml):
    def run(config: str, megatron: str = "0.19.2"):
        report = audit_files(write_yaml("config.yaml", config), None,
                             AuditOptions(megatron=megatron, steps=1, microbatches=2))
        return [f for f in report.findings if f.rule == "QA053"]
    return run


@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
@pytest.mark.parametrize("megatron,lines", [("0.16.1", ":656 and :773"),
                                            ("0.19.2", ":755 and :862"),
                                            ("main", ":761 and :879")])
def test_fires_on_the_sharded_strategies(qa053, strategy, megatron, lines):
    found = qa053(GPT + f"data_parallel_sharding_strategy: {strategy}\n", megatron)
    assert len(found) == 1 and found[0].severity == "warning" and found[0].line == 5
    assert "#6660" in found[0].message and "#6773" in found[0].fix
    assert f"megatron_fsdp.py{lines}" in found[0].evidence


def test_silent_without_sharded_gradients(qa053):
    assert qa053(GPT + "data_parallel_sharding_strategy: optim\n") == []
    assert qa053(GPT + "data_parallel_sharding_strategy: no_shard\n") == []
    assert qa053("num_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\n") == []


def test_the_installed_megatron_decides_from_the_strategy_alone(megatron):
    """QAUDIT_TEST_MEGATRON_CORE (0.19.2): both decisions are at the lines the evidence
    quotes and read the strategy only, not the group size (PR #6773's condition)."""
    source = (megatron / "megatron/core/distributed/fsdp/src/megatron_fsdp/"
              "megatron_fsdp.py").read_text().splitlines()
    at = [n for n, text in enumerate(source, 1) if "grad_reduce_every_bprop = " in text]
    assert tuple(at) == EVERY_BPROP_LINES[(0, 19)]
    for n in at:
        decision = " ".join(source[n - 1:n + 3])
        assert re.search(r'in \[\s*"optim_grads",\s*"optim_grads_params",\s*\]', decision)
        assert "size()" not in decision
