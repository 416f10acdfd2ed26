"""Without --verify the reference runtime computes no products (docs/performance.md): the
same calls and wgrad decisions, zero outputs of the right shapes, no gradient values, TE's
failure without `main_grad` kept, and the weights left as they are."""

from pathlib import Path

import pytest
import torch

from product_count import CountProducts, CountWrites
from qaudit.commands.check import audit_config, load_inputs
from qaudit.run import train
from qaudit.run.options import AuditOptions
from qaudit.run.train import (LEARNING_RATE, apply_update, attach_grad_buffers,
                              drain_into_sharded_grads, zero_grad_buffer)
from qaudit.runtime.reference import ReferenceRuntime

SMALL_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "gpt-small-bf16.yaml"


def _module(kind: str, numerics: bool, fuse: bool = True):
    runtime = ReferenceRuntime(numerics=numerics)
    if kind == "grouped":
        return runtime.grouped_linear(4, 8, 6, fuse=fuse), (torch.randn(5, 8), [2, 0, 3, 0])
    return runtime.linear(8, 6, fuse=fuse), (torch.randn(5, 8), None)


def _run(module, x, m_splits, flags):
    decisions = []
    module.wgrad_listener = decisions.append
    for flag in flags:
        args = (x.clone().requires_grad_(), m_splits) if m_splits is not None else (
            x.clone().requires_grad_(),)
        out = module(*args, is_first_microbatch=flag)
        out.sum().backward()
    return decisions


@pytest.mark.parametrize("kind", ["linear", "grouped"])
def test_value_free_backward_takes_the_same_decisions_and_writes_nothing(kind):
    flags = [True, False, None]
    seen = {}
    for numerics in (True, False):
        module, (x, m_splits) = _module(kind, numerics)
        module.weight.main_grad = torch.zeros_like(module.weight)
        module.weight.grad_added_to_main_grad = False
        seen[numerics] = _run(module, x, m_splits, flags)
        written = bool(module.weight.main_grad.abs().sum())
        assert written is numerics  # values only where they are compared
    assert seen[True] == seen[False] and len(seen[False]) == len(flags)


@pytest.mark.parametrize("kind", ["linear", "grouped"])
def test_value_free_backward_still_needs_main_grad_with_fusion(kind):
    module, (x, m_splits) = _module(kind, numerics=False)
    with pytest.raises(AttributeError):
        _run(module, x, m_splits, [True])


def test_value_free_unfused_wgrad_is_a_zero_gradient_of_the_weight_shape():
    module, (x, _) = _module("linear", numerics=False, fuse=False)
    _run(module, x, None, [None])
    assert module.weight.grad.shape == module.weight.shape and not module.weight.grad.any()


@pytest.mark.parametrize("kind", ["linear", "grouped"])
def test_value_free_forward_computes_no_product_and_keeps_the_shape(kind):
    outputs = {}
    for numerics in (True, False):
        module, (x, m_splits) = _module(kind, numerics)
        args = (x, m_splits) if m_splits is not None else (x,)
        with torch.no_grad(), CountProducts() as counter:
            outputs[numerics] = module(*args, is_first_microbatch=True)
        assert (counter.products > 0) is numerics
    assert outputs[False].shape == outputs[True].shape and not outputs[False].any()


def _audit_updates(monkeypatch, verify: bool) -> int:
    updates = []
    real = train.apply_update
    monkeypatch.setattr(train, "apply_update", lambda params: (updates.append(1), real(params)))
    config, recipe = load_inputs(str(SMALL_CONFIG))
    audit_config(config, recipe, AuditOptions(verify=verify))
    return len(updates)


def test_weights_are_updated_only_where_values_are_read(monkeypatch):
    assert _audit_updates(monkeypatch, verify=False) == 0
    assert _audit_updates(monkeypatch, verify=True) == 2  # one per step


def test_foreach_buffer_helpers_do_what_the_per_parameter_loop_did():
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))]
    for index, param in enumerate(params):
        param.main_grad = torch.full_like(param, index + 1.0)
        param.sharded_grad = torch.full_like(param, 10.0)
        param.grad_added_to_main_grad = True
    drain_into_sharded_grads(params)
    assert [p.sharded_grad.unique().tolist() for p in params] == [[11.0], [12.0]]
    assert not any(p.main_grad.any() for p in params)
    apply_update(params)  # from sharded_grad, FSDP's step gradient
    assert torch.allclose(params[1], torch.full((2, 2), 1 - 12 * LEARNING_RATE))
    for param in params:
        param.main_grad.fill_(1.0)
        param.grad_added_to_main_grad = True
    zero_grad_buffer(params, values=False)  # a value-free run resets the flags only
    assert all(p.main_grad.all() and not p.grad_added_to_main_grad for p in params)
    zero_grad_buffer(params)
    assert not any(p.main_grad.any() or p.sharded_grad.any() or p.grad_added_to_main_grad
                   for p in params)


def test_the_buffer_helpers_take_a_model_with_nothing_to_train():
    zero_grad_buffer([])
    drain_into_sharded_grads([])
    apply_update([])


@pytest.mark.parametrize("kind", ["linear", "layernorm_linear", "grouped_linear"])
def test_a_value_free_build_draws_no_weight(kind):
    def build(numerics):
        runtime = ReferenceRuntime(numerics=numerics)
        factory = getattr(runtime, kind)
        return factory(4, 8, 6, fuse=True) if kind == "grouped_linear" else factory(8, 6, fuse=True)

    state = torch.get_rng_state()
    value_free = build(numerics=False)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn
    assert not value_free.weight.any()
    drawn = build(numerics=True)
    assert drawn.weight.shape == value_free.weight.shape and drawn.weight.any()


def test_megatrons_own_linear_computes_no_product_without_values():
    weight = torch.nn.Parameter(torch.randn(6, 8))
    weight.main_grad = torch.zeros_like(weight)
    for numerics in (True, False):
        x = torch.randn(5, 8, requires_grad=True)
        with CountProducts() as counter:
            out = ReferenceRuntime(numerics=numerics).plain_gemm(x, weight, fuse=True,
                                                                 listener=None)
            out.sum().backward()
        assert (counter.products > 0) is numerics and out.shape == (5, 6)


def _autograd_grads_into_main_grad(values: bool) -> tuple[torch.nn.Module, int]:
    model = torch.nn.Linear(4, 3)  # no fused wgrad: its gradients reach main_grad by the hook
    with CountWrites() as counter:
        params = attach_grad_buffers(model, values=values)
    for param in params:
        param.main_grad.fill_(7.0)  # a sentinel: what the hook adds shows
    model(torch.ones(2, 4)).sum().backward()
    return model, counter.writes


def test_value_free_buffers_are_neither_zeroed_nor_added_into():
    model, writes = _autograd_grads_into_main_grad(values=False)
    assert writes == 0  # allocated, never written element by element
    for param in model.parameters():
        assert param.grad is None and bool((param.main_grad == 7.0).all())
        assert param.main_grad.shape == param.shape and param.main_grad.dtype == param.dtype
    model, writes = _autograd_grads_into_main_grad(values=True)
    assert writes == 2  # one zeroed buffer per parameter
    for param in model.parameters():
        assert param.grad is None and not bool((param.main_grad == 7.0).all())
