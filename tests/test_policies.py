"""Tracking policies (docs/semantics.md §2.3) and PR #7353's contract (§2.4)."""

from __future__ import annotations



import pytest
import torch

from qaudit.load.config import ModelConfig
from qaudit.plan.policies import POLICIES, is_first_microbatch_tracked


def config(**fields) -> ModelConfig:
    return ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, **fields)


class FakeModule:
    def __init__(self, cfg: ModelConfig, quantized, armed=True, disabled=False):
        self.config = cfg
        self.is_first_microbatch = armed
        self.disable_parameter_transpose_cache = disabled
        self._quantized = quantized

    def will_execute_quantized(self, is_context_quantized: bool) -> bool:
        return self._quantized(is_context_quantized) if callable(self._quantized) else self._quantized


# --- the seven #7353 unit-test contracts ------------------------------------------------------

def test_unquantized_config_is_untracked():
    assert is_first_microbatch_tracked(config()) is False


@pytest.mark.parametrize("fields", [{"fp8": "hybrid"}, {"fp4": "e2m1"}, {"quant_recipe": "r.yaml"}])
def test_model_wide_answer_without_module(fields):
    assert is_first_microbatch_tracked(config(**fields)) is True


def test_kitchen_is_tracked_even_with_module():
    cfg = config(use_kitchen=True)
    assert is_first_microbatch_tracked(cfg, FakeModule(cfg, False), False) is True


def test_recipe_quantizing_unquantized_layer_is_tracked():
    cfg = config(quant_recipe="r.yaml")
    assert is_first_microbatch_tracked(cfg, FakeModule(cfg, True), False) is True


def test_recipe_forcing_high_precision_under_fp8_is_untracked():
    cfg = config(fp8="e4m3", quant_recipe="r.yaml")
    assert is_first_microbatch_tracked(cfg, FakeModule(cfg, False), True) is False


@pytest.mark.parametrize("context", [True, False])
def test_module_without_recipe_follows_autocast(context):
    cfg = config(fp8="e4m3")
    assert is_first_microbatch_tracked(cfg, FakeModule(cfg, lambda ctx: ctx), context) is context


def test_module_lacking_hook_falls_back_to_config():
    assert is_first_microbatch_tracked(config(fp8="e4m3"), torch.nn.Linear(2, 2), False) is True


# --- the value each policy passes (§2.3 table) -------------------------------------------------

CASES = [
    # (config fields, module quantized, expected legacy, config, module) with the flag armed
    ({"fp8": "e4m3"}, True, True, True, True),
    ({"fp8": "e4m3"}, False, True, True, None),
    ({}, False, True, None, None),
    ({"fp8": "e4m3", "disable_parameter_transpose_cache": True}, True, None, None, None),
]


@pytest.mark.parametrize("fields, quantized, legacy, cfg_policy, module", CASES)
def test_flag_passed_by_each_policy(fields, quantized, legacy, cfg_policy, module):
    cfg = config(**fields)
    fake = FakeModule(cfg, quantized, disabled=cfg.disable_parameter_transpose_cache)
    assert POLICIES["legacy"].flag_to_pass(fake, quantized) is legacy
    assert POLICIES["config"].flag_to_pass(fake, quantized) is cfg_policy
    assert POLICIES["module"].flag_to_pass(fake, quantized) is module


@pytest.mark.parametrize("fields, rearmed", [({}, False), ({"fp8": "e4m3"}, True),
                                             ({"fp4": "e2m1"}, True), ({"use_kitchen": True}, True),
                                             ({"quant_recipe": "r.yaml"}, True)])
def test_all_upstream_policies_rearm_with_the_config_predicate(fields, rearmed):
    for name in ("legacy", "config", "module"):
        assert POLICIES[name].rearms(config(**fields)) is rearmed
    # Before PR #5642 a quant_recipe alone did not re-arm (issue #5641).
    assert POLICIES["pre-5642"].rearms(config(**fields)) is (rearmed and "quant_recipe" not in fields)


def test_disarmed_module_passes_false():
    cfg = config(fp8="e4m3")
    assert POLICIES["config"].flag_to_pass(FakeModule(cfg, True, armed=False), True) is False

