"""Inference by class in the te runtime (qaudit/runtime/te_infer.py), without TE: a stand-in
module with TE's kind of state (a weight workspace made by the first call with the flag True,
reused by False, cast afresh by None) and a wgrad decision taken from the flag saved at forward.
With TE, tests/test_te_standin.py runs the case matrix and the configs with inference on and off.
"""

from __future__ import annotations

import functools

import torch

from qaudit.model.identical import TE_MODULE_NAMES, same_structure
from qaudit.runtime.te_infer import ClassInference


class _Decide(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, flag, x, weight):
        ctx.module, ctx.flag, ctx.listener = module, flag, module.wgrad_listener
        ctx.save_for_backward(x, weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        if ctx.listener is not None:
            ctx.listener("overwrite" if ctx.flag else "accumulate")
        weight.grad_added_to_main_grad = True  # as TE's fused backward does
        return None, None, grad @ weight, torch.zeros_like(weight)


class FakeTE(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name  # as TE's own modules carry one
        self.in_features = self.out_features = 4
        self.fuse_wgrad_accumulation = True
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.weight.main_grad = torch.zeros(4, 4)
        self.weight.grad_added_to_main_grad = False
        self.workspace = None
        self.wgrad_listener = None
        self.observed_cache = None
        self.te_calls = 0

    def te_forward(self, x, flag):
        self.te_calls += 1
        if flag is None:
            self.observed_cache = "fresh"
        elif flag or self.workspace is None:
            self.observed_cache = "refresh" if self.workspace is not None else "fresh"
            self.workspace = "cast"
        else:
            self.observed_cache = "reuse"
        return _Decide.apply(self, flag, x, self.weight)


def _run(modules, flags_per_module, infer: bool):
    """Each microbatch: the modules in a row, one backward; per module its (cache, decision)."""
    records = {m.name: [] for m in modules}
    inference = None
    if infer:
        inference = ClassInference()
        inference.form_classes([(m.name, m) for m in modules],
                               functools.partial(same_structure, names=TE_MODULE_NAMES))
    for microbatch in range(len(flags_per_module[0])):
        h = torch.ones(2, 4, requires_grad=True)
        for module, flags in zip(modules, flags_per_module):
            flag = flags[microbatch]
            entry = {"cache": None, "decision": None}
            records[module.name].append(entry)
            module.wgrad_listener = functools.partial(entry.__setitem__, "decision")
            if inference is None:
                h = module.te_forward(h, flag)
            else:
                h = inference.run(module, h, None, None, flag, None,
                                  functools.partial(module.te_forward, h, flag),
                                  lambda call, m=module: m.te_forward(
                                      torch.zeros(call.shape, requires_grad=call.requires_grad),
                                      call.flag))
            entry["cache"] = module.observed_cache
            module.wgrad_listener = None
        h.sum().backward()
    return records, inference


def _models(count: int) -> list[FakeTE]:
    torch.manual_seed(0)
    return [FakeTE(f"layers.{i}") for i in range(count)]


def test_identical_modules_run_te_once_and_record_what_each_would():
    flags = [[True, False, False]] * 3
    expected, _ = _run(_models(3), flags, infer=False)
    modules = _models(3)
    got, inference = _run(modules, flags, infer=True)
    assert got == expected
    # The later modules' backwards ran before the first's: their decisions waited for TE's.
    assert [r["decision"] for r in got["layers.2"]] == ["overwrite", "accumulate", "accumulate"]
    assert [m.te_calls for m in modules] == [3, 0, 0]
    summary = inference.summary([m.name for m in modules])
    assert summary == {"modules_run": 1, "modules_inferred": 2, "classes": [
        {"representative": "layers.0", "inferred": ["layers.1", "layers.2"]}]}


def test_a_module_whose_calls_diverge_replays_them_and_runs_te_from_then_on():
    # layers.1 is not re-armed in the third microbatch (the lost-gradient pattern): its first
    # two calls are inferred, the third is one no identical module made after the same calls.
    flags = [[True, False, True], [True, False, False]]
    expected, _ = _run(_models(2), flags, infer=False)
    modules = _models(2)
    got, inference = _run(modules, flags, infer=True)
    assert got == expected
    # Two replayed calls (for its workspace) and its own third.
    assert [m.te_calls for m in modules] == [3, 3]
    assert inference.summary([m.name for m in modules]) is None


def test_a_module_that_differs_in_structure_is_a_class_of_its_own():
    modules = _models(3)
    modules[2].fuse_wgrad_accumulation = False
    flags = [[True, False]] * 3
    _, inference = _run(modules, flags, infer=True)
    assert [m.te_calls for m in modules] == [2, 0, 2]
    summary = inference.summary([m.name for m in modules])
    assert summary["classes"] == [{"representative": "layers.0", "inferred": ["layers.1"]}]


def test_the_table_names_the_representatives_and_the_inferred_modules_as_index_sets():
    from types import SimpleNamespace

    from qaudit.render.common import te_inference_lines

    names = [f"decoder.layers.{i}.mlp.linear_fc1" for i in (1, 2, 3, 5)] + ["mtp.eh_proj"]
    report = SimpleNamespace(te_inference={"modules_run": 2, "modules_inferred": 5, "classes": [
        {"representative": "decoder.layers.0.mlp.linear_fc1", "inferred": names}]})
    assert te_inference_lines(report) == [
        "te inference: TE's code ran for 2 modules; 5 inferred from 1 identical ones "
        "(--no-infer runs TE's code for each; docs/te-inference.md)",
        "  decoder.layers.0.mlp.linear_fc1 -> decoder.layers.[1-3,5].mlp.linear_fc1, mtp.eh_proj"]
    assert te_inference_lines(SimpleNamespace(te_inference=None)) == []
