"""The cross-check's GEMM stand-ins carry out exactly the arguments upstream passes."""

from __future__ import annotations

import pytest
import torch

from qaudit.runtime.standin import gemm as standin_gemm


@pytest.fixture(autouse=True)
def _fresh_writes():
    standin_gemm.clear_writes()
    yield
    standin_gemm.clear_writes()


def test_layouts_are_te_general_gemms_in_row_major_terms():
    generator = torch.Generator().manual_seed(0)
    weight, x = torch.randn(5, 3, generator=generator), torch.randn(7, 3, generator=generator)
    dy = torch.randn(7, 5, generator=generator)
    bias = torch.randn(5, generator=generator)
    forward, *_ = standin_gemm.general_gemm(weight, x, torch.float32, layout="TN", bias=bias)
    dgrad, *_ = standin_gemm.general_gemm(weight, dy, torch.float32, layout="NN", grad=True)
    wgrad, bias_grad, *_ = standin_gemm.general_gemm(x, dy, torch.float32, layout="NT",
                                                      grad=True, bias=bias)
    torch.testing.assert_close(forward, x @ weight.t() + bias)
    torch.testing.assert_close(dgrad, dy @ weight)
    torch.testing.assert_close(wgrad, dy.t() @ x)
    torch.testing.assert_close(bias_grad, dy.sum(dim=0))
    assert standin_gemm.output_writes() == []  # no output buffer was handed in


def test_an_output_buffer_is_added_to_or_overwritten_as_asked_and_recorded():
    x, dy = torch.ones(4, 3), torch.ones(4, 2)
    main_grad = torch.full((2, 3), 10.0)
    standin_gemm.general_gemm(x, dy, torch.float32, layout="NT", out=main_grad, grad=True)
    assert torch.equal(main_grad, torch.full((2, 3), 4.0))
    standin_gemm.general_gemm(x, dy, torch.float32, layout="NT", out=main_grad, grad=True,
                              accumulate=True)
    assert torch.equal(main_grad, torch.full((2, 3), 8.0))
    standin_gemm.wgrad_gemm_accum_fp32(x, dy, main_grad)
    assert torch.equal(main_grad, torch.full((2, 3), 12.0))
    assert [(buffer is main_grad, decision) for buffer, decision in
            standin_gemm.output_writes()] == [(True, "overwrite"), (True, "accumulate"),
                                              (True, "accumulate")]


def test_quantized_gemms_are_refused_not_run_in_high_precision():
    with pytest.raises(NotImplementedError):
        standin_gemm.general_gemm(torch.ones(2, 2), torch.ones(2, 2), quantization_params=object())
