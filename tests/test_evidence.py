"""--verify, --compare-policies, recompute, --eval and --suggest (issue 3)."""

from __future__ import annotations

import re

import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files

BASE = "num_layers: 2\nhidden_size: 128\nnum_attention_heads: 4\n"
MTP = "mtp_num_layers: 2\nmtp_use_repeated_layer: true\n"
FP8 = "fp8: e4m3\nfp8_recipe: tensorwise\n"
FULL_RECOMPUTE = "recompute_granularity: full\nrecompute_method: uniform\nrecompute_num_layers: 1\n"


def audit(write_yaml, text, **options):
    return audit_files(write_yaml("c.yaml", text), options=AuditOptions(**options))


def test_verify_shows_the_overwritten_share_only_on_repeated_modules(write_yaml):
    report = audit(write_yaml, BASE + MTP + FP8, verify=True)
    for row in report.modules:
        if row.name.startswith("mtp."):
            assert row.grad_rel_error > 0.05, row
        elif row.name != "output_layer":  # tied to the embedding: no own weight
            assert row.grad_rel_error < 1e-4, row
    evidence = {f.evidence for f in report.findings if f.rule == "QA001"}
    assert evidence and all(e.startswith("confirmed: main_grad is off by") for e in evidence)


def test_verify_with_fusion_off_is_rounding_everywhere(write_yaml):
    report = audit(write_yaml, BASE + MTP + FP8 + "gradient_accumulation_fusion: false\n", verify=True)
    errors = [r.grad_rel_error for r in report.modules if r.grad_rel_error is not None]
    assert len(errors) == len(report.modules) - 1 and max(errors) < 1e-4


def test_verify_untied_output_layer_gets_an_error_too(write_yaml):
    report = audit(write_yaml, BASE + "share_embeddings_and_output_weights: false\n", verify=True)
    head = next(r for r in report.modules if r.name == "output_layer")
    assert head.grad_rel_error is not None and head.grad_rel_error < 1e-4


def test_full_recompute_of_repeated_mtp_counts_no_grad_calls_and_no_overwrite(write_yaml):
    report = audit(write_yaml, BASE + MTP + FP8 + FULL_RECOMPUTE, verify=True)
    for row in report.modules:
        if row.name.startswith("mtp."):
            assert (row.calls_per_microbatch, row.nograd_calls_per_microbatch) == (2, 2)
            assert row.accumulation == "accumulate" and row.verdict == "ok"
            assert row.grad_rel_error < 1e-4
        elif row.name.startswith("decoder."):
            assert (row.calls_per_microbatch, row.nograd_calls_per_microbatch) == (1, 1)
    assert report.counts().get("error", 0) == 0


def test_selective_mlp_recompute_touches_only_the_mlp(write_yaml):
    report = audit(write_yaml, BASE + FP8 + "recompute_granularity: selective\n"
                   "recompute_modules: [mlp]\n")
    rows = {r.name: r for r in report.modules}
    assert rows["decoder.layers.0.mlp.linear_fc1"].nograd_calls_per_microbatch == 1
    assert rows["decoder.layers.0.self_attention.linear_qkv"].nograd_calls_per_microbatch == 0


def test_compare_policies_on_bf16_repeated_mtp_fails_only_in_releases(repo_configs):
    report = audit_files(str(repo_configs / "gpt-mtp-bf16.yaml"),
                         options=AuditOptions(compare_policies=True, megatron="main"))
    mtp = {g: v for g, v in report.policies.items() if g.startswith("mtp.")}
    assert mtp and all(v["legacy"].startswith("QA001") and v["pre-5642"].startswith("QA001")
                       and v["config"] == "ok" and v["module"] == "ok" for v in mtp.values())
    assert report.exit_code() == 0  # the exit code follows the audited Megatron (main)
    data = report.to_dict()
    assert data["policies"] == report.policies
    # Columns are labelled by the Megatron versions that behave that way.
    assert data["policy_versions"] == {"pre-5642": "0.9.0-0.18.2", "legacy": "0.19.0-0.19.2",
                                       "config": "main", "module": "PR #7353"}


def test_compare_policies_on_fp8_repeated_mtp_fails_under_all_three(write_yaml):
    report = audit(write_yaml, BASE + MTP + FP8, compare_policies=True)
    group = report.policies["mtp.layers.*.eh_proj"]
    assert all(group[p].startswith("QA001") for p in ("legacy", "config", "module"))


def test_eval_uses_evaluation_recipes_and_runs_no_backward(write_yaml):
    recipe = write_yaml("r.yaml", """\
    configs:
      q:
        transformer_engine_config_type: TEQuantizationParams
        training_recipe: {fp8_quantization_recipe: mxfp8, override_nonquantized_autocast: true}
        evaluation_recipe: {}
    matchers:
      mlp: {type: glob, pattern: "*.mlp.*", config: q, enabled: true}
    """)
    config = write_yaml("c.yaml", BASE + MTP)
    train = {r.name: r for r in audit_files(config, recipe).modules}
    evaluate = {r.name: r for r in audit_files(config, recipe, AuditOptions(evaluation=True)).modules}
    name = "decoder.layers.0.mlp.linear_fc1"
    assert (train[name].precision, evaluate[name].precision) == ("fp8/mxfp8", "bf16")
    assert (evaluate[name].calls_per_microbatch, evaluate[name].nograd_calls_per_microbatch) == (0, 1)
    assert evaluate["mtp.layers.0.eh_proj"].accumulation == "-"


def test_suggest_lists_remedies_that_pass_with_cost_and_yaml(write_yaml):
    report = audit_files(write_yaml("c.yaml", BASE + MTP + FP8), suggest=True)
    by_yaml = {s["yaml"].splitlines()[0]: s for s in report.suggestions}
    assert by_yaml["mtp_use_repeated_layer: false"]["passes"] is True
    assert re.search(r"[\d.]+ (GiB|MiB) of weights", by_yaml["mtp_use_repeated_layer: false"]["cost"])
    assert by_yaml["gradient_accumulation_fusion: false"]["passes"] is True
    assert by_yaml["disable_parameter_transpose_cache: true"]["passes"] is True
    recipe_fix = next(s for s in report.suggestions if "policy module" in s["remedy"])
    assert recipe_fix["passes"] is True and 'pattern: "mtp.*"' in recipe_fix["yaml"]


def test_suggest_on_a_clean_config_is_empty(write_yaml):
    assert audit_files(write_yaml("c.yaml", BASE + FP8), suggest=True).suggestions == []


@pytest.mark.parametrize("rule", ["QA001", "qa013"])
def test_explain_prints_the_doc_page(rule, monkeypatch, capsys):
    import sys

    from qaudit import cli

    monkeypatch.setattr(sys, "argv", ["qaudit", "explain", rule])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith(rule.upper() + " (")


def test_explain_unknown_rule_is_a_usage_error(monkeypatch, capsys):
    import sys

    from qaudit import cli

    monkeypatch.setattr(sys, "argv", ["qaudit", "explain", "QA999"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2 and "QA999" in capsys.readouterr().err
