"""End-to-end audits in process: the issue's checks on small models and the bundled configs."""

from __future__ import annotations

import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files

SMALL_MTP = """\
num_layers: 4
hidden_size: 256
num_attention_heads: 8
mtp_num_layers: 2
mtp_use_repeated_layer: true
"""
FP8 = "fp8: e4m3\nfp8_recipe: tensorwise\n"
MTP_BF16_RECIPE = """\
configs:
  hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
matchers:
  mtp: {type: glob, pattern: "mtp.*", config: hp, enabled: true}
"""


def rows_by_name(report):
    return {row.name: row for row in report.modules}


def mtp_rows(report):
    return [row for row in report.modules if row.name.startswith("mtp.layers.0.")]


def exit_code(report):
    return 1 if report.counts().get("error") else 0


def test_fp8_repeated_mtp_fused_fails_on_every_mtp_module(write_yaml):
    report = audit_files(write_yaml("c.yaml", SMALL_MTP + FP8))
    rows = mtp_rows(report)
    assert len(rows) == 5  # eh_proj + qkv, proj, fc1, fc2
    for row in rows:
        assert (row.calls_per_microbatch, row.tracked, row.verdict) == (2, "yes", "QA001")
        assert row.precision == "fp8/tensorwise"
    assert {f.module for f in report.findings if f.rule == "QA001"} == {r.name for r in rows}
    decoder = [r for r in report.modules if r.name.startswith("decoder.")]
    assert all(r.verdict == "ok" and r.calls_per_microbatch == 1 for r in decoder)
    assert exit_code(report) == 1


def test_qa001_message_names_call_cause_and_line(write_yaml):
    report = audit_files(write_yaml("c.yaml", SMALL_MTP + FP8))
    finding = next(f for f in report.findings if f.module == "mtp.layers.0.eh_proj")
    assert "call 1 gets is_first_microbatch=True" in finding.message
    assert "second of 2" in finding.message
    assert "every step" in finding.message
    assert finding.line == 5 and finding.file.endswith("c.yaml")  # mtp_use_repeated_layer
    assert "mtp_use_repeated_layer: false" in finding.fix


@pytest.mark.parametrize("extra", ["gradient_accumulation_fusion: false\n",
                                   "disable_parameter_transpose_cache: true\n"])
def test_no_fusion_or_no_caching_passes(write_yaml, extra):
    report = audit_files(write_yaml("c.yaml", SMALL_MTP + FP8 + extra))
    assert exit_code(report) == 0 and report.counts().get("warning", 0) == 0
    # Without caching, quantized modules re-quantize every call: a cost, reported as info.
    expected_info = {"QA004"} if "transpose" in extra else set()
    assert {f.rule for f in report.findings} == expected_info
    expected = "autograd" if "fusion" in extra else "accumulate"
    assert {r.accumulation for r in mtp_rows(report)} == {expected}
    if "transpose" in extra:
        assert {r.tracked for r in mtp_rows(report)} == {"no"}


def test_one_mtp_layer_per_depth_passes(write_yaml):
    text = SMALL_MTP.replace("mtp_use_repeated_layer: true", "mtp_use_repeated_layer: false")
    report = audit_files(write_yaml("c.yaml", text + FP8))
    names = {r.name.split(".")[2] for r in report.modules if r.name.startswith("mtp.")}
    assert names == {"0", "1"}
    assert all(r.calls_per_microbatch == 1 for r in report.modules if r.name.startswith("mtp."))
    assert exit_code(report) == 0


def test_bf16_repeated_mtp_passes_on_main_and_fails_on_the_newest_release(write_yaml):
    path = write_yaml("c.yaml", SMALL_MTP)
    clean = audit_files(path, options=AuditOptions(megatron="main"))
    assert exit_code(clean) == 0
    assert {(r.tracked, r.accumulation) for r in mtp_rows(clean)} == {("no", "accumulate")}
    # With no Megatron importable, the verdict is the newest release's (0.19.2: legacy).
    legacy = audit_files(path)
    assert legacy.policy == "legacy" and legacy.megatron["source"] == "assumed"
    assert exit_code(legacy) == 1
    assert {r.tracked for r in mtp_rows(legacy)} == {"stale"}
    message = next(f.message for f in legacy.findings if f.rule == "QA001")
    assert "first step after every start or resume" in message


def test_recipe_forcing_mtp_bf16_fails_under_config_passes_under_module(write_yaml):
    config = write_yaml("c.yaml", SMALL_MTP + FP8)
    recipe = write_yaml("r.yaml", MTP_BF16_RECIPE)
    upstream = audit_files(config, recipe)
    assert {(r.precision, r.recipe, r.tracked, r.verdict) for r in mtp_rows(upstream)} == \
        {("bf16", "hp", "yes", "QA001")}  # the overwrite; its fix names the #7353 cause
    fixed = audit_files(config, recipe, AuditOptions(policy="module"))
    assert {(r.tracked, r.accumulation, r.verdict) for r in mtp_rows(fixed)} == {("no", "accumulate", "ok")}
    assert exit_code(fixed) == 0
    # decoder modules run fp8 and stay tracked under the module policy
    assert rows_by_name(fixed)["decoder.layers.0.mlp.linear_fc1"].tracked == "yes"


def test_first_last_layers_bf16_with_fp8_keeps_mtp_fp8(write_yaml):
    text = SMALL_MTP.replace("true", "false") + FP8 + "first_last_layers_bf16: true\n"
    rows = rows_by_name(audit_files(write_yaml("c.yaml", text)))
    assert rows["decoder.layers.0.mlp.linear_fc1"].precision == "bf16"
    assert rows["decoder.layers.3.self_attention.linear_qkv"].precision == "bf16"
    assert rows["decoder.layers.1.mlp.linear_fc1"].precision == "fp8/tensorwise"
    assert rows["decoder.layers.2.mlp.linear_fc2"].precision == "fp8/tensorwise"
    assert rows["mtp.layers.0.eh_proj"].precision == "fp8/tensorwise"


def test_fp4_mtp_runs_bf16_and_stays_tracked(write_yaml):
    report = audit_files(write_yaml("c.yaml", SMALL_MTP + "fp4: e2m1\n"))
    assert {(r.precision, r.tracked) for r in mtp_rows(report)} == {("bf16", "yes")}
    assert rows_by_name(report)["decoder.layers.0.mlp.linear_fc1"].precision == "fp4/nvfp4"
    assert exit_code(report) == 1  # tracked and repeated: overwrite


def test_disabled_matcher_changes_nothing(write_yaml):
    config = write_yaml("c.yaml", SMALL_MTP + FP8)
    disabled = MTP_BF16_RECIPE.replace(", enabled: true", "")
    with_recipe = audit_files(config, write_yaml("r.yaml", disabled))
    without = audit_files(config)
    assert [r for r in with_recipe.modules] == [r for r in without.modules]


def test_te_output_layer_shared_with_mtp_heads(write_yaml):
    text = (SMALL_MTP.replace("true", "false") + "fp8: e4m3\nfp8_recipe: mxfp8\n"
            "fp8_output_proj: true\nshare_embeddings_and_output_weights: false\n")
    report = audit_files(write_yaml("c.yaml", text))
    head = rows_by_name(report)["output_layer"]
    assert (head.type, head.precision, head.tracked, head.calls_per_microbatch) == \
        ("TELMHeadColumnParallelLinear", "fp8/mxfp8", "yes", 3)
    # Autograd runs the main-logits branch first, so depth 1's True call overwrites last.
    assert head.verdict == "QA001"


def test_non_te_output_layer_always_accumulates(write_yaml):
    head = rows_by_name(audit_files(write_yaml("c.yaml", SMALL_MTP + FP8)))["output_layer"]
    assert (head.type, head.tracked, head.accumulation, head.calls_per_microbatch, head.verdict) == \
        ("ColumnParallelLinear", "-", "accumulate", 3, "ok")


def test_moe_module_names_and_precision(write_yaml):
    text = """\
    num_layers: 3
    hidden_size: 256
    num_attention_heads: 8
    num_moe_experts: 4
    moe_layer_freq: [0, 1, 1]
    moe_shared_expert_intermediate_size: 512
    add_bias_linear: false
    fp8: e4m3
    fp8_recipe: mxfp8
    """
    names = [r.name for r in audit_files(write_yaml("c.yaml", text)).modules]
    assert "decoder.layers.0.mlp.linear_fc1" in names
    assert "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2" in names
    assert "decoder.layers.2.mlp.shared_experts.linear_fc1" in names
    assert not any("router" in n for n in names)
    grouped = [r.name for r in audit_files(write_yaml("g.yaml", text + "moe_grouped_gemm: true\n")).modules]
    assert "decoder.layers.1.mlp.experts.linear_fc1" in grouped


def test_json_report_shape(write_yaml):
    data = audit_files(write_yaml("c.yaml", SMALL_MTP + FP8)).to_dict()
    assert data["schema"] == "qaudit/1" and data["policy"] == "legacy"
    assert data["megatron"] == {"source": "assumed", "version": "0.19.2", "policy": "legacy",
                                "label": "megatron-core 0.19.2", "location": None,
                                "note": data["megatron"]["note"],
                                "startup_checks": data["megatron"]["startup_checks"]}
    assert "--megatron main" in data["megatron"]["note"]
    assert data["megatron"]["startup_checks"].startswith("not run (no Megatron importable)")
    assert data["runtime"].startswith("reference")
    assert set(data["modules"][0]) >= {"name", "type", "precision", "recipe", "tracked",
                                       "accumulation", "calls_per_microbatch", "verdict"}
    assert set(data["findings"][0]) >= {"rule", "severity", "module", "message", "file", "line"}


def test_bundled_attention_recipe_keeps_attention_bf16(repo_configs):
    rows = audit_files(str(repo_configs / "gpt-fp8-attention-bf16.yaml")).modules
    for row in rows:
        if ".self_attention." in row.name:
            assert (row.precision, row.recipe) == ("bf16", "bf16")
        elif row.name.startswith("decoder."):
            assert row.precision == "fp8/tensorwise" and row.recipe == "-"
