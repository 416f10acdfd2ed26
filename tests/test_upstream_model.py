"""qaudit's model against Megatron's own code (issue 13, docs/upstream-model.md): MLA classes,
the fused MLA down projection, the flag route's argument rules, pipeline layouts and the
modelopt spec. Each test states the upstream fact it pins."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from qaudit.audit import AuditOptions, audit_files, load_inputs
from qaudit.errors import InputError
from cli_helpers import run_in_process

FAST = AuditOptions(steps=1, microbatches=2)


@pytest.fixture
def write(tmp_path: Path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return str(path)
    return write


def types_of(report, prefix: str) -> dict[str, str]:
    """Row name after `prefix` -> upstream class, for the rows under `prefix`."""
    return {row.name[len(prefix):]: row.type for row in report.modules
            if row.name.startswith(prefix)}


# --- multi-latent attention: qk_layernorm and the fused down projection -----------------------

MLA = """\
num_layers: 2
hidden_size: 64
num_attention_heads: 4
multi_latent_attention: true
q_lora_rank: 32
fp8: e4m3
fp8_recipe: blockwise
"""
ATTN = "decoder.layers.0.self_attention."


def test_mla_up_projections_fuse_a_norm_only_with_qk_layernorm(write):
    plain = types_of(audit_files(write("a.yaml", MLA), None, FAST), ATTN)
    assert plain == {"linear_q_down_proj": "TELinear", "linear_q_up_proj": "TEColumnParallelLinear",
                     "linear_kv_down_proj": "TELinear",
                     "linear_kv_up_proj": "TEColumnParallelLinear",
                     "linear_proj": "TERowParallelLinear"}
    normed = types_of(audit_files(write("b.yaml", MLA + "qk_layernorm: true\n"), None, FAST), ATTN)
    assert normed == {**plain, "linear_q_up_proj": "TELayerNormColumnParallelLinear",
                      "linear_kv_up_proj": "TELayerNormColumnParallelLinear"}


def test_mla_single_q_projection_fuses_the_norm_with_qk_layernorm(write):
    # mla_qk_norm_config.py: without q_lora_rank the query norm goes into linear_q_proj.
    base = MLA.replace("q_lora_rank: 32", "q_lora_rank: null")
    assert types_of(audit_files(write("a.yaml", base), None, FAST), ATTN)["linear_q_proj"] == \
        "TEColumnParallelLinear"
    assert types_of(audit_files(write("b.yaml", base + "qk_layernorm: true\n"), None, FAST),
                    ATTN)["linear_q_proj"] == "TELayerNormColumnParallelLinear"


@pytest.mark.parametrize("qk_layernorm, up_class", [
    (False, "TEColumnParallelLinear"), (True, "TELayerNormColumnParallelLinear")])
def test_mla_down_proj_fusion_builds_one_fused_down_projection(write, qk_layernorm, up_class):
    text = MLA + "mla_down_proj_fusion: true\n" + ("qk_layernorm: true\n" if qk_layernorm else "")
    report = audit_files(write("a.yaml", text), None, FAST)
    assert types_of(report, ATTN) == {
        "linear_qkv_down_proj": "TELayerNormColumnParallelLinear", "linear_q_up_proj": up_class,
        "linear_kv_up_proj": up_class, "linear_proj": "TERowParallelLinear"}
    rows = {r.name: r for r in report.modules}
    assert rows[ATTN + "linear_qkv_down_proj"].precision == "fp8/blockwise"
    assert rows[ATTN + "linear_qkv_down_proj"].calls_per_microbatch == 1


def test_fused_down_projection_is_what_recipes_match(write):
    recipe = write("r.yaml", """
        configs:
          hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
        matchers:
          down: {type: glob, pattern: "*linear_qkv_down_proj", config: hp, enabled: true}
        """)
    report = audit_files(write("a.yaml", MLA + "mla_down_proj_fusion: true\n"), recipe, FAST)
    rows = {r.name: r for r in report.modules}
    assert rows[ATTN + "linear_qkv_down_proj"].precision == "bf16"
    assert rows[ATTN + "linear_qkv_down_proj"].recipe == "hp"
    assert rows[ATTN + "linear_q_up_proj"].precision == "fp8/blockwise"
    assert not any(f.rule == "QA011" for f in report.findings)  # the matcher matches


@pytest.mark.parametrize("text, message", [
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nmla_down_proj_fusion: true\n",
     r"a.yaml:4: key 'mla_down_proj_fusion': needs multi_latent_attention"),
    (MLA.replace("q_lora_rank: 32", "q_lora_rank: null") + "mla_down_proj_fusion: true\n",
     r"key 'mla_down_proj_fusion': needs q_lora_rank \(Megatron's FusedMLASelfAttention"),
])
def test_mla_down_proj_fusion_needs_what_upstream_asserts(write, text, message):
    with pytest.raises(InputError, match=message):
        load_inputs(write("a.yaml", text))


def test_mla_flags_give_the_same_rows_as_the_yaml(write):
    yaml_text = MLA + "kv_lora_rank: 32\nqk_layernorm: true\nmla_down_proj_fusion: true\n"
    script = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
              "--num-attention-heads 4 --multi-latent-attention --q-lora-rank 32 \\\n"
              "  --kv-lora-rank 32 --qk-layernorm --mla-down-proj-fusion --fp8-format e4m3 "
              "--fp8-recipe blockwise\n")
    rows = [json.dumps(audit_files(write(name, text), None, FAST).to_dict()["modules"],
                       sort_keys=True) for name, text in (("m.yaml", yaml_text), ("t.sh", script))]
    assert rows[0] == rows[1] and "linear_qkv_down_proj" in rows[0]
    config, _ = load_inputs(write("u.sh", script))
    assert config.source.notes == []  # both flags are modelled now, no QA090


def test_mla_down_proj_fusion_flag_without_mla_is_refused_at_the_flag(write):
    script = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 \\\n"
              "  --num-attention-heads 4 --mla-down-proj-fusion\n")
    with pytest.raises(InputError, match=r"t.sh:3: key '--mla-down-proj-fusion': needs "):
        load_inputs(write("t.sh", script))


def test_cli_json_shows_the_fused_projection(write, monkeypatch, capsys):
    path = write("a.yaml", MLA + "mla_down_proj_fusion: true\n")
    code, out, _ = run_in_process(monkeypatch, capsys, "check", path, "--format", "json",
                                  "--steps", "1", cwd=None)
    assert code == 0
    modules = {m["name"]: m["type"] for m in json.loads(out)["modules"]}
    assert modules[ATTN + "linear_qkv_down_proj"] == "TELayerNormColumnParallelLinear"
    assert ATTN + "linear_q_down_proj" not in modules
