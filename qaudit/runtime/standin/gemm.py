"""Pure-PyTorch stand-ins for the two GEMMs Megatron's own linears write `main_grad` with, and
the record of those writes (docs/cross-check.md lists the upstream calls they replace).

- APEX's `fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32`: always adds.
- TE's `transformer_engine.pytorch.cpp_extensions.general_gemm`, which Megatron's
  `te_general_gemm` wrapper calls (the router's GEMM, and the wgrad of a Megatron-FSDP
  parameter with `out=main_grad`): adds or overwrites as its `accumulate` argument says.
Who decided is upstream's code: the stand-ins only carry out the arguments they are given.
"""

from __future__ import annotations

from typing import Any

import torch

# (buffer written, "accumulate" | "overwrite") for every GEMM that wrote into a tensor it was
# handed as output, in call order. The cross-check maps buffers back to main_grad owners.
_writes: list[tuple[torch.Tensor, str]] = []


def output_writes() -> list[tuple[torch.Tensor, str]]:
    return _writes


def clear_writes() -> None:
    _writes.clear()


def record_write(out: torch.Tensor | None, accumulate: bool) -> None:
    """A GEMM that is not a stand-in (TE's own, on the te-cpu side) wrote `out`."""
    if out is not None:
        _writes.append((out, "accumulate" if accumulate else "overwrite"))


def _two_dims(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1, tensor.shape[-1])


def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor,
                          main_grad: torch.Tensor) -> None:
    """APEX's fused wgrad kernel: main_grad += dY^T X."""
    main_grad.add_((_two_dims(grad_output).t() @ _two_dims(total_input)).to(main_grad.dtype))
    _writes.append((main_grad, "accumulate"))


def general_gemm(A: torch.Tensor, B: torch.Tensor, out_dtype: torch.dtype | None = None,
                 quantization_params: Any = None, gelu: Any = None, gelu_in: Any = None,
                 accumulate: bool = False, layout: str = "TN", out: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, grad: bool = False,
                 **unused: Any) -> tuple[torch.Tensor, Any, Any, Any]:
    """TE's GEMM in row-major terms: layout "TN" is B @ A^T (a forward), "NN" B @ A (dgrad),
    "NT" B^T @ A (wgrad). High precision only; TE returns (out, bias_grad, gelu_input,
    extra_output)."""
    if quantization_params is not None or gelu:
        raise NotImplementedError("the cross-check's general_gemm stand-in is high precision only")
    a, b = _two_dims(A).float(), _two_dims(B).float()
    result = {"TN": lambda: b @ a.t(), "NN": lambda: b @ a, "NT": lambda: b.t() @ a}[layout]()
    bias_grad = None
    if bias is not None and not grad:
        result = result + bias.float()
    elif bias is not None:
        bias_grad = b.sum(dim=0)
    dtype = out_dtype or (out.dtype if out is not None else A.dtype)
    if out is None:
        return result.to(dtype), bias_grad, None, None
    if accumulate:
        out.add_(result.to(out.dtype))
    else:
        out.copy_(result.to(out.dtype))
    record_write(out, accumulate)
    return out, bias_grad, None, None
