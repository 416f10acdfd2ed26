"""The bundled Nemotron-3 Super NVFP4 example (configs/bridge-super-nvfp4-mtp-bf16.yaml, issue 37
item 5): its verdict under each Megatron the README's table names, and that its values are the
recipe's (the quant recipe Bridge attaches, the model shape Megatron-LM's own test of that model
uses) wherever the shared corpus is present to compare with."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cli_helpers import REPO, run_in_process
from qaudit.load import load_files
from qaudit.load.recipe import QuantRecipe, load_recipe

EXAMPLE = "configs/bridge-super-nvfp4-mtp-bf16.yaml"
RECIPE_FILE = "configs/recipes/super-nvfp4-te-quant.yaml"
CORPUS = REPO.parent / "shared" / "corpus"
BRIDGE_TE_QUANT = CORPUS / "bridge" / "repo" / "src" / "megatron" / "bridge" / "perf_recipes" \
    / "nemotronh" / "te_quant.cfg"
MEGATRON_SUPER_TEST = CORPUS / "megatron" / "functional_tests" \
    / "nemotron__nemotron3_super_release_gb200.yaml"
# The one MTP layer's TE modules (applied at two depths): eh_proj, the '*E' pattern's attention
# and LatentMoE (latent projections, grouped experts, shared experts).
MTP_MODULES = {
    "mtp.layers.0.eh_proj",
    "mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_qkv",
    "mtp.layers.0.mtp_model_layer.layers.0.self_attention.linear_proj",
    *(f"mtp.layers.0.mtp_model_layer.layers.1.mlp.{name}" for name in (
        "fc1_latent_proj", "fc2_latent_proj", "experts.linear_fc1", "experts.linear_fc2",
        "shared_experts.linear_fc1", "shared_experts.linear_fc2")),
}


def audit(monkeypatch, capsys, *args: str) -> tuple[int, dict]:
    code, out, err = run_in_process(monkeypatch, capsys, "check", EXAMPLE, *args,
                                    "--format", "json")
    assert code in (0, 1), err
    return code, json.loads(out)


def failing(report: dict, rule: str) -> set[str]:
    return {row["name"] for row in report["modules"] if row["verdict"] == rule}


@pytest.mark.parametrize("megatron", [(), ("--megatron", "0.19.2"), ("--megatron", "main")],
                         ids=["bridge-pin", "0.19.2", "main-6965"])
def test_bf16_mtp_modules_lose_gradients_under_every_released_megatron_and_main(
        monkeypatch, capsys, megatron):
    """Megatron-Bridge's pin, megatron-core 0.19.2 and main with PR #6965: the recipe keeps
    mtp.* in BF16, but the flag is still tracked for them, so call 1 of 2 gets True."""
    code, report = audit(monkeypatch, capsys, *megatron)
    assert code == 1
    assert failing(report, "QA001") == MTP_MODULES
    mtp = [row for row in report["modules"] if row["name"].startswith("mtp.")]
    assert {row["name"] for row in mtp} == MTP_MODULES
    assert all(row["precision"] == "bf16" and row["calls_per_microbatch"] == 2 for row in mtp)
    errors = {f["rule"] for f in report["findings"] if f["severity"] == "error"}
    assert errors == {"QA001"}


def test_pr_7353_passes_none_to_the_bf16_mtp_modules(monkeypatch, capsys):
    code, report = audit(monkeypatch, capsys, "--policy", "module")
    assert code == 0 and not failing(report, "QA001")
    mtp = {row["name"]: row for row in report["modules"] if row["name"].startswith("mtp.")}
    assert set(mtp) == MTP_MODULES
    assert {row["accumulation"] for row in mtp.values()} == {"accumulate"}


def test_the_recipes_mxfp8_out_proj_stays_bf16_in_the_last_14_layers(monkeypatch, capsys):
    """The recipe's own second finding: te_quant.cfg asks for MXFP8 on every Mamba out_proj,
    but the 14 BF16 layers at the end run in a BF16 context and the config does not override
    it, so their out_proj stays BF16 (QA015)."""
    _, report = audit(monkeypatch, capsys)
    warnings = [f for f in report["findings"] if f["severity"] == "warning"]
    # Besides QA052: Bridge #6103 (the MTP loss over padding), on every Bridge MTP dump.
    assert [f["rule"] for f in warnings] == ["QA015", "QA052"]
    precision = {row["name"]: row["precision"] for row in report["modules"]}
    out_projs = {name: value for name, value in precision.items()
                 if name.startswith("decoder.") and name.endswith("mixer.out_proj")}
    assert len(out_projs) == 40
    pattern = load_files(EXAMPLE)[0].hybrid_layer_pattern
    last_14 = {index for index in range(88 - 14, 88)}
    for name, value in out_projs.items():
        layer = int(name.split(".")[2])
        assert pattern[layer] == "M"
        assert value == ("bf16" if layer in last_14 else "fp8/mxfp8"), name


def _payloads(recipe: QuantRecipe) -> list[tuple[str, object]]:
    """What matching does with a recipe: each pattern in order and the payload it binds."""
    return [(matcher.pattern, replace(recipe.config_for(matcher).training, line=None))
            for matcher in recipe.matchers]


def test_the_recipe_file_is_the_serialized_recipe(monkeypatch, capsys):
    """configs/recipes/ holds the same recipe in --te-precision-config-file form; auditing the
    dump with it (--recipe wins over the serialized one) gives the same module table, but for
    the config names, which are ours."""
    _, serialized = load_files(EXAMPLE)
    assert _payloads(serialized) == _payloads(load_recipe(Path(REPO / RECIPE_FILE)))
    _, embedded = audit(monkeypatch, capsys)
    code, from_file = audit(monkeypatch, capsys, "--recipe", RECIPE_FILE)
    def unnamed(report: dict) -> list[dict]:
        return [{**row, "recipe": None} for row in report["modules"]]

    assert code == 1 and unnamed(from_file) == unnamed(embedded)
    assert {row["recipe"] for row in from_file["modules"]} == {"-", "high_precision",
                                                               "mxfp8_blocks"}


@pytest.mark.skipif(not BRIDGE_TE_QUANT.is_file(), reason=f"corpus not found at {CORPUS}")
def test_the_serialized_recipe_is_bridges_te_quant_cfg():
    _, serialized = load_files(EXAMPLE)
    assert _payloads(serialized) == _payloads(load_recipe(BRIDGE_TE_QUANT))


@pytest.mark.skipif(not MEGATRON_SUPER_TEST.is_file(), reason=f"corpus not found at {CORPUS}")
def test_the_model_shape_is_megatron_lms_own_super_test():
    """Megatron-LM's release test of the same model (MXFP8 there, NVFP4 in Bridge's recipe):
    the same layer pattern and MoE, MTP at two depths, the last 14 layers BF16."""
    args = yaml.safe_load(MEGATRON_SUPER_TEST.read_text())["MODEL_ARGS"]
    model = yaml.safe_load((REPO / EXAMPLE).read_text())["model"]
    precision = yaml.safe_load((REPO / EXAMPLE).read_text())["mixed_precision"]
    main, *mtp = args["--hybrid-layer-pattern"].split("/")
    assert model["hybrid_layer_pattern"] == main and len(main) == model["num_layers"]
    assert model["mtp_hybrid_override_pattern"] == mtp[0] and len(mtp) == model["mtp_num_layers"]
    for flag, field in (("--num-layers", "num_layers"), ("--hidden-size", "hidden_size"),
                        ("--ffn-hidden-size", "ffn_hidden_size"),
                        ("--num-attention-heads", "num_attention_heads"),
                        ("--num-query-groups", "num_query_groups"),
                        ("--kv-channels", "kv_channels"), ("--mamba-num-heads", "mamba_num_heads"),
                        ("--num-experts", "num_moe_experts"), ("--moe-router-topk", "moe_router_topk"),
                        ("--moe-latent-size", "moe_latent_size"),
                        ("--moe-shared-expert-intermediate-size",
                         "moe_shared_expert_intermediate_size"),
                        ("--tensor-model-parallel-size", "tensor_model_parallel_size"),
                        ("--expert-model-parallel-size", "expert_model_parallel_size")):
        assert model[field] == args[flag], field
    assert precision["num_layers_at_end_in_bf16"] == args["--num-layers-at-end-in-bf16"]
    assert precision["num_layers_at_start_in_bf16"] == args["--num-layers-at-start-in-bf16"]


@pytest.mark.slow  # two --verify runs of 346 modules
@pytest.mark.parametrize("policy", ["legacy", "module"])
def test_verify_measures_the_loss_on_the_mtp_modules_only(monkeypatch, capsys, policy):
    """--verify against unfused autograd: under 0.19.x's tracking each BF16 MTP module loses a
    large share of its gradient (measured 35-44 %); with PR #7353 none does, and no other
    module loses anything under either."""
    _, report = audit(monkeypatch, capsys, "--verify", "--policy", policy)
    errors = {row["name"]: row["grad_rel_error"] for row in report["modules"]}
    assert len(errors) == 346 and all(value is not None for value in errors.values())
    others = [value for name, value in errors.items() if name not in MTP_MODULES]
    assert max(others) < 1e-6
    mtp = [errors[name] for name in MTP_MODULES]
    if policy == "legacy":
        assert min(mtp) > 0.2
        confirmed = [f for f in report["findings"] if f["rule"] == "QA001"]
        assert len(confirmed) == 9 and all(f["evidence"].startswith("confirmed")
                                           for f in confirmed)
    else:
        assert max(mtp) < 1e-6
