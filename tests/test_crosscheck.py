"""--cross-check: qaudit's model against the installed Megatron's own build and run.

Tests that need Megatron use the `megatron` fixture (tests/megatron_env.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch

from cli_helpers import run_in_process

pytestmark = pytest.mark.usefixtures("forget_megatron")
from qaudit.crosscheck.compare import ABSENT, Difference, compare
from qaudit.crosscheck.facts import ModuleFacts

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def cross_check(monkeypatch, capsys, *args: str) -> tuple[int, dict, str]:
    code, out, err = run_in_process(monkeypatch, capsys, "check", *args, "--cross-check",
                                    "--format", "json")
    assert not err or code == 2, err
    return code, json.loads(out) if out else {}, err


# --- without Megatron ------------------------------------------------------------------------


def test_without_megatron_exit_2_saying_so(monkeypatch, capsys):
    monkeypatch.setattr("qaudit.crosscheck.locate_megatron", lambda: None)
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--cross-check")
    assert code == 2 and not out
    assert err.startswith("error: --cross-check needs the Megatron you train with")
    assert len(err.strip().splitlines()) == 1


def _facts(name: str, cls: str = "TELinear", **run) -> ModuleFacts:
    return ModuleFacts(name, cls, "-", "no/yes", **{"precision": "bf16", "tracked": "no",
                                                     "accumulation": "accumulate",
                                                     "calls_per_microbatch": 1, **run})


@pytest.mark.parametrize(("fields", "mla", "sized"), [
    ({"fp8_dot_product_attention": True, "fp8_recipe": "mxfp8", "kv_channels": 16}, False, True),
    ({"fp8_dot_product_attention": True, "fp8_recipe": "mxfp8", "kv_channels": 40}, False, True),
    ({"fp8_dot_product_attention": True, "fp8_recipe": "tensorwise", "kv_channels": 16}, False, False),
    ({"fp8_dot_product_attention": False, "fp8_recipe": "mxfp8", "kv_channels": 16}, False, False),
    ({"fp8_dot_product_attention": True, "fp8_recipe": "mxfp8", "kv_channels": 16}, True, False),
])
def test_mxfp8_attention_runs_at_the_sizes_te_accepts(fields, mla, sized):
    """On TE's own Python, MXFP8 attention is run at sequence % 128 and head size % 32 (TE's
    assertion); nothing else is resized, and multi-latent attention keeps its sizes."""
    from qaudit.crosscheck.upstream_build import _sized_for_mxfp8_attention
    from qaudit.crosscheck.upstream_config import UpstreamInput

    upstream = UpstreamInput(mla=mla, config_kwargs=dict(fields),
                             model_kwargs={"max_sequence_length": 8, "vocab_size": 128},
                             recipe_path=None)
    notes = _sized_for_mxfp8_attention(upstream)
    head = upstream.config_kwargs["kv_channels"]
    sequence = upstream.model_kwargs["max_sequence_length"]
    if sized:
        assert head % 32 == 0 and fields["kv_channels"] <= head < fields["kv_channels"] + 32
        assert sequence == 128 and notes == [
            f"MXFP8 attention: run at sequence length 128 and head size {head} (TE's minimum; "
            f"widths are not compared)"]
    else:
        assert (head, sequence, notes) == (fields["kv_channels"], 8, [])


def test_compare_names_both_sides_of_each_difference():
    ours = [_facts("a"), _facts("b", tracked="no"), _facts("only_ours"),
            _facts("c", precision="fp8/custom (not executed)")]
    theirs = [_facts("a"), _facts("b", tracked="stale"), _facts("c", precision="fp8/custom"),
              _facts("only_theirs", "TERowParallelLinear")]
    assert compare(ours, theirs, ran=True) == [
        Difference("b", "tracked", "no", "stale"),
        Difference("only_ours", "module", "TELinear", ABSENT),
        Difference("only_theirs", "module", ABSENT, "TERowParallelLinear")]
    # Construction only: the run's fields are not compared.
    assert compare(ours, theirs, ran=False) == [
        Difference("only_ours", "module", "TELinear", ABSENT),
        Difference("only_theirs", "module", ABSENT, "TERowParallelLinear")]


def test_weight_cache_uses_read_step_by_step():
    from qaudit.model.probe import CallRecord
    from qaudit.run.rows import weight_cache_of

    def record(step, microbatch, call, cache, quant=True):
        return CallRecord(module="m", step=step, microbatch=microbatch, call=call, flag=None,
                          grad=True, quant=object() if quant else None, training=True,
                          cache=cache if quant else None)

    # Out of order on purpose: the summary follows step, microbatch and call.
    stale = [record(1, 1, 1, "reuse"), record(0, 0, 1, "refresh"), record(0, 1, 1, "reuse"),
             record(1, 0, 1, "reuse")]
    assert weight_cache_of(stale) == "refresh,reuse | reuse*2"
    # A module run twice per microbatch whose second call refreshes again.
    repeated = [record(0, mb, call, use) for mb in (0, 1)
                for call, use in ((1, "refresh"), (2, "refresh" if mb == 0 else "reuse"))]
    assert weight_cache_of(repeated) == "refresh*3,reuse"
    assert weight_cache_of([record(0, 0, 1, None, quant=False)]) == "-"
    assert weight_cache_of([]) == "-"


def test_the_stand_in_te_marks_weights_built_under_quantized_init_as_primary():
    from qaudit.runtime.standin import te_package as standin_te

    outside = standin_te.Linear(8, 8)
    with standin_te.fp8_model_init(enabled=True):
        inside = standin_te.Linear(8, 8)
        with standin_te.fp8_model_init(enabled=False):
            nested_off = standin_te.Linear(8, 8)
    assert (outside.primary_quantized_weight, inside.primary_quantized_weight,
            nested_off.primary_quantized_weight) == (False, True, False)
    assert standin_te.Linear(8, 8).primary_quantized_weight is False


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
@pytest.mark.parametrize("grouped", [False, True])
def test_the_stand_in_te_computes_no_products(grouped):
    """Nothing the cross-check compares is a value: the stand-in's GEMMs are value-free."""
    from product_count import CountProducts
    from qaudit.runtime.standin import te_package as standin_te

    module = (standin_te.GroupedLinear(3, 8, 6, fuse_wgrad_accumulation=True, bias=False)
              if grouped else standin_te.Linear(8, 6, fuse_wgrad_accumulation=True, bias=False))
    module.weight.main_grad = torch.zeros_like(module.weight)
    x = torch.randn(5, 8, requires_grad=True)
    with CountProducts() as counter:
        out = module(x, [2, 0, 3], is_first_microbatch=True) if grouped else module(
            x, is_first_microbatch=True)
        out.sum().backward()
    assert counter.products == 0
    assert out.shape == (5, 6) and not out.any() and x.grad.shape == x.shape


def test_rule_qa030_turns_each_difference_into_an_error(monkeypatch):
    from qaudit.run.audit import run_audit
    from qaudit.run.options import AuditOptions
    from qaudit.commands.check import load_inputs
    from qaudit.crosscheck import CrossCheck
    from qaudit.judge.rules import judge

    config, recipe = load_inputs(str(REPO / "configs" / "gpt-small-bf16.yaml"))
    run = run_audit(config, recipe, AuditOptions())
    run.facts.cross_check = CrossCheck(megatron="0.19.2", location="/x", modules_compared=17,
                                       ran=True, differences=[
        Difference("decoder.layers.0.mlp.linear_fc1", "upstream_class",
                   "TELayerNormColumnParallelLinear", "TEColumnParallelLinear"),
        Difference("-", "build", "audits it", "rejects it: GPTModel: AssertionError: no")])
    found = [f for f in judge(run.facts) if f.rule == "QA030"]
    assert [(f.severity, f.module) for f in found] == [
        ("error", "decoder.layers.0.mlp.linear_fc1"), ("error", None)]
    assert found[0].message == ("class: qaudit TELayerNormColumnParallelLinear; Megatron 0.19.2 "
                                "TEColumnParallelLinear")
    assert "rejects it" in found[1].message


# --- with the installed Megatron --------------------------------------------------------------


def test_small_gpt_matches_megatron_0_19_as_legacy(megatron, monkeypatch, capsys):
    """0.19.2 passes the module's flag unless the transpose cache is off: qaudit's `legacy`."""
    code, report, _ = cross_check(monkeypatch, capsys, "configs/gpt-small-bf16.yaml",
                                  "--policy", "legacy")
    result = report["cross_check"]
    assert (code, result["megatron"], result["ran"]) == (0, "0.19.2", True)
    assert result["modules_compared"] == len(report["modules"]) == 17
    assert result["differences"] == []
    assert not [f for f in report["findings"] if f["rule"] == "QA030"]
    jsonschema = pytest.importorskip("jsonschema")
    from test_formats import report_schema

    jsonschema.validate(report, report_schema())


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_policy_mismatch_is_a_difference_per_module(megatron, monkeypatch, capsys):
    """`--policy config` (PR #6965, Megatron-LM main) is not what the installed 0.19.2 does:
    the cross-check says so for every TE module of a BF16 model, and the table how many."""
    code, report, _ = cross_check(monkeypatch, capsys, "configs/gpt-small-bf16.yaml",
                                  "--policy", "config")
    differences = report["cross_check"]["differences"]
    assert code == 1
    jsonschema = pytest.importorskip("jsonschema")
    from test_formats import report_schema

    jsonschema.validate(report, report_schema())
    assert {(d["field"], d["qaudit"], d["megatron"]) for d in differences} == {
        ("tracked", "no", "stale"), ("accumulation", "accumulate", "overwrite-first")}
    assert len(differences) == 2 * 16  # every TE module; the output layer is Megatron's own
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                  "--cross-check", "--policy", "config")
    assert ("cross-check: 17 modules compared with Megatron 0.19.2 (construction and a\n"
            "  training run): 32 difference(s)") in out


def test_a_wrong_module_name_in_qaudits_builder_is_caught(megatron, monkeypatch, capsys):
    from qaudit.model.language_model import LanguageModel

    original = LanguageModel.finish_init

    def misnamed(self, recipe):
        original(self, recipe)
        for module in self.audited_modules():
            module.fqn = module.fqn.replace("mlp.linear_fc2", "mlp.linear_fc_out")

    monkeypatch.setattr(LanguageModel, "finish_init", misnamed)
    code, report, _ = cross_check(monkeypatch, capsys, "configs/gpt-small-bf16.yaml",
                                  "--policy", "legacy")
    differences = report["cross_check"]["differences"]
    assert code == 1
    assert Difference("decoder.layers.0.mlp.linear_fc_out", "module", "TERowParallelLinear",
                      ABSENT).to_dict() in differences
    assert Difference("decoder.layers.3.mlp.linear_fc2", "module", ABSENT,
                      "TERowParallelLinear").to_dict() in differences
    assert len(differences) == 8


def test_recipe_binding_and_precision_agree_with_megatron(megatron, monkeypatch, capsys):
    """An FP8 model whose recipe forces attention to BF16: upstream's finish_init binds the
    same config to the same modules and they execute in the same precision."""
    code, report, _ = cross_check(monkeypatch, capsys, "configs/gpt-fp8-attention-bf16.yaml",
                                  "--policy", "legacy")
    assert report["cross_check"]["differences"] == []
    bound = {row["recipe"] for row in report["modules"]}
    assert bound - {"-"}, "the recipe binds some modules"


# FP8 only through a recipe (no fp8 in the config): before PR #5642 Megatron did not re-arm the
# flags of such a config, 0.19.2 does.
RECIPE_ONLY_FP8 = {"fp8-mlp.yaml": """\
    configs:
      fp8:
        transformer_engine_config_type: TEQuantizationParams
        training_recipe: {fp8_quantization_recipe: tensorwise, fp8_format: e4m3,
                          override_nonquantized_autocast: true}
    matchers:
      mlp: {type: glob, pattern: "*.mlp.*", config: fp8, enabled: true}
    """, "recipe-only.yaml": """\
    num_layers: 2
    hidden_size: 64
    ffn_hidden_size: 128
    num_attention_heads: 4
    quant_recipe: fp8-mlp.yaml
    """}


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_a_stale_weight_cache_is_a_difference(megatron, monkeypatch, capsys, write_yaml):
    """`--policy pre-5642` never re-arms the flag of a recipe-only FP8 config; 0.19.2 does.
    Besides `tracked`, the cross-check names what that does to TE's cached FP8 weight: from
    the second step on it is reused, where Megatron's run refreshes it."""
    path = [write_yaml(name, text) for name, text in RECIPE_ONLY_FP8.items()][-1]
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "pre-5642")
    differences = report["cross_check"]["differences"]
    caches = {(d["module"], d["qaudit"], d["megatron"]) for d in differences
              if d["field"] == "weight_cache"}
    assert caches == {(f"decoder.layers.{layer}.mlp.{name}", "refresh,reuse | reuse*2",
                       "refresh,reuse | refresh,reuse")
                      for layer in (0, 1) for name in ("linear_fc1", "linear_fc2")}
    assert {d["field"] for d in differences} == {"tracked", "weight_cache"}
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "legacy")
    assert report["cross_check"]["differences"] == []


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_primary_quantized_weights_agree_with_megatron(megatron, monkeypatch, capsys,
                                                       write_yaml):
    """fp8_param: Megatron builds the layers inside TE's quantized-init context, so no call
    has a weight cache; qaudit's `primary` is what Megatron's stand-in TE records."""
    path = write_yaml("primary.yaml", """\
        num_layers: 2
        hidden_size: 64
        num_attention_heads: 4
        fp8: e4m3
        fp8_recipe: tensorwise
        fp8_param: true
        """)
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "legacy")
    assert report["cross_check"]["ran"] and report["cross_check"]["differences"] == []
    monkeypatch.setattr("qaudit.runtime.standin.te_package._quantized_init", [False])
    monkeypatch.setattr("qaudit.runtime.standin.te_package.fp8_model_init",
                        lambda *a, **k: contextlib.nullcontext())
    # The stand-in's module objects are made once per process and the worker forks with them:
    # made again there, with the planted fp8_model_init (an earlier test in this process may
    # have made them: tests/test_standin_boot.py, a shuffled order found it).
    monkeypatch.setattr("qaudit.runtime.standin.te_package._PACKAGE", None)
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "legacy")
    assert {d["field"] for d in report["cross_check"]["differences"]} == {"weight_cache"}


def test_config_megatron_rejects_is_a_finding(megatron, monkeypatch, capsys, write_yaml):
    # A setting qaudit accepts without modelling it, which TransformerConfig refuses.
    path = write_yaml("pad.yaml", """\
        num_layers: 2
        hidden_size: 64
        num_attention_heads: 4
        num_moe_experts: 4
        moe_pad_expert_input_to_capacity: true
        """)
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "legacy")
    (difference,) = report["cross_check"]["differences"]
    assert code == 1 and difference["field"] == "build"
    assert "moe_expert_capacity_factor must be set" in difference["megatron"]


def test_unknown_field_of_the_installed_config_is_a_difference(megatron, monkeypatch, capsys,
                                                             write_yaml):
    """A field qaudit accepts (a newer release's, say) that the installed TransformerConfig
    does not have: the user's Megatron would not take the file."""
    import qaudit.load.config

    path = write_yaml("small.yaml", "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
                                    "a_field_of_a_newer_release: 1\n")
    monkeypatch.setattr(qaudit.load.config, "ACCEPTED_FIELDS",
                        qaudit.load.config.ACCEPTED_FIELDS | {"a_field_of_a_newer_release"})
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "legacy")
    assert code == 1
    assert report["cross_check"]["differences"] == [Difference(
        "-", "config field", "accepted", "not a field of the installed TransformerConfig: "
        "a_field_of_a_newer_release").to_dict()]


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_bundled_config_cross_checks(megatron, monkeypatch, capsys, config):
    code, report, _ = cross_check(monkeypatch, capsys, str(config), "--policy", "legacy")
    result = report["cross_check"]
    assert result["ran"] and result["modules_compared"] == len(report["modules"])
    assert result["differences"] == []


# --- the stand-in's place, and launch scripts through upstream's own argument parsing -------

LAUNCH_SCRIPT = """\
#!/bin/bash
MODEL_ARGS=(
    --num-layers 4 --hidden-size 512 --num-attention-heads 8
    --num-experts 4 --moe-grouped-gemm --moe-router-topk 2 --moe-layer-freq 2
    --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
    --fp8-format hybrid --fp8-recipe tensorwise
    --mtp-num-layers 1 --position-embedding-type rope
)
torchrun --nproc-per-node 8 pretrain_gpt.py ${MODEL_ARGS[@]} \\
    --micro-batch-size 1 --global-batch-size 8 --seq-length 1024 \\
    --max-position-embeddings 1024 --save $CHECKPOINT_DIR %s
"""


def write_script(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "train.sh"
    path.write_text(LAUNCH_SCRIPT % extra)
    return str(path)


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_launch_script_goes_through_megatrons_own_parser(megatron, monkeypatch, capsys,
                                                        tmp_path):
    """$CHECKPOINT_DIR is unknown: --save is left to upstream's default, as qaudit ignores it."""
    code, report, _ = cross_check(monkeypatch, capsys, write_script(tmp_path), "--policy",
                                  "legacy")
    result = report["cross_check"]
    assert (result["ran"], result["differences"]) == (True, [])
    assert result["modules_compared"] == len(report["modules"]) > 0
    assert any("experts.linear_fc1" in row["name"] for row in report["modules"])


def _report_and_outcome(program: str, arguments: list[str], megatron) -> tuple[dict, dict]:
    """Run `program` (Python source that runs qaudit's CLI, then prints one JSON line of what
    it saw) in a fresh process with `megatron` importable: qaudit's JSON report and that line."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(megatron)])}
    done = subprocess.run([sys.executable, "-c", program, *arguments], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-2000:]
    return json.loads("\n".join(lines[:-1])), json.loads(lines[-1])


# Run in a fresh process whose upstream side stays in it (no fork), so that what it imported,
# left set and called is visible afterwards.
_IN_PROCESS_UPSTREAM = """
import json, multiprocessing, sys
multiprocessing.get_all_start_methods = lambda: ["spawn"]
import torch
from qaudit.crosscheck import upstream_build
updates = []
real_update = upstream_build.apply_update
upstream_build.apply_update = lambda params: (updates.append(1), real_update(params))
from qaudit.cli import main
sys.argv = ["qaudit", "check", sys.argv[1], "--cross-check", "--format", "json",
            "--policy", "legacy"]
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "inductor": "torch._inductor" in sys.modules,
                  "deterministic": torch.are_deterministic_algorithms_enabled(),
                  "updates": len(updates)}))
"""


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_the_stand_in_side_costs_no_inductor_import_no_values_and_leaves_torch_as_found(
        megatron, tmp_path):
    """--deterministic-mode: validate_args calls torch.use_deterministic_algorithms, whose
    inductor half was most of a second of import; the flag is put back after the build. On
    the value-free stand-in TE the loop updates no weight."""
    script = write_script(tmp_path, "--deterministic-mode")
    report, outcome = _report_and_outcome(_IN_PROCESS_UPSTREAM, [script], megatron)
    assert report["cross_check"]["ran"] and report["cross_check"]["differences"] == []
    assert outcome == {"code": 0, "inductor": False, "deterministic": False, "updates": 0}


_FORKED_UPSTREAM = """
import json, sys
from qaudit.cli import main
sys.argv = ["qaudit", "check", *sys.argv[1:], "--cross-check", "--format", "json"]
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "dtensor": "torch.distributed.tensor" in sys.modules,
                  "megatron": sorted(n for n in sys.modules if n.split(".")[0] == "megatron")}))
"""


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_torchs_part_of_megatrons_import_is_paid_once_per_run(megatron):
    """Before the worker forks, the audit process imports the torch packages megatron.core
    imports (a run over many configs then pays them once), and never Megatron itself."""
    configs = [str(REPO / "configs" / name)
               for name in ("gpt-small-bf16.yaml", "gpt-mtp-bf16.yaml")]
    report, outcome = _report_and_outcome(_FORKED_UPSTREAM, configs, megatron)
    files = report["files"]
    assert all(entry["report"]["cross_check"]["ran"] for entry in files)
    assert outcome["dtensor"] and outcome["megatron"] == []


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_a_flag_qaudit_misreads_is_caught(megatron, monkeypatch, capsys, tmp_path):
    """qaudit's flag translation is checked by upstream's parser: dropping --moe-grouped-gemm
    on qaudit's side builds sequential experts that Megatron does not build."""
    import importlib

    translation = importlib.import_module("qaudit.load.sources.translate")
    original = translation.Translator.run

    def without_grouped_gemm(self):
        result = original(self)
        result.mapping.pop("moe_grouped_gemm", None)
        return result

    monkeypatch.setattr(translation.Translator, "run", without_grouped_gemm)
    code, report, _ = cross_check(monkeypatch, capsys, write_script(tmp_path), "--policy",
                                  "legacy")
    differences = report["cross_check"]["differences"]
    assert code == 1
    assert {"module": "decoder.layers.0.mlp.experts.linear_fc1", "field": "module",
            "qaudit": "(not built)", "megatron": "TEColumnParallelGroupedLinear"} in differences
    assert any(d["module"].endswith("local_experts.0.linear_fc1") for d in differences)


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_a_command_line_megatron_refuses_is_a_finding(megatron, monkeypatch, capsys, tmp_path):
    """A refusal qaudit does not repeat (docs/upstream-checks.md): megatron-core 0.19.2's
    validate_args refuses --fp8-param-gather without a distributed optimizer outside inference
    mode. (The batch-size ramp beside --global-batch-size this test once used is exit 2 in
    qaudit itself now: tests/test_startup_refusals.py.)"""
    script = write_script(tmp_path, "--fp8-param-gather")
    code, report, _ = cross_check(monkeypatch, capsys, script, "--policy", "legacy")
    (difference,) = report["cross_check"]["differences"]
    assert code == 1 and difference["field"] == "build"
    assert difference["megatron"].startswith("rejects it: validate_args:")
    assert "--fp8-param-gather only supported with distributed optimizer" \
        in difference["megatron"]


def test_the_stand_in_is_gone_after_the_cross_check(megatron, monkeypatch, capsys):
    cross_check(monkeypatch, capsys, "configs/gpt-small-bf16.yaml", "--policy", "legacy")
    assert "transformer_engine" not in sys.modules
    assert "fused_weight_gradient_mlp_cuda" not in sys.modules
    import torch

    assert torch.compile.__module__.startswith("torch")
    assert not torch.distributed.is_initialized()


@pytest.mark.slow  # the quick check's cost (docs/performance.md); CI runs it
def test_the_report_names_the_te_megatron_ran_on(megatron, monkeypatch, capsys):
    """Without TE importable, Megatron's TE is qaudit's stand-in package, and the report says
    so (with TE's Python importable: tests/test_crosscheck_te_cpu.py)."""
    code, report, _ = cross_check(monkeypatch, capsys, "configs/gpt-small-bf16.yaml",
                                  "--policy", "legacy")
    assert code == 0
    assert report["cross_check"]["te"].startswith("qaudit's stand-in transformer_engine")
    code, out, _ = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                  "--cross-check", "--policy", "legacy")
    assert "Megatron's TE: qaudit's stand-in transformer_engine" in " ".join(out.split())


def test_a_real_te_without_cuda_is_never_shadowed(megatron, monkeypatch, capsys):
    monkeypatch.setattr("qaudit.runtime.standin.side.real_te_available", lambda: True)
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--cross-check")
    assert code == 3 and not out
    assert "real Transformer Engine is installed but CUDA is not usable" in err


# --- defects of the cross-check's own stand-ins, found by the corpus sweep -------------------

def test_fp8_output_proj_with_mxfp8_is_not_a_false_rejection(megatron, monkeypatch, capsys,
                                                           write_yaml):
    """Megatron's TE output layer reads the TE Linear's `tp_size`: the stand-in keeps it, so
    0.19.2 builds this config (a stand-in without it made every such config a QA030)."""
    path = write_yaml("lmhead.yaml", """\
        num_layers: 2
        hidden_size: 64
        num_attention_heads: 4
        fp8: hybrid
        fp8_recipe: mxfp8
        fp8_output_proj: true
        share_embeddings_and_output_weights: false
        """)
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "legacy")
    result = report["cross_check"]
    assert result["ran"], result
    assert result["differences"] == []
    assert "QA030" not in {f["rule"] for f in report["findings"]}


def test_a_megatron_module_importing_triton_at_its_top_is_served_as_kernels(tmp_path,
                                                                           monkeypatch):
    """Megatron main's Mamba kernels live in new places: any Megatron module whose source
    imports triton at its top level is served as a kernel module, found by reading it."""
    import importlib

    from qaudit.runtime.standin import boot as environment

    package = tmp_path / "megatron" / "core" / "ssm" / "ops" / "mamba2"
    package.mkdir(parents=True)
    for folder in (tmp_path / "megatron", tmp_path / "megatron" / "core",
                   tmp_path / "megatron" / "core" / "ssm", tmp_path / "megatron" / "core" / "ssm" / "ops",
                   package):
        (folder / "__init__.py").write_text("")
    (package / "ssd_new.py").write_text("import triton\nimport triton.language as tl\n")
    (package / "guarded.py").write_text("try:\n    import triton\nexcept ImportError:\n    triton = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in list(sys.modules):
        if name == "megatron" or name.startswith("megatron."):
            monkeypatch.delitem(sys.modules, name)
    before = set(sys.modules)
    try:
        with environment._triton_kernel_finder():
            kernels = importlib.import_module("megatron.core.ssm.ops.mamba2.ssd_new")
            guarded = importlib.import_module("megatron.core.ssm.ops.mamba2.guarded")
    finally:
        # The fake package must not outlive the test: a later cross-check's worker would
        # inherit it in place of the real Megatron.
        for name in set(sys.modules) - before:
            if name == "megatron" or name.startswith("megatron."):
                del sys.modules[name]
    assert getattr(kernels, "__qaudit_standin__", False)
    assert guarded.triton is None  # a guarded import runs as written


@pytest.mark.parametrize("strategy", ["no_shard", "optim_grads"])
def test_megatron_fsdp_output_layer_overwrite_is_megatrons_own_decision(megatron, monkeypatch,
                                                                         capsys, write_yaml,
                                                                         strategy):
    """Under Megatron-FSDP upstream's ColumnParallelLinear writes its wgrad with
    `te_general_gemm(..., out=main_grad)` (accumulate=False): the stand-in GEMM carries out the
    arguments upstream passes, and qaudit's row says the same."""
    path = write_yaml("fsdp.yaml", f"""\
        num_layers: 2
        hidden_size: 64
        num_attention_heads: 4
        mtp_num_layers: 2
        use_megatron_fsdp: true
        data_parallel_sharding_strategy: {strategy}
        """)
    code, report, _ = cross_check(monkeypatch, capsys, path, "--policy", "legacy")
    result = report["cross_check"]
    assert result["ran"] and result["differences"] == [], result
    rows = {r["name"]: r for r in report["modules"]}
    assert rows["output_layer"]["accumulation"] == "overwrite-always"
    assert code == 1 and any(f["rule"] == "QA001" and f["module"] == "output_layer"
                             for f in report["findings"])
