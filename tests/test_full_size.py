"""--full-size on the meta device: the real-width tree, one run, per-rank memory (issue 24)."""

from __future__ import annotations

import pytest
import torch

from qaudit.commands.check import audit_files
from qaudit.model.layers import _tokens_per_expert
from qaudit.run.options import AuditOptions

MOE_MLA = """\
num_layers: 3
hidden_size: 1024
ffn_hidden_size: 4096
num_attention_heads: 8
kv_channels: 128
num_moe_experts: 16
moe_ffn_hidden_size: 512
moe_shared_expert_intermediate_size: 512
moe_router_topk: 2
moe_layer_freq: [0, 1, 1]
moe_grouped_gemm: true
multi_latent_attention: true
q_lora_rank: 256
kv_lora_rank: 128
qk_head_dim: 64
qk_pos_emb_head_dim: 32
v_head_dim: 64
mtp_num_layers: 1
fp8: e4m3
fp8_recipe: blockwise
vocab_size: 32000
add_bias_linear: false
tensor_model_parallel_size: 2
expert_model_parallel_size: 4
"""


def _rows(report):
    return [(r.name, r.type, r.precision, r.tracked, r.accumulation, r.calls_per_microbatch,
             r.verdict) for r in report.modules]


def test_meta_run_gives_the_shrunk_audit_s_rows_and_findings(write_yaml):
    path = write_yaml("moe.yaml", MOE_MLA)
    shrunk = audit_files(path, options=AuditOptions())
    full = audit_files(path, options=AuditOptions(full_size=True))
    assert full.runtime == "reference (META)"
    assert _rows(full) == _rows(shrunk)
    assert [(f.rule, f.module) for f in full.findings] == [(f.rule, f.module) for f in shrunk.findings]
    assert shrunk.memory is None and full.to_dict()["memory"] == full.memory


def test_meta_build_holds_no_storage_and_real_widths(write_yaml, monkeypatch):
    from qaudit.run import audit as audit_module

    kept = {}
    real_run_audit = audit_module.run_audit

    def keep(*args, **kwargs):
        run = real_run_audit(*args, **kwargs)
        kept["model"] = run.model
        return run

    monkeypatch.setattr("qaudit.commands.check.run_audit", keep)
    audit_files(write_yaml("moe.yaml", MOE_MLA), options=AuditOptions(full_size=True))
    params = dict(kept["model"].named_parameters())
    assert all(p.is_meta for p in params.values())
    kv_down = params["decoder.layers.1.self_attention.linear_kv_down_proj.inner.weight"]
    assert tuple(kv_down.shape) == (128 + 32, 1024)  # kv_lora_rank + rope dim, hidden


def test_memory_per_rank_divides_by_the_split(write_yaml):
    one = audit_files(write_yaml("a.yaml", MOE_MLA.replace("tensor_model_parallel_size: 2",
                                                           "tensor_model_parallel_size: 1")
                                 .replace("expert_model_parallel_size: 4",
                                          "expert_model_parallel_size: 1")),
                      options=AuditOptions(full_size=True)).memory
    split = audit_files(write_yaml("b.yaml", MOE_MLA), options=AuditOptions(full_size=True)).memory
    assert split["split"] == "TP 2, EP 4"  # ETP defaults to TP
    assert split["parameters"] < one["parameters"] / 2  # experts / (EP x ETP), the rest / TP
    gib = one["parameters"] / 2**30
    assert (one["weights_gib"], one["main_grad_gib"], one["optimizer_gib"]) == \
        (round(2 * gib, 1), round(4 * gib, 1), round(12 * gib, 1))
    fsdp = audit_files(write_yaml("c.yaml", MOE_MLA + "use_megatron_fsdp: true\n"
                                  "data_parallel_sharding_strategy: optim_grads\n"),
                       options=AuditOptions(full_size=True)).memory
    assert fsdp["sharded_over_data_parallel"] == ["optimizer", "main_grad"]


def test_uniform_splits_on_meta_and_counts_on_cpu():
    experts = torch.empty(10, 2, dtype=torch.long, device="meta")
    assert _tokens_per_expert(experts, 8) == [3, 3, 3, 3, 2, 2, 2, 2]
    assert _tokens_per_expert(torch.tensor([[0, 1], [1, 1]]), 3) == [1, 3, 0]


@pytest.mark.slow
def test_deepseek_v3_full_size_on_meta(repo_configs):
    """The bundled DeepSeek-V3 at full width (681.7 B parameters): built and run on meta, no
    refusal for memory, QA040 silent (docs/gemm-shapes.md); its speed: scripts/bench."""
    report = audit_files(str(repo_configs / "deepseek-v3-mtp-fp8.yaml"),
                         options=AuditOptions(full_size=True))
    assert report.memory["parameters"] == pytest.approx(681.7e9, rel=0.001)
    assert not [f for f in report.findings if f.rule == "QA040"]
    assert len(report.modules) == 554


@pytest.mark.parametrize("name", ["deepseek-v3-mtp-fp8", "llama-3.1-405b-fp8", "moe-mxfp8",
                                  "nemotron-h-8b-fp8", "qwen3-235b-a22b-mxfp8",
                                  "gpt-mtp-fp8-mtp-bf16"])
def test_plan_widths_match_the_real_size_meta_build(repo_configs, name):
    """qaudit/plan/shapes.py's K and N for every TE module (before any split) are the weight
    shapes of the real-width build: the shape check and the built tree agree."""
    from qaudit.commands.check import load_inputs
    from qaudit.model.gpt import build_model
    from qaudit.model.session import Session
    from qaudit.plan.dims import model_dims
    from qaudit.plan.policies import POLICIES
    from qaudit.plan.shapes import Parallel, gemm_shape
    from qaudit.runtime.reference import ReferenceRuntime

    config, recipe = load_inputs(str(repo_configs / f"{name}.yaml"))
    session = Session(ReferenceRuntime("meta"), POLICIES["config"])
    model = build_model(config, model_dims(config, full_size=True), session, recipe)
    checked = 0
    for module in model.audited_modules():
        if not module.is_te:
            continue
        shape = gemm_shape(config, module.fqn, module.upstream_class, Parallel())
        assert shape is not None, module.fqn
        out_features, in_features = module.weights()[0].shape[-2:]
        assert (shape.k, shape.n) == (in_features, out_features), module.fqn
        checked += 1
    assert checked > 10


def test_memory_line_in_text_and_markdown(write_yaml):
    from qaudit.render.markdown import render_markdown
    from qaudit.render.table import render_table

    report = audit_files(write_yaml("moe.yaml", MOE_MLA), options=AuditOptions(full_size=True))
    for text in (render_table(report, report.exit_code()),
                 render_markdown(report, report.exit_code())):
        assert "memory per rank at full size (TP 2, EP 4; stage 0)" in " ".join(text.split())


def test_full_size_json_validates_against_the_schema(write_yaml):
    jsonschema = pytest.importorskip("jsonschema")
    from importlib import resources
    import json

    schema = json.loads(resources.files("qaudit").joinpath("schemas/report-v1.schema.json")
                        .read_text())
    report = audit_files(write_yaml("moe.yaml", MOE_MLA), options=AuditOptions(full_size=True))
    data = dict(report.to_dict(), exit_code=report.exit_code())
    assert data["gemm_shapes"] and data["memory"]
    jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)
    broken = dict(data, memory={"split": "TP 1"})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_full_size_reports_every_quantized_gemm_shape_from_the_build(write_yaml):
    report = audit_files(write_yaml("moe.yaml", MOE_MLA + "seq_length: 4096\n"
                                    "sequence_parallel: true\n"),
                         options=AuditOptions(full_size=True))
    shapes = {(s["modules"], s["precision"]): s for s in report.gemm_shapes}
    kv_down = shapes[("decoder.layers.*.self_attention.linear_kv_down_proj", "fp8/blockwise")]
    assert (kv_down["m"], kv_down["k"], kv_down["n"], kv_down["count"]) == (2048, 1024, 160, 3)
    fc1 = shapes[("decoder.layers.*.mlp.experts.linear_fc1", "fp8/blockwise")]
    assert (fc1["per_expert"], fc1["k"], fc1["n"]) == (True, 1024, 256)  # 512 / ETP 2
    assert all(s["split"] == "TP 2, EP 4, sequence parallel" for s in report.gemm_shapes)
    # Every audit reports the table; the shrunk build's widths give the same one.
    shrunk = audit_files(write_yaml("moe.yaml", MOE_MLA + "seq_length: 4096\n"
                                    "sequence_parallel: true\n"), options=AuditOptions())
    assert shrunk.gemm_shapes == report.gemm_shapes


def test_every_format_shows_the_shape_table_where_a_reviewer_looks(write_yaml):
    """JSON always; Markdown folded; the terminal table only with -v (issue 23's short screen)."""
    from qaudit.render.markdown import render_markdown
    from qaudit.render.table import render_table

    report = audit_files(write_yaml("moe.yaml", MOE_MLA + "seq_length: 4096\n"),
                         options=AuditOptions())
    code = report.exit_code()
    title = "GEMM shapes on one rank at real width (TP 2, EP 4)"
    assert title not in render_table(report, code)
    verbose = render_table(report, code, show_info=True)
    assert title in verbose
    kv_down = next(line for line in verbose.splitlines()
                   if line.endswith("decoder.layers.*.self_attention.linear_kv_down_proj"))
    assert kv_down.split()[:5] == ["3", "fp8/blockwise", "4096", "1024", "160"]
    assert "per expert" in verbose
    markdown = render_markdown(report, code)
    assert f"<details><summary>{title}" in markdown
    assert "| `decoder.layers.*.self_attention.linear_kv_down_proj` | 3 | `fp8/blockwise` | 4096 | 1024 | 160 |" in markdown


def test_a_bf16_run_reports_an_empty_shape_table(write_yaml):
    report = audit_files(write_yaml("bf16.yaml", MOE_MLA.replace("fp8: e4m3\nfp8_recipe: blockwise\n", "")),
                         options=AuditOptions())
    assert report.gemm_shapes == []
    from qaudit.render.table import render_table

    assert "GEMM shapes" not in render_table(report, report.exit_code(), show_info=True)


def test_numpy_import_short_cut_lasts_one_audit_only(write_yaml, monkeypatch):
    """The meta run blocks a failing numpy import for speed; after the audit, numpy found
    later on sys.path (a cross-check's Megatron brings its own) must import again."""
    import importlib.util
    import sys

    real_find_spec = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "numpy", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "numpy" else real_find_spec(name, *a, **k))
    seen = {}
    from qaudit.run import audit as audit_module
    real_training = audit_module.run_training

    def spy(*args, **kwargs):
        seen["during"] = sys.modules.get("numpy", "absent")
        return real_training(*args, **kwargs)

    monkeypatch.setattr(audit_module, "run_training", spy)
    audit_files(write_yaml("moe.yaml", MOE_MLA), options=AuditOptions(full_size=True))
    assert seen["during"] is None  # blocked while the meta run lasts
    assert "numpy" not in sys.modules  # and gone afterwards

