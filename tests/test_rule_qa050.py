"""QA050 (TE issue #3234): grouped experts stored as one grouped weight parameter
(`moe_single_grouped_weight`) and run through TE's GroupedLinear module (no op fuser), on a
TE whose module hands its GEMMs the parameter's member views (2.14 to 2.18): no weight
gradient. Only where the Megatron in effect builds it (megatron-core 0.18.x; 0.19 refuses
it without the op fuser). The range is checked against TE's own code where it is unpacked,
and the refusal against the unpacked megatron-core."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qaudit.commands.check import audit_files
from qaudit.judge.rules.qa050_single_grouped_weight_no_wgrad import MEMBERS_LINE, PARAMETER_LINE
from qaudit.plan.upstream.te import TE_RELEASES, locate_te, te_behaviour, te_version_key
from qaudit.run.options import AuditOptions

# The stand-in releases and the extra ones read for ranges (.ci/run fetches both).
TE_DIRS = [Path(p) for name in ("QAUDIT_TEST_TE_DIRS", "QAUDIT_TEST_TE_RANGE_DIRS")
           for p in os.environ.get(name, "").split(":") if p]
MOE = ("num_layers: 2\nhidden_size: 256\nnum_attention_heads: 4\nnum_moe_experts: 4\n"
       "moe_router_topk: 2\nmoe_grouped_gemm: true\n")
SINGLE = "moe_single_grouped_weight: true\n"
EXPERTS = {f"decoder.layers.{i}.mlp.experts.linear_fc{j}" for i in (0, 1) for j in (1, 2)}


@pytest.fixture
def qa050(write_yaml):
    def run(config: str, te: str = "2.17", megatron: str = "0.18.2"):
        report = audit_files(write_yaml("config.yaml", config), None,
                             AuditOptions(te=te, megatron=megatron, steps=1, microbatches=2))
        return [f for f in report.findings if f.rule == "QA050"]
    return run


@pytest.mark.parametrize("te", ["2.14", "2.15", "2.17", "2.18"])
def test_fires_on_each_grouped_expert_in_the_affected_releases(qa050, te):
    found = qa050(MOE + SINGLE, te)
    assert {f.module for f in found} == EXPERTS
    assert all(f.severity == "error" and f.line == 7 and f.file.endswith("config.yaml")
               for f in found)
    assert f"Transformer Engine {te}" in found[0].message and "#3234" in found[0].message
    evidence = found[0].evidence
    assert f"grouped_linear.py:{MEMBERS_LINE[te]}" in evidence
    assert "_get_weight_tensors" in evidence and "in 2.19 (line 2776)" in evidence
    assert "2.19" in found[0].fix and "use_transformer_engine_op_fuser" in found[0].fix


@pytest.mark.parametrize("te", ["2.13", "2.19", "2.20.2", "main"])
def test_silent_before_and_after_the_affected_releases(qa050, te):
    assert qa050(MOE + SINGLE, te) == []


@pytest.mark.parametrize("megatron", ["0.19.0", "0.19.2", "main", "bridge-v0.6.0"])
def test_silent_where_megatron_refuses_the_setting_without_the_op_fuser(qa050, megatron):
    assert qa050(MOE + SINGLE, megatron=megatron) == []
    assert {f.module for f in qa050(MOE + SINGLE, megatron="0.18.0")} == EXPERTS


def test_silent_without_each_condition(qa050):
    assert qa050(MOE) == []  # per-expert weights
    assert qa050(MOE + "moe_single_grouped_weight: false\n") == []
    assert qa050(MOE + SINGLE + "use_transformer_engine_op_fuser: true\n") == []  # op path
    assert qa050(MOE.replace("moe_grouped_gemm: true\n", "") + SINGLE) == []  # SequentialMLP


def test_the_release_table_flags_2_14_to_2_18():
    affected = [v for v in TE_RELEASES if not te_behaviour(v).single_grouped_weight_wgrad]
    assert affected == ["2.14", "2.14.1", "2.15", "2.16", "2.16.1", "2.17", "2.17.1", "2.18"]
    assert sorted(MEMBERS_LINE) == sorted(affected)


def _release_name(version: str) -> str:
    return version[:-2] if version.count(".") == 2 and version.endswith(".0") else version


@pytest.mark.skipif(not TE_DIRS, reason="QAUDIT_TEST_TE_DIRS not set (scripts/fetch-te)")
@pytest.mark.parametrize("te_dir", TE_DIRS, ids=[p.name for p in TE_DIRS])
def test_the_range_is_what_tes_own_grouped_linear_does(te_dir):
    """In each unpacked TE with single_grouped_weight, GroupedLinear._get_weight_tensors hands
    over either the grouped parameter's members or the parameter: the table and the lines the
    evidence quotes must say which."""
    root, version = locate_te([str(te_dir)])
    lines = (root / "transformer_engine/pytorch/module/grouped_linear.py").read_text().splitlines()
    members = [n for n, text in enumerate(lines, 1)
               if text.strip() == "weight_tensors = grouped_weight.quantized_tensors"]
    whole = [n for n, text in enumerate(lines, 1)
             if text.strip() == "weight_tensors = [grouped_weight]"]
    has_feature = any("single_grouped_weight" in text for text in lines)
    assert te_version_key(version) is not None
    name = _release_name(version)
    assert te_behaviour(version).single_grouped_weight_wgrad == (not members), version
    assert not (members and whole) and (members or whole or not has_feature), te_dir
    if name in MEMBERS_LINE or name in PARAMETER_LINE:
        assert (members or whole) == [MEMBERS_LINE.get(name) or PARAMETER_LINE[name]], version


def test_megatron_0_19_refuses_the_module_path(megatron):
    """The 0.19 bound: TransformerConfig refuses moe_single_grouped_weight without the op
    fuser (QAUDIT_TEST_MEGATRON_CORE is a 0.19 wheel)."""
    source = (megatron / "megatron/core/transformer/transformer_config.py").read_text()
    refusal = source[source.index("if self.moe_single_grouped_weight:"):]
    assert "if not self.use_transformer_engine_op_fuser:" in refusal[:1500]
