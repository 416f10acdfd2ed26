"""QA008 (TE issue #3051): grouped experts inside a quantized per-layer CUDA graph, on a TE
whose GroupedLinear drops the skip-weight-update flag at capture (2.10 to 2.16.1). It fires
only with all three of fp8/fp4, graphs capturing the experts, and grouped experts, and only
for the affected releases; the range is checked against TE's own code where it is unpacked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qaudit.commands.check import audit_files
from qaudit.plan.upstream.te import TE_RELEASES, locate_te, te_behaviour, te_version_key
from qaudit.run.options import AuditOptions

TE_DIRS = [Path(p) for p in os.environ.get("QAUDIT_TEST_TE_DIRS", "").split(":") if p]
MOE = ("num_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\nnum_moe_experts: 4\n"
       "moe_router_topk: 2\n")
GROUPED = "moe_grouped_gemm: true\n"
FP8 = "fp8: e4m3\nfp8_recipe: tensorwise\n"
GRAPHS = "cuda_graph_impl: transformer_engine\n"
EXPERTS = {"decoder.layers.0.mlp.experts.linear_fc1", "decoder.layers.0.mlp.experts.linear_fc2",
           "decoder.layers.1.mlp.experts.linear_fc1", "decoder.layers.1.mlp.experts.linear_fc2"}


@pytest.fixture
def qa008(write_yaml):
    def run(config: str, te: str = "2.14"):
        report = audit_files(write_yaml("config.yaml", config), None,
                             AuditOptions(te=te, steps=1, microbatches=2))
        return [f for f in report.findings if f.rule == "QA008"]
    return run


@pytest.mark.parametrize("te", ["2.10", "2.14", "2.16.1"])
def test_fires_on_each_grouped_expert_in_the_affected_releases(qa008, te):
    found = qa008(MOE + GROUPED + FP8 + GRAPHS, te)
    assert {f.module for f in found} == EXPERTS
    assert all(f.severity == "error" and f.line == 9 and f.file.endswith("config.yaml")
               for f in found)
    assert f"Transformer Engine {te}" in found[0].message and "#3051" in found[0].message
    # The evidence names TE's code on both sides of the fix.
    evidence = found[0].evidence
    assert f"Transformer Engine {te}" in evidence and "GroupedLinear.forward" in evidence
    assert "grouped_linear.py" in evidence and "in 2.17" in evidence
    assert "2.17" in found[0].fix


@pytest.mark.parametrize("te", ["2.9", "2.17", "2.20.2", "main"])
def test_silent_before_and_after_the_affected_releases(qa008, te):
    assert qa008(MOE + GROUPED + FP8 + GRAPHS, te) == []


def test_silent_without_each_condition(qa008):
    assert qa008(MOE + GROUPED + GRAPHS) == []  # BF16: no skip flag anywhere
    assert qa008(MOE + GROUPED + FP8) == []  # no graphs
    assert qa008(MOE + FP8 + GRAPHS) == []  # SequentialMLP: TE linears, not GroupedLinear
    # Graphs that leave the experts out, and full-iteration graphs (no TE capture helper).
    assert qa008(MOE + GROUPED + FP8 + GRAPHS + "cuda_graph_modules: [attn, moe_router]\n") == []
    assert qa008(MOE + GROUPED + FP8 + "cuda_graph_impl: full_iteration\n") == []


def test_fires_with_fp4_the_moe_scope_and_the_deprecated_switch(qa008):
    fp4 = "fp4: e2m1\nfp4_recipe: nvfp4\n"
    assert {f.module for f in qa008(MOE + GROUPED + fp4 + GRAPHS)} == EXPERTS
    scoped = qa008(MOE + GROUPED + FP8 + GRAPHS + "cuda_graph_modules: [moe]\n")
    assert {f.module for f in scoped} == EXPERTS
    deprecated = qa008(MOE + GROUPED + FP8 + "enable_cuda_graph: true\n")
    assert {f.module for f in deprecated} == EXPERTS and deprecated[0].line == 9


def test_the_super_nvfp4_example_keeps_its_experts_out_of_the_graphs(monkeypatch):
    """Bridge's Super NVFP4 recipe graphs mamba/attn/moe_router/moe_preprocess only: its
    GroupedLinear experts run eagerly, so even TE 2.14 leaves them alone."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    report = audit_files("configs/bridge-super-nvfp4-mtp-bf16.yaml", None,
                         AuditOptions(te="2.14", steps=1, microbatches=2))
    assert not [f for f in report.findings if f.rule == "QA008"]
    assert any(row.tracked == "graph" for row in report.modules)


def test_the_release_table_flags_2_10_to_2_16_1():
    affected = [v for v in TE_RELEASES if not te_behaviour(v).grouped_linear_graph_skip_flag]
    assert affected == ["2.10", "2.11", "2.12", "2.13", "2.14", "2.14.1", "2.15", "2.16",
                        "2.16.1"]


@pytest.mark.skipif(not TE_DIRS, reason="QAUDIT_TEST_TE_DIRS not set (scripts/fetch-te)")
@pytest.mark.parametrize("te_dir", TE_DIRS, ids=[p.name for p in TE_DIRS])
def test_the_range_is_what_tes_own_grouped_linear_does(te_dir):
    """In each unpacked TE, GroupedLinear.forward either asks whether a graph is being captured
    (and passes the skip tensor on) or hands over a literal None: the table must say which."""
    root, version = locate_te([str(te_dir)])
    source = (root / "transformer_engine" / "pytorch" / "module" / "grouped_linear.py").read_text()
    module_forward = source[source.index("class GroupedLinear("):]
    asks = "fp8_graph_capturing()" in module_forward
    drops = "None,  # skip_fp8_weight_update" in module_forward
    assert asks != drops, te_dir
    assert te_version_key(version) is not None
    assert te_behaviour(version).grouped_linear_graph_skip_flag == asks, version
