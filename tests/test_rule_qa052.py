"""QA052: a warning naming the open upstream gradient-loss thread where the config uses the
feature it is about; silent where the feature is off, or where the Megatron in effect has no
such feature (Megatron-FSDP v2 before main)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qaudit.commands.check import audit_files
from qaudit.run.options import AuditOptions

GPT = "num_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\n"
LAUNCH = ("torchrun pretrain_gpt.py \\\n  --num-layers 2 --hidden-size 256 "
          "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 \\\n"
          "  --micro-batch-size 1 --global-batch-size 8 {flags}\n")


@pytest.fixture
def qa052(tmp_path):
    def run(text: str, name: str = "config.yaml", megatron: str = "0.19.2"):
        path = tmp_path / name
        path.write_text(text)
        report = audit_files(str(path), None,
                             AuditOptions(megatron=megatron, steps=1, microbatches=2))
        return [f for f in report.findings if f.rule == "QA052"]
    return run


def test_gtp_with_mtp_names_pr_7573(qa052):
    found = qa052(LAUNCH.format(flags="--mtp-num-layers 1 --tensor-parallel-num-weight-shards 2"),
                  "train.sh")
    assert len(found) == 1 and found[0].severity == "warning"
    assert found[0].message.startswith("Megatron-LM PR #7573 (open)")
    assert found[0].line == 3 and "qaudit guard" in found[0].fix
    assert qa052(LAUNCH.format(flags="--tensor-parallel-num-weight-shards 2"), "train.sh") == []
    assert qa052(LAUNCH.format(flags="--mtp-num-layers 1"), "train.sh") == []


@pytest.mark.parametrize("flags,thread", [
    ("--delay-wgrad-compute", "PR #6697"),
    ("--num-distributed-optimizer-instances 2", "PR #7186"),
])
def test_megatron_fsdp_v2_threads_on_main_only(qa052, flags, thread):
    v2 = LAUNCH.format(flags=f"--use-megatron-fsdp --megatron-fsdp-version 2 {flags}")
    found = [f for f in qa052(v2, "train.sh", megatron="main") if thread in f.message]
    assert len(found) == 1 and "Megatron-FSDP v2" in found[0].message
    assert found[0].line == 3
    # megatron-core 0.19.2 has no Megatron-FSDP v2; v1 has neither path.
    assert not [f for f in qa052(v2, "train.sh") if thread in f.message]
    v1 = LAUNCH.format(flags=f"--use-megatron-fsdp {flags}")
    assert not [f for f in qa052(v1, "train.sh", megatron="main") if thread in f.message]


def test_bridge_mtp_names_issue_6103_and_a_plain_yaml_does_not(qa052, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    report = audit_files("configs/bridge-lightning-mtp-bf16.yaml", None,
                         AuditOptions(steps=1, microbatches=2))
    found = [f for f in report.findings if f.rule == "QA052"]
    assert len(found) == 1 and "Megatron-Bridge issue #6103" in found[0].message
    assert "loss_mask" in found[0].fix and "qaudit guard" not in found[0].fix
    assert qa052(GPT + "mtp_num_layers: 1\n") == []  # a TransformerConfig YAML: not Bridge


def test_tied_weights_with_delayed_wgrad_only_where_te_modules_share_the_weight(qa052):
    # The tied output layer is Megatron's own linear here: one TE user at most, so #3437's
    # shape (two TE modules on one weight) does not arise.
    assert qa052(GPT + "delay_wgrad_compute: true\ngradient_accumulation_fusion: false\n") == []


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).resolve().parent.parent
                                                        / "configs").glob("*.yaml")))
def test_no_bundled_config_but_the_bridge_mtp_dumps_names_a_thread(name, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    report = audit_files(f"configs/{name}", None, AuditOptions(steps=1, microbatches=2))
    threads = {f.message.split(":")[0] for f in report.findings if f.rule == "QA052"}
    bridge_mtp = name.startswith("bridge-") and "mtp" in name
    assert threads == ({"Megatron-Bridge issue #6103 (PR #6105, open)"} if bridge_mtp else set())
