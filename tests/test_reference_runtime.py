"""The reference runtime reproduces TE's semantics (docs/semantics.md §1), one rule per test."""

from __future__ import annotations

import pytest
import torch

from qaudit.load.precision import Quant
from qaudit.runtime import reference
from qaudit.runtime.fakequant import fake_quantize

FP8 = Quant("fp8", "tensorwise")
MXFP8 = Quant("fp8", "mxfp8")


def make_linear(fuse: bool, main_grad: bool = True, ddp_flag: bool = False) -> reference.Linear:
    torch.manual_seed(0)
    linear = reference.Linear(32, 16, fuse_wgrad_accumulation=fuse)
    if main_grad:
        linear.weight.main_grad = torch.zeros_like(linear.weight)
    if ddp_flag:
        linear.weight.grad_added_to_main_grad = False
    return linear


def x_input(seed: int = 1) -> torch.Tensor:
    return torch.randn(8, 32, generator=torch.Generator().manual_seed(seed), requires_grad=True)


def expected_wgrad(linear: reference.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.ones(8, 16).t() @ x.detach()


# --- §1.1 weight workspace ------------------------------------------------------------------

def test_high_precision_keeps_no_workspace():
    linear = make_linear(fuse=False)
    linear(x_input(), is_first_microbatch=True)
    assert linear._fp8_workspaces == {}


def test_flag_none_quantizes_afresh_and_caches_nothing():
    linear = make_linear(fuse=False)
    with reference.autocast(FP8):
        linear(x_input(), is_first_microbatch=None)
    assert linear._fp8_workspaces == {}


def test_flag_true_creates_then_refreshes_and_false_reuses_stale_weight():
    linear = make_linear(fuse=False)
    x = x_input()
    with reference.autocast(FP8):
        first = linear(x, is_first_microbatch=True)
        with torch.no_grad():
            linear.weight.mul_(2.0)  # an optimizer step
        reused = linear(x, is_first_microbatch=False)
        refreshed = linear(x, is_first_microbatch=True)
    assert linear.workspace_events == ["create", "reuse", "refresh"]
    assert torch.equal(first, reused), "False must reuse the cached quantized weight as is"
    assert not torch.equal(reused, refreshed), "True must re-quantize from the current weight"


def test_flag_false_without_workspace_creates_one():
    linear = make_linear(fuse=False)
    with reference.autocast(FP8):
        linear(x_input(), is_first_microbatch=False)
    assert linear.workspace_events == ["create"]
    assert "weight" in linear._fp8_workspaces


def test_workspace_that_no_longer_fits_is_rebuilt():
    linear = make_linear(fuse=False)
    with reference.autocast(FP8):
        linear(x_input(), is_first_microbatch=True)
    with reference.autocast(MXFP8):
        linear(x_input(), is_first_microbatch=False)
    assert linear.workspace_events == ["create", "rebuild"]
    assert linear._fp8_workspaces["weight"][0] == MXFP8


def test_quantized_execution_changes_the_result():
    linear = make_linear(fuse=False)
    x = x_input()
    plain = linear(x, is_first_microbatch=None)
    with reference.autocast(Quant("fp4", "nvfp4")):
        quantized = linear(x, is_first_microbatch=None)
    assert not torch.allclose(plain, quantized, atol=1e-4)
    assert torch.allclose(plain, quantized, rtol=0.5, atol=0.5)


# --- §1.2 wgrad: overwrite or accumulate -----------------------------------------------------

@pytest.mark.parametrize("flag, accumulates", [(True, False), (False, True), (None, True)])
def test_fused_wgrad_follows_the_flag_saved_at_forward(flag, accumulates):
    linear = make_linear(fuse=True)
    linear.weight.main_grad.fill_(5.0)
    x = x_input()
    linear(x, is_first_microbatch=flag).sum().backward()
    expected = expected_wgrad(linear, x) + (5.0 if accumulates else 0.0)
    assert torch.allclose(linear.weight.main_grad, expected)
    assert linear.weight.grad is None  # no attribute grad_added_to_main_grad: wgrad None


def test_unfused_wgrad_is_autograd_summed_over_calls_and_ignores_the_flag():
    linear = make_linear(fuse=False, main_grad=False)
    x1, x2 = x_input(1), x_input(2)
    (linear(x1, is_first_microbatch=True).sum() + linear(x2, is_first_microbatch=True).sum()).backward()
    assert torch.allclose(linear.weight.grad, expected_wgrad(linear, x1) + expected_wgrad(linear, x2))


def test_overwrite_main_grad_overwrites_even_with_false():
    linear = make_linear(fuse=True)
    linear.weight.overwrite_main_grad = True
    linear.weight.main_grad.fill_(5.0)
    x = x_input()
    linear(x, is_first_microbatch=False).sum().backward()
    assert torch.allclose(linear.weight.main_grad, expected_wgrad(linear, x))


def test_overwrite_main_grad_is_read_at_forward():
    linear = make_linear(fuse=True)
    linear.weight.main_grad.fill_(5.0)
    x = x_input()
    out = linear(x, is_first_microbatch=False)
    linear.weight.overwrite_main_grad = True  # too late: saved at forward
    out.sum().backward()
    assert torch.allclose(linear.weight.main_grad, expected_wgrad(linear, x) + 5.0)


def test_two_calls_first_true_backward_last_loses_the_other_gradient():
    """The repeated-module hazard in miniature: call 1 (True) feeds call 2."""
    torch.manual_seed(0)
    layer = reference.Linear(16, 16, fuse_wgrad_accumulation=True)
    layer.weight.main_grad = torch.zeros_like(layer.weight)
    x = torch.randn(4, 16, requires_grad=True)
    decisions = []
    layer.wgrad_listener = decisions.append
    h1 = layer(x, is_first_microbatch=True)
    h2 = layer(h1, is_first_microbatch=False)
    h2.sum().backward()
    # backward of call 2 runs first (accumulate), call 1 last (overwrite)
    assert decisions == ["accumulate", "overwrite"]
    g2 = torch.ones(4, 16)
    g1 = g2 @ layer.weight.detach()
    only_call1 = g1.t() @ x.detach()
    assert torch.allclose(layer.weight.main_grad, only_call1)


# --- §1.3 / §1.4 --------------------------------------------------------------------------------

def test_grad_added_to_main_grad_is_set_and_a_dummy_wgrad_returned():
    linear = make_linear(fuse=True, ddp_flag=True)
    linear(x_input(), is_first_microbatch=None).sum().backward()
    assert linear.weight.grad_added_to_main_grad is True
    assert linear.weight.grad is not None and torch.count_nonzero(linear.weight.grad) == 0


def test_fused_wgrad_without_main_grad_fails_in_backward_not_forward():
    linear = make_linear(fuse=True, main_grad=False)
    out = linear(x_input(), is_first_microbatch=True)  # forward succeeds
    with pytest.raises(AttributeError, match="main_grad"):
        out.sum().backward()


def test_grouped_linear_writes_each_expert_main_grad_slice_and_overwrites_as_one():
    torch.manual_seed(0)
    grouped = reference.GroupedLinear(3, 8, 4, fuse_wgrad_accumulation=True)
    grouped.weight.main_grad = torch.full_like(grouped.weight, 5.0)
    grouped.weight.overwrite_main_grad = True  # one setting for the module, as TE reads weight0
    x = torch.randn(6, 8)
    grouped(x, [2, 0, 4], is_first_microbatch=False).sum().backward()
    main_grad = grouped.weight.main_grad
    assert torch.allclose(main_grad[0], torch.ones(2, 4).t() @ x[:2])
    assert torch.count_nonzero(main_grad[1]) == 0  # no tokens, overwritten with zeros
    assert torch.allclose(main_grad[2], torch.ones(4, 4).t() @ x[2:])


def test_grouped_linear_quantizes_each_expert_on_its_own_scale():
    grouped = reference.GroupedLinear(2, 32, 16)
    with torch.no_grad():
        grouped.weight[1].mul_(1000.0)
    with reference.autocast(FP8):
        grouped(torch.randn(4, 32), [2, 2], is_first_microbatch=True)
    cached = grouped._fp8_workspaces["weight"][1]
    for i in range(2):
        assert torch.equal(cached[i], fake_quantize(grouped.weight[i].detach(), FP8, "weight"))


# --- fake quantization ----------------------------------------------------------------------------

def test_fp8_fake_quantization_lands_on_e4m3_values():
    x = torch.randn(64, 64)
    q = fake_quantize(x, FP8, "weight")
    scale = 448.0 / x.abs().max()
    scaled = q * scale
    assert torch.allclose(scaled, scaled.to(torch.float8_e4m3fn).float(), atol=1e-3)
    assert not torch.equal(q, x)


def test_nvfp4_values_lie_on_the_e2m1_grid_per_block():
    x = torch.randn(4, 32)
    q = fake_quantize(x, Quant("fp4", "nvfp4"), "weight")
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    for block in q.reshape(-1, 16):
        scale = block.abs().max() / 6.0
        if scale == 0:
            continue
        ratios = (block.abs() / scale).reshape(-1, 1)
        assert torch.min((ratios - grid).abs(), dim=1).values.max() < 1e-4


@pytest.mark.parametrize("recipe", ["tensorwise", "mxfp8", "blockwise"])
def test_stacked_weights_match_one_by_one_quantization(recipe):
    quant = Quant("fp8", recipe)
    weights = torch.randn(3, 40, 48)
    stacked = fake_quantize(weights, quant, "weight")
    for i in range(3):
        assert torch.equal(stacked[i], fake_quantize(weights[i], quant, "weight"))


@pytest.mark.parametrize("batched", [True, False])
def test_grouped_linear_equals_one_linear_per_expert(monkeypatch, batched):
    if not batched:
        monkeypatch.setattr(reference, "_BATCHED_GROUPED_LIMIT", 0)
    torch.manual_seed(0)
    grouped = reference.GroupedLinear(3, 8, 4, fuse_wgrad_accumulation=True)
    grouped.weight.main_grad = torch.zeros_like(grouped.weight)
    weights = list(grouped.weight)
    x = torch.randn(7, 8, requires_grad=True)
    splits = [3, 0, 4]
    out = grouped(x, splits, is_first_microbatch=None)
    out.pow(2).sum().backward()
    chunks = torch.split(x.detach(), splits)
    expected = torch.cat([c @ w.detach().t() for c, w in zip(chunks, weights)])
    assert torch.allclose(out, expected, atol=1e-6)
    for i, (chunk, piece) in enumerate(zip(chunks, torch.split(expected, splits))):
        assert torch.allclose(grouped.weight.main_grad[i], (2 * piece).t() @ chunk, atol=1e-5)
    dx = torch.cat([(2 * p) @ w.detach() for p, w in zip(torch.split(expected, splits), weights)])
    assert torch.allclose(x.grad, dx, atol=1e-5)
