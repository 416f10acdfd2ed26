"""Real model shapes: MLA names, memory guard for --full-size, parameter counts (issue 6)."""

from __future__ import annotations

import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_files, load_inputs
from qaudit.errors import InputError
from qaudit.plan.sizes import model_params

MLA = """\
num_layers: 2
hidden_size: 256
num_attention_heads: 8
multi_latent_attention: true
fp8: e4m3
fp8_recipe: blockwise
"""


def names(report) -> list[str]:
    return [row.name for row in report.modules]


def test_mla_module_names_with_q_down_projection(write_yaml):
    report = audit_files(write_yaml("c.yaml", MLA + "q_lora_rank: 64\n"))
    prefix = "decoder.layers.0.self_attention."
    assert [n[len(prefix):] for n in names(report) if n.startswith(prefix)] == [
        "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj",
        "linear_proj"]
    types = {r.name[len(prefix):]: r.type for r in report.modules if r.name.startswith(prefix)}
    assert types["linear_q_down_proj"] == "TELinear"
    assert types["linear_kv_up_proj"] == "TEColumnParallelLinear"  # no qk_layernorm: no fused norm
    assert all(r.precision == "fp8/blockwise" for r in report.modules if r.name.startswith(prefix))


def test_mla_without_q_lora_uses_one_q_projection(write_yaml):
    report = audit_files(write_yaml("c.yaml", MLA + "q_lora_rank: null\n"))
    assert "decoder.layers.1.self_attention.linear_q_proj" in names(report)
    assert not any("q_down" in n for n in names(report))


def test_deepseek_v3_parameter_count_matches_its_published_size(repo_configs):
    config, _ = load_inputs(str(repo_configs / "deepseek-v3-mtp-fp8-per-depth.yaml"))
    config.mtp_num_layers = 1  # the published model has one MTP module
    # 671 B main model + 14 B MTP module, as DeepSeek-V3's report gives it.
    assert 680e9 < model_params(config) < 690e9


def test_llama_405b_parameter_count(repo_configs):
    config, _ = load_inputs(str(repo_configs / "llama-3.1-405b-fp8.yaml"))
    assert 400e9 < model_params(config) < 410e9


def test_full_size_with_verify_refuses_what_cannot_fit_before_building(repo_configs, monkeypatch):
    """--verify needs gradient values, so its real-width build is on the CPU and must fit
    (without --verify, --full-size builds on the meta device: tests/test_full_size.py)."""
    monkeypatch.setattr("qaudit.run.audit.available_memory_bytes", lambda: 8 * 2**30)
    with pytest.raises(InputError) as error:
        audit_files(str(repo_configs / "deepseek-v3-mtp-fp8.yaml"),
                    options=AuditOptions(full_size=True, verify=True))
    message = str(error.value)
    assert message.startswith("configs/deepseek-v3-mtp-fp8.yaml") or "deepseek-v3-mtp-fp8.yaml" in message
    assert "GiB" in message and "8.0 GiB is available" in message


def test_full_size_builds_real_widths_when_they_fit(write_yaml):
    text = "num_layers: 2\nhidden_size: 96\nffn_hidden_size: 200\nnum_attention_heads: 3\n"
    report = audit_files(write_yaml("c.yaml", text), options=AuditOptions(full_size=True, verify=True))
    assert report.counts().get("error", 0) == 0
    assert all(r.grad_rel_error is None or r.grad_rel_error < 1e-4 for r in report.modules)
