"""Identical sequential experts observed once per class (docs/observed-once.md): the report
equals the one of a run where every expert runs, the report says which modules were inferred,
and an expert made different (its recipe, its precision, its call count, a hook) is a class of
its own and runs itself. Work is counted (calls recorded, bytes held), never timed."""

from __future__ import annotations

import gc
import json
import types

import pytest
import torch

import qaudit.run.audit as audit_module
from qaudit.commands.check import audit_files
from qaudit.model.identical import expert_classes, same_structure
from qaudit.render import render
from qaudit.run.audit import run_audit
from qaudit.commands.inputs import load_inputs
from qaudit.run.options import AuditOptions

# Sequential experts on the TE spec (TE wrappers, recipes bind) and on the modelopt spec
# (Megatron's own linears), with the settings that change what an expert records.
TE_SEQUENTIAL = """\
num_layers: 3
hidden_size: 64
num_attention_heads: 4
num_moe_experts: 8
moe_layer_freq: [0, 1, 1]
moe_router_topk: 2
add_bias_linear: false
fp8: e4m3
fp8_recipe: tensorwise
"""
MODELOPT = ("--num-layers 3 --hidden-size 64 --num-attention-heads 4 --num-experts 8 "
            "--moe-layer-freq ([0]*1+[1]*2) --moe-router-topk 2 --disable-bias-linear --bf16 "
            "--moe-shared-expert-intermediate-size 32 --swiglu --seq-length 64 "
            "--max-position-embeddings 64 --micro-batch-size 1 --recompute-activations "
            "--moe-layer-recompute")
EXPERT = "decoder.layers.{}.mlp.experts.local_experts.{}."
EVERY_EXPERT = AuditOptions(observe_once=False)


def modelopt_conf(write_yaml, body: str = MODELOPT) -> str:
    return write_yaml("examples/post_training/modelopt/conf/org/Model.sh",
                      f'#!/bin/bash\nMODEL_ARGS=" \\\n    {body} \\\n"\n')


def without_observation(report) -> str:
    data = report.to_dict()
    assert data.pop("observation", None) is not None or report.observation is None
    return json.dumps(data, indent=2)


def rows(report) -> dict:
    return {row.name: row for row in report.modules}


@pytest.mark.parametrize("extra", ["", "gradient_accumulation_fusion: false\n",
                                   "delay_wgrad_compute: true\n",
                                   "recompute_granularity: selective\nrecompute_modules: [moe]\n",
                                   "use_megatron_fsdp: true\n"
                                   "data_parallel_sharding_strategy: optim_grads_params\n"])
def test_te_spec_report_equals_every_expert_run(write_yaml, extra):
    path = write_yaml("c.yaml", TE_SEQUENTIAL + extra)
    once, every = audit_files(path), audit_files(path, None, EVERY_EXPERT)
    assert every.observation is None
    assert once.observation["modules_inferred"] == 2 * 7 * 2  # 2 layers x 7 experts x fc1, fc2
    assert without_observation(once) == without_observation(every)


def test_modelopt_spec_report_equals_every_expert_run(write_yaml):
    path = modelopt_conf(write_yaml)
    once, every = audit_files(path), audit_files(path, None, EVERY_EXPERT)
    assert rows(once)[EXPERT.format(1, 5) + "linear_fc1"].type == "ColumnParallelLinear"
    assert without_observation(once) == without_observation(every)
    assert once.observation == {
        "modules_observed": len(once.modules) - 28, "modules_inferred": 28,
        "classes": [{"observed": f"decoder.layers.{layer}.mlp.experts.local_experts.0",
                     "inferred": f"decoder.layers.{layer}.mlp.experts.local_experts.[1-7]",
                     "experts": 7, "modules": 14} for layer in (1, 2)]}


def test_only_the_observed_experts_run(write_yaml):
    """Counted: the recorder holds calls of expert 0 of each layer only; the others' rows come
    from those records (the same list, filed under each name)."""
    config, recipe = load_inputs(write_yaml("c.yaml", TE_SEQUENTIAL))
    run = run_audit(config, recipe, AuditOptions())
    called = {r.module for r in run.session.recorder.calls if ".local_experts." in r.module}
    assert called == {EXPERT.format(layer, 0) + part for layer in (1, 2)
                      for part in ("linear_fc1", "linear_fc2")}
    twin = EXPERT.format(1, 0) + "linear_fc1"
    assert run.records[EXPERT.format(1, 6) + "linear_fc1"] is run.records[twin]
    every = run_audit(config, recipe, EVERY_EXPERT)
    assert len({r.module for r in every.session.recorder.calls
                if ".local_experts." in r.module}) == 2 * 8 * 2


def test_verify_runs_every_expert(write_yaml):
    path = write_yaml("c.yaml", TE_SEQUENTIAL)
    report = audit_files(path, None, AuditOptions(verify=True, steps=1))
    assert report.observation is None
    assert all(row.grad_rel_error is not None for row in report.modules
               if ".local_experts." in row.name)


ONE_EXPERT_RECIPE = """\
configs:
  hp: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
  mx: {transformer_engine_config_type: TEQuantizationParams,
       training_recipe: {fp8_quantization_recipe: mxfp8}}
matchers:
  five: {type: glob, pattern: "decoder.layers.1.mlp.experts.local_experts.5.*", config: hp,
         enabled: true}
  three: {type: glob, pattern: "decoder.layers.2.mlp.experts.local_experts.3.linear_fc2",
          config: mx, enabled: true}
"""


def test_an_expert_with_its_own_recipe_and_precision_runs_itself(write_yaml):
    """Expert 5 of layer 1 bound to a high-precision config, expert 3 of layer 2's fc2 to an
    MXFP8 one: each is a class of its own, its rows show its own recipe and precision, and the
    report is the one of a run where every expert runs."""
    path = write_yaml("c.yaml", TE_SEQUENTIAL)
    recipe = write_yaml("r.yaml", ONE_EXPERT_RECIPE)
    once, every = audit_files(path, recipe), audit_files(path, recipe, EVERY_EXPERT)
    assert without_observation(once) == without_observation(every)
    by_name = rows(once)
    assert (by_name[EXPERT.format(1, 5) + "linear_fc1"].precision,
            by_name[EXPERT.format(1, 5) + "linear_fc1"].recipe) == ("bf16", "hp")
    assert by_name[EXPERT.format(1, 4) + "linear_fc1"].precision == "fp8/tensorwise"
    assert (by_name[EXPERT.format(2, 3) + "linear_fc2"].precision,
            by_name[EXPERT.format(2, 3) + "linear_fc2"].recipe) == ("fp8/mxfp8", "mx")
    assert once.observation["classes"] == [
        {"observed": "decoder.layers.1.mlp.experts.local_experts.0",
         "inferred": "decoder.layers.1.mlp.experts.local_experts.[1-4,6-7]", "experts": 6,
         "modules": 12},
        {"observed": "decoder.layers.2.mlp.experts.local_experts.0",
         "inferred": "decoder.layers.2.mlp.experts.local_experts.[1-2,4-7]", "experts": 6,
         "modules": 12}]


def _call_fc1_twice(expert: torch.nn.Module) -> None:
    def forward(self, h):
        self.linear_fc1(h)  # an extra call, as a module called twice per microbatch
        return self.linear_fc2(torch.nn.functional.silu(self.linear_fc1(h)))

    expert.forward = types.MethodType(forward, expert)


def test_an_expert_called_twice_runs_itself(write_yaml, monkeypatch):
    """One expert whose forward calls its fc1 twice (set on that expert after the build):
    a class of its own, observed with two calls per microbatch, as in a run of every expert."""
    build = audit_module.build_model

    def build_then_change_one(*args, **kwargs):
        model = build(*args, **kwargs)
        _call_fc1_twice(model.decoder.layers[2].mlp.experts.local_experts[6])
        return model

    monkeypatch.setattr(audit_module, "build_model", build_then_change_one)
    path = write_yaml("c.yaml", TE_SEQUENTIAL.replace("fp8: e4m3\nfp8_recipe: tensorwise\n", ""))
    once, every = audit_files(path), audit_files(path, None, EVERY_EXPERT)
    assert without_observation(once) == without_observation(every)
    by_name = rows(once)
    assert by_name[EXPERT.format(2, 6) + "linear_fc1"].calls_per_microbatch == 2
    assert by_name[EXPERT.format(2, 5) + "linear_fc1"].calls_per_microbatch == 1
    layer2 = [c for c in once.observation["classes"] if c["observed"].startswith("decoder.layers.2.")]
    assert layer2 == [{"observed": "decoder.layers.2.mlp.experts.local_experts.0",
                       "inferred": "decoder.layers.2.mlp.experts.local_experts.[1-5,7]",
                       "experts": 6, "modules": 12}]


# --- what "identical" compares (qaudit/model/identical.py) -------------------------------

def _experts(count: int = 4) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    experts = []
    for _ in range(count):
        expert = torch.nn.Module()
        expert.linear_fc1 = torch.nn.Linear(8, 16, bias=False)
        expert.linear_fc2 = torch.nn.Linear(16, 8, bias=False)
        experts.append(expert)
    return experts


def test_weights_values_do_not_split_a_class():
    experts = _experts()  # each drawn differently
    assert not torch.equal(experts[0].linear_fc1.weight, experts[1].linear_fc1.weight)
    assert [(c.observed, c.inferred) for c in expert_classes(experts)] == [(0, (1, 2, 3))]


@pytest.mark.parametrize("change", [
    lambda e: e.linear_fc1.register_forward_hook(lambda *args: None),
    lambda e: e.linear_fc2.weight.register_hook(lambda grad: grad),
    lambda e: e.linear_fc1.weight.requires_grad_(False),
    lambda e: setattr(e.linear_fc2, "weight", torch.nn.Parameter(torch.zeros(8, 17))),
    lambda e: setattr(e.linear_fc1, "overwrite_main_grad", True),
    lambda e: setattr(e.linear_fc1.weight, "overwrite_main_grad", True),
    lambda e: e.linear_fc1.eval(),
    lambda e: _call_fc1_twice(e),
], ids=["forward-hook", "grad-hook", "frozen", "shape", "module-attribute",
        "parameter-attribute", "eval-mode", "replaced-forward"])
def test_any_difference_but_names_and_values_splits_a_class(change):
    experts = _experts()
    change(experts[2])
    assert [(c.observed, c.inferred) for c in expert_classes(experts)] == [(0, (1, 3)), (2, ())]


def test_the_same_hook_code_on_every_expert_keeps_one_class():
    experts = _experts()
    for expert in experts:  # one line of code hooking every parameter: one hook
        for param in expert.parameters():
            param.register_post_accumulate_grad_hook(lambda p: None)
    assert len(expert_classes(experts)) == 1
    assert same_structure(experts[0], experts[3])


def test_names_are_not_compared():
    experts = _experts(2)
    experts[0].linear_fc1.fqn, experts[1].linear_fc1.fqn = "a.0.linear_fc1", "a.1.linear_fc1"
    assert same_structure(experts[0], experts[1])


# --- the report and the run's state -----------------------------------------------------------

def test_report_says_what_was_inferred(write_yaml):
    report = audit_files(modelopt_conf(write_yaml))
    table = render(report, 0, "table")
    assert "observed once: 28 modules of 14 sequential experts inferred identical" in table
    assert "docs/observed-once.md" in render(report, 0, "markdown")
    data = json.loads(render(report, 0, "json"))
    assert data["observation"]["modules_inferred"] == 28
    jsonschema = pytest.importorskip("jsonschema", reason="pip install -e '.[test]'")
    from qaudit.render.json import schema_text

    jsonschema.validate(data, json.loads(schema_text()))


def test_value_free_run_holds_one_element_per_weight_and_buffer(write_yaml):
    """Counted in bytes: without --verify a weight and its main_grad each hold one stored
    element (qaudit/runtime/value_free.py), whatever their shape."""
    config, recipe = load_inputs(modelopt_conf(write_yaml))
    run = run_audit(config, recipe, AuditOptions())
    expert = run.model.decoder.layers[1].mlp.experts.local_experts[0].linear_fc1
    assert expert.weight.numel() > 1
    assert expert.weight.untyped_storage().nbytes() == expert.weight.element_size()
    assert expert.weight.main_grad.untyped_storage().nbytes() == expert.weight.element_size()
    inferred = run.model.decoder.layers[1].mlp.experts.local_experts[1].linear_fc1
    assert not hasattr(inferred.weight, "main_grad")  # never runs: no buffer, no hook
    verified = run_audit(config, recipe, AuditOptions(verify=True, steps=1))
    weight = verified.model.decoder.layers[1].mlp.experts.local_experts[0].linear_fc1.weight
    assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()


def test_the_built_model_is_unfrozen_after_the_audit(write_yaml):
    """The model is frozen out of the collector's sight during the audit only."""
    audit_files(write_yaml("c.yaml", TE_SEQUENTIAL))
    assert gc.get_freeze_count() == 0


@pytest.mark.slow  # a forked Megatron build per config
@pytest.mark.parametrize("spec", ["te", "modelopt"])
def test_megatrons_own_run_agrees_with_the_inferred_rows(spec, megatron, write_yaml):
    """--cross-check builds the same config with the installed Megatron, where every expert
    runs: the rows qaudit inferred compare with 0 differences."""
    path = write_yaml("c.yaml", TE_SEQUENTIAL) if spec == "te" else modelopt_conf(write_yaml)
    report = audit_files(path, None, AuditOptions(policy="legacy", cross_check=True))
    result = report.cross_check
    assert report.observation["modules_inferred"] == 28
    assert result["ran"] and result["differences"] == []
    assert result["modules_compared"] == len(report.modules)  # inferred rows included
