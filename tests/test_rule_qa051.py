"""QA051 (TE PR #2936): grouped experts with one grouped weight through TE's op fuser under
Megatron-FSDP (overwrite_main_grad), MXFP8 and SwiGLU, on a TE whose fused grouped-MLP
backward sends that weight's gradient to a scratch buffer (2.14, 2.14.1). Only where the
Megatron in effect runs it (megatron-core 0.18.x; 0.19 refuses single grouped weights under
Megatron-FSDP). The range is checked against TE's own code where it is unpacked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qaudit.commands.check import audit_files
from qaudit.judge.rules.qa051_fused_grouped_mlp_scratch_wgrad import GUARDED_LINE, UNGUARDED_LINE
from qaudit.plan.upstream.te import TE_RELEASES, locate_te, te_behaviour
from qaudit.run.options import AuditOptions

# The stand-in releases and the extra ones read for ranges (.ci/run fetches both).
TE_DIRS = [Path(p) for name in ("QAUDIT_TEST_TE_DIRS", "QAUDIT_TEST_TE_RANGE_DIRS")
           for p in os.environ.get(name, "").split(":") if p]
BASE = ("num_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\nnum_moe_experts: 4\n"
        "moe_router_topk: 2\nmoe_grouped_gemm: true\ngated_linear_unit: true\n"
        "fp8: e4m3\nfp8_recipe: mxfp8\nuse_megatron_fsdp: true\n"
        "data_parallel_sharding_strategy: optim_grads_params\n"
        "use_transformer_engine_op_fuser: true\n")
SINGLE = "moe_single_grouped_weight: true\n"
EXPERTS = {f"decoder.layers.{i}.mlp.experts.linear_fc{j}" for i in (0, 1) for j in (1, 2)}


@pytest.fixture
def qa051(write_yaml):
    def run(config: str, te: str = "2.14", megatron: str = "0.18.2"):
        report = audit_files(write_yaml("config.yaml", config), None,
                             AuditOptions(te=te, megatron=megatron, steps=1, microbatches=2))
        return [f for f in report.findings if f.rule == "QA051"]
    return run


@pytest.mark.parametrize("te", ["2.14", "2.14.1"])
def test_fires_on_each_grouped_expert_in_the_affected_releases(qa051, te):
    found = qa051(BASE + SINGLE, te)
    assert {f.module for f in found} == EXPERTS
    assert all(f.severity == "warning" and f.line == 13 for f in found)
    assert f"Transformer Engine {te}" in found[0].message and "#2936" in found[0].message
    assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP" in found[0].message
    evidence = found[0].evidence
    assert f"backward_grouped_mlp.py:{GUARDED_LINE[te]}" in evidence
    assert "_compute_grad_params" in evidence and "in 2.15 (line 182)" in evidence
    assert "2.15" in found[0].fix


@pytest.mark.parametrize("te", ["2.13", "2.15", "2.16.1", "2.20.2", "main"])
def test_silent_before_and_after_the_affected_releases(qa051, te):
    assert qa051(BASE + SINGLE, te) == []


@pytest.mark.parametrize("megatron", ["0.19.0", "0.19.2", "main"])
def test_silent_where_megatron_refuses_single_grouped_weights_under_fsdp(qa051, megatron):
    assert qa051(BASE + SINGLE, megatron=megatron) == []


@pytest.mark.parametrize("without", ["use_megatron_fsdp: true\n", "fp8_recipe: mxfp8\n",
                                     "gated_linear_unit: true\n",
                                     "use_transformer_engine_op_fuser: true\n"])
def test_silent_without_each_condition(qa051, without):
    assert qa051(BASE.replace(without, "") + SINGLE) == []


def test_silent_with_per_expert_weights_and_without_fused_accumulation(qa051):
    assert qa051(BASE) == []
    assert qa051(BASE + SINGLE + "gradient_accumulation_fusion: false\n") == []


def test_the_release_table_flags_2_14_and_2_14_1():
    affected = [v for v in TE_RELEASES if not te_behaviour(v).fused_grouped_mlp_overwrites_main_grad]
    assert affected == ["2.14", "2.14.1"] == sorted(GUARDED_LINE)


@pytest.mark.skipif(not TE_DIRS, reason="QAUDIT_TEST_TE_DIRS not set (scripts/fetch-te)")
@pytest.mark.parametrize("te_dir", TE_DIRS, ids=[p.name for p in TE_DIRS])
def test_the_range_is_what_tes_own_fused_backward_does(te_dir):
    """In each unpacked TE with the fused grouped-MLP backward, the single-grouped-weight
    branch of _compute_grad_params wraps main_grad for the GEMM either only when accumulating
    (affected) or always (fixed): the table and the quoted lines must say which."""
    root, version = locate_te([str(te_dir)])
    path = root / "transformer_engine/pytorch/ops/fused/backward_grouped_mlp.py"
    behaviour = te_behaviour(version)
    if not path.is_file():  # before 2.14 there is no fused backward; from 2.17 it moved
        assert behaviour.fused_grouped_mlp_overwrites_main_grad, version
        return
    lines = [text.strip() for text in path.read_text().splitlines()]
    wraps = [n for n, text in enumerate(lines, 1)
             if text == "grouped_wgrad = GroupedTensor.make_grouped_tensor_from_rowwise_data("
             and "rowwise_data=main_grad," in lines[n:n + 4]]
    assert len(wraps) == 1, version  # the single-grouped-weight branch wraps main_grad once
    guarded = lines[wraps[0] - 2] == "if accumulate_into_main_grad:"
    assert behaviour.fused_grouped_mlp_overwrites_main_grad == (not guarded), version
    name = version[:-2] if version.count(".") == 2 and version.endswith(".0") else version
    if name in GUARDED_LINE:
        assert wraps[0] - 1 == GUARDED_LINE[name]
    if name in UNGUARDED_LINE:
        assert wraps[0] == UNGUARDED_LINE[name]
