"""Without --verify the reference runtime's backward computes no gradient products
(docs/performance.md): the same wgrad decisions, no values, and TE's failure without
`main_grad` kept."""

import pytest
import torch

from qaudit.runtime.reference import ReferenceRuntime


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
