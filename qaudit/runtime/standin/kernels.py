"""The CPU stand-in for `transformer_engine_torch`, TE's compiled PyTorch extension.

Built as a module object by `build(te_version_info)` and put in `sys.modules` by the boot
(qaudit/runtime/standin/te_python.py) inside the audit process only. Written from the calls
TE's Python makes (docs/te-runtime.md lists each entry point and what it replaces):

- `generic_gemm` / `te_general_grouped_gemm`: cuBLAS's convention in row-major terms,
  D = op(B) @ op(A), each quantized operand read from the buffer TE selected; `accumulate`
  adds into the caller's `out` (beta=1), else overwrites it. Every GEMM that writes a
  buffer someone watches (a weight's `main_grad`) is reported with its `accumulate` flag:
  that flag IS TE's wgrad decision.
- `quantize`, `bgrad_quantize`, `split_quantize`, `dequantize`, `fp8_transpose`,
  `nvfp4_data_transpose`: TE's cast kernels over the buffers its quantizers allocate
  (qaudit/runtime/standin/storage.py); every cast of a watched source (a weight) is
  reported too, which is how weight-cache refreshes are seen.
- `layernorm_fwd/bwd`, `rmsnorm_fwd/bwd`: torch's norms, quantizing the output when TE
  fuses the cast.
- `multi_tensor_transpose_to_bhsd`, `multi_tensor_swizzle_scales_for_gemm_unchecked_`: the
  layout kernels of TE's MXFP8 attention (the scale swizzle is order-free here: one scale a
  buffer).
- enums TE reads at import, with the member sets TE asserts; a few constants.

Anything else TE names resolves to a stub: usable as an enum value at import, raising
`NotStoodIn` when called.
"""

from __future__ import annotations

import collections
import enum
import functools
import importlib.machinery
import math
import os
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

from qaudit.runtime.standin import storage
from qaudit.runtime.standin.storage import NotStoodIn

# -- observation -----------------------------------------------------------------------------

GemmWatcher = Callable[[bool], None]
# data_ptr of a buffer (a weight's main_grad) -> FIFO of callbacks, one per pending backward.
_gemm_watch: dict[int, collections.deque] = collections.defaultdict(collections.deque)
# data_ptr of a cast source (a weight) -> callback(destination object).
_cast_watch: dict[int, Callable[[object], None]] = {}


def expect_write(buffers: list[torch.Tensor], callback: GemmWatcher) -> Callable[[], None]:
    """Report the `accumulate` flag of the next GEMM writing any of `buffers`, once.
    Returns a cancel function (for a backward that wrote none of them)."""
    keys = [b.data_ptr() for b in buffers]
    entry = {"done": False}

    def fire(accumulate: bool) -> None:
        if not entry["done"]:
            entry["done"] = True
            callback(accumulate)

    for key in keys:
        _gemm_watch[key].append((entry, fire))

    def cancel() -> None:
        entry["done"] = True

    return cancel


def _report_write(out: torch.Tensor | None, accumulate: bool) -> None:
    if out is None or not _gemm_watch:
        return
    queue = _gemm_watch.get(out.data_ptr())
    while queue:
        entry, fire = queue.popleft()
        if not entry["done"]:
            fire(accumulate)
            break
    if queue is not None and not queue:
        del _gemm_watch[out.data_ptr()]


def watch_casts(source: torch.Tensor, callback: Callable[[object], None] | None) -> None:
    # Casts are told apart by their source's address; a source without storage of its own
    # (a weight TE keeps quantized, an empty tensor) has address 0, shared with every empty
    # expert slice that is cast, so it is not watched: none of its casts could be told.
    address = source.data_ptr()
    if not address:
        return
    if callback is None:
        _cast_watch.pop(address, None)
    else:
        _cast_watch[address] = callback


# -- enums ------------------------------------------------------------------------------------

class DType(enum.IntEnum):
    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10


TORCH_DTYPE = {DType.kByte: torch.uint8, DType.kInt32: torch.int32, DType.kFloat32: torch.float32,
               DType.kFloat16: torch.float16, DType.kBFloat16: torch.bfloat16,
               DType.kFloat8E4M3: torch.float8_e4m3fn, DType.kFloat8E5M2: torch.float8_e5m2}
FP8_DTYPES = {int(DType.kFloat8E4M3): torch.float8_e4m3fn, int(DType.kFloat8E5M2): torch.float8_e5m2}


class FP8FwdTensors(enum.IntEnum):  # indices into TE's forward amax history
    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensors(enum.IntEnum):
    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


class CommOverlapType(enum.IntEnum):
    RS = 0
    AG = 1


class CommOverlapAlgo(enum.IntEnum):
    BULK_OVERLAP_AG = 0
    BULK_OVERLAP_RS = 1
    SPLIT_PIPELINED_AG_P2P = 2
    SPLIT_PIPELINED_RS = 3
    SPLIT_PIPELINED_RS_P2P = 4
    ATOMIC_GEMM_RS = 5
    ATOMIC_GEMM_AG_P2P = 6
    ATOMIC_GEMM_RS_P2P = 7


class Float8BlockScaleTensorFormat(enum.IntEnum):
    GEMM_READY = 0
    COMPACT = 1


class FP8TensorMeta:
    def __init__(self) -> None:
        self.scale = torch.ones(1)
        self.scale_inv = torch.ones(1)
        self.amax_history = torch.zeros(1, 1)


def _fused_attn_backend(with_max512: bool) -> type:
    names = ["NVTE_No_Backend", "NVTE_F16_arbitrary_seqlen", "NVTE_FP8"]
    if with_max512:
        names.insert(1, "NVTE_F16_max512_seqlen")
    values = {"NVTE_No_Backend": -1, "NVTE_F16_max512_seqlen": 0,
              "NVTE_F16_arbitrary_seqlen": 1, "NVTE_FP8": 2}
    return enum.IntEnum("NVTE_Fused_Attn_Backend", {n: values[n] for n in names})


class _Stub:
    """A name TE's Python refers to that the stand-in does not provide."""

    _next = 1000

    def __init__(self, name: str) -> None:
        self._name = name
        _Stub._next += 1
        self._value = _Stub._next

    def __call__(self, *args, **kwargs):
        raise NotStoodIn(f"the qaudit CPU stand-in has no transformer_engine_torch.{self._name}")

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Stub(f"{self._name}.{item}")

    def __int__(self) -> int:
        return self._value

    __index__ = __int__

    def __hash__(self) -> int:
        return self._value

    def __eq__(self, other) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


# -- GEMMs --------------------------------------------------------------------------------------

def _operand(tensor, trans: bool, is_a: bool) -> torch.Tensor:
    # A: row-wise data when transposed; B: column-wise data when transposed (TE's choice).
    usage = ("rowwise" if trans else "columnwise") if is_a else ("columnwise" if trans else "rowwise")
    matrix = storage.logical(tensor, usage, FP8_DTYPES)
    return matrix.t() if trans else matrix


def _torch_dtype(te_dtype, fallback: torch.dtype) -> torch.dtype:
    if te_dtype is None:
        return fallback
    if isinstance(te_dtype, torch.dtype):
        return te_dtype
    return TORCH_DTYPE.get(DType(int(te_dtype)), fallback)


def _nominal_dtype(tensor) -> torch.dtype:
    dtype = getattr(tensor, "_dtype", None) or getattr(tensor, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _inner_dim(A, transa: bool) -> int:
    """The summed-over dimension k of D = op(B) @ op(A), from A's logical shape."""
    shape = storage.logical_shape(A)
    if transa:
        return shape[-1] if shape else 1
    return math.prod(shape[:-1])


def _gemm(A, transa, B, transb, out, quantizer, out_dtype, bias, grad, accumulate):
    if out is not None and not (bias is not None and bias.numel()) and _inner_dim(A, transa) == 0:
        # A sum over no rows (an expert's weight gradient when no token reached it): D is
        # zero, so accumulating adds nothing and overwriting clears. Still reported: which
        # of the two TE asked for is the decision the audit observes.
        if not accumulate:
            out.zero_()
        _report_write(out, accumulate)
        return out, None
    a = _operand(A, transa, True)
    b = _operand(B, transb, False)
    d = b @ a
    b_shape = storage.logical_shape(B)
    if not transb and len(b_shape) > 2:
        d = d.reshape(*b_shape[:-1], d.shape[-1])
    bias_grad = None
    if bias is not None and bias.numel():
        if grad:
            bias_grad = storage.logical(B, "rowwise", FP8_DTYPES).sum(0).to(bias.dtype)
        else:
            d = d + bias.float()
    dtype = _torch_dtype(out_dtype, out.dtype if out is not None else _nominal_dtype(A))
    if out is not None:
        if accumulate:
            out.add_(d.reshape(out.shape).to(out.dtype))
        else:
            out.copy_(d.reshape(out.shape))
        _report_write(out, accumulate)
        result = out
    elif quantizer is not None:
        result = quantize(d.to(dtype), quantizer)
    else:
        result = d.to(dtype)
    return result, bias_grad


def generic_gemm(A, transa, B, transb, out, quantizer, out_dtype, bias, bias_type, gelu,
                 gelu_in, grad, workspace, workspace_size, accumulate, use_split_accumulator,
                 *args, **kwargs):
    if gelu:
        raise NotStoodIn("the qaudit CPU stand-in has no GEMM+GELU epilogue")
    if kwargs.get("comm_overlap") is not None:
        raise NotStoodIn("the qaudit CPU stand-in has no userbuffers communication overlap")
    alpha = float(kwargs.get("alpha", 1.0) or 1.0)
    if alpha != 1.0:
        raise NotStoodIn("the qaudit CPU stand-in GEMM has no alpha scaling")
    result, bias_grad = _gemm(A, transa, B, transb, out, quantizer, out_dtype, bias, grad,
                              accumulate)
    return result, bias_grad, gelu_in, kwargs.get("extra_output")


def te_general_grouped_gemm(A, transa, B, transb, out, out_dtype, m_splits, bias, bias_type,
                            single_output, pre_gelu_out, grad, workspace, workspace_size,
                            accumulate, use_split_accumulator, *args):
    """One GEMM per group; with `single_output` the outputs are row slices of out[0]."""
    if single_output:
        whole, offset, views = out[0], 0, []
        for m in m_splits:
            views.append(whole[offset:offset + m])
            offset += m
    else:
        views = list(out)
    grads = []
    for i, (a, b, o) in enumerate(zip(A, B, views)):
        use_bias = bias is not None and i < len(bias) and bias[i].numel()
        if o.numel() == 0:
            grads.append(bias[i] if use_bias else None)
            continue
        _, bias_grad = _gemm(a, transa, b, transb, o, None, out_dtype,
                             bias[i] if use_bias else None, grad, accumulate)
        if grad and use_bias:
            bias[i].copy_(bias_grad)
    return bias


# TE 2.19+'s grouped-tensor path (GroupedLinear(use_grouped_tensor=True), which single-grouped-
# weight modules must take): the operands are GroupedTensorStorage objects, flat buffers with
# per-member shapes and element offsets. Written from TE's Python callers
# (module/grouped_linear.py, cpp_extensions/gemm.py); unquantized operands only.

def splits_to_offsets_multi(splits, device=None, strides=(), include_leading_zero=(),
                            dtypes=(), bulk_allocate=False):
    """The split sizes as int64, and per stride the running sum of `splits * stride` (with a
    leading zero where asked): the row and element offsets of each group's member."""
    sizes = torch.as_tensor(splits).to(torch.int64).reshape(-1)
    offsets = []
    for index, stride in enumerate(strides):
        ends = torch.cumsum(sizes * int(stride), 0)
        if index < len(include_leading_zero) and include_leading_zero[index]:
            ends = torch.cat([ends.new_zeros(1), ends])
        dtype = dtypes[index] if index < len(dtypes) else torch.int64
        offsets.append(ends.to(dtype))
    return sizes, tuple(offsets)


def _grouped_members(grouped) -> list[torch.Tensor]:
    """A GroupedTensorStorage's members as views [rows, cols] of its row-wise buffer; a list
    (TE's discrete operands) as it is."""
    if isinstance(grouped, (list, tuple)):
        return list(grouped)
    if getattr(grouped, "quantizer", None) is not None or grouped.rowwise_data is None:
        raise NotStoodIn("the qaudit CPU stand-in's grouped-tensor GEMM takes unquantized "
                         "operands only")
    count, (rows, cols) = grouped.num_tensors, grouped.logical_shape
    first = (grouped.first_dims.tolist() if grouped.first_dims is not None
             else [rows // count if grouped.last_dims is None else rows] * count)
    last = grouped.last_dims.tolist() if grouped.last_dims is not None else [cols] * count
    if grouped.tensor_offsets is not None:
        starts = [int(v) for v in grouped.tensor_offsets.tolist()[:count]]
    else:
        starts = [sum(f * l for f, l in zip(first[:i], last[:i])) for i in range(count)]
    data = grouped.rowwise_data.reshape(-1)
    return [data[s:s + int(f) * int(l)].view(int(f), int(l))
            for s, f, l in zip(starts, first, last)]


def _matrix(member, trans: bool, is_a: bool) -> torch.Tensor:
    if isinstance(member, torch.Tensor) and type(member) is torch.Tensor:
        return member.float().t() if trans else member.float()
    return _operand(member, trans, is_a)


def te_general_grouped_gemm_for_grouped_tensor(A, transa, B, transb, out, bias, bias_scale,
                                               alpha, beta, *args):
    """Per group i: D_i = alpha_i * op(B_i) @ op(A_i) (+ bias_i) + beta_i * D_i, cuBLAS's
    convention in row-major terms as in generic_gemm. alpha and beta hold one value per group,
    or one for all; beta 0 overwrites D_i (its old contents never read), else it is added to.
    Also serves TE's discrete-input (a list of weights) and discrete-output (per-expert
    main_grads) variants."""
    if bias_scale is not None:
        raise NotStoodIn("the qaudit CPU stand-in's grouped-tensor GEMM has no bias scale")
    a_members, b_members = _grouped_members(A), _grouped_members(B)
    d_members = _grouped_members(out)
    biases = _grouped_members(bias) if bias is not None else None
    alphas, betas = alpha.float().reshape(-1).tolist(), beta.float().reshape(-1).tolist()
    accumulate = any(value != 0 for value in betas)
    for i, (a, b, d) in enumerate(zip(a_members, b_members, d_members)):
        scale, keep = alphas[min(i, len(alphas) - 1)], betas[min(i, len(betas) - 1)]
        product = _matrix(b, transb, False) @ _matrix(a, transa, True)
        if scale != 1.0:
            product = product * scale
        if biases is not None:
            product = product + biases[i].float().reshape(1, -1)
        if keep == 0:
            d.copy_(product.reshape(d.shape))
        else:
            d.copy_((d.float() * keep + product.reshape(d.shape)).to(d.dtype))
    # A watched buffer (a weight's main_grad) is the grouped output's whole buffer, or one
    # member of a discrete output.
    for written in ([out.rowwise_data] if not isinstance(out, (list, tuple)) else out):
        _report_write(written, accumulate)
    return out


# -- casts ----------------------------------------------------------------------------------------

def _fp8_dtype(quantizer) -> torch.dtype | None:
    """The FP8 dtype of `quantizer`'s casts; None for NVFP4 (E2M1, storage.py's own codes)."""
    if storage.family(quantizer) == "nvfp4":  # refuses the formats not stood in by name
        return None
    return FP8_DTYPES[int(quantizer.dtype)]


def _report_cast(src: torch.Tensor, dst) -> None:
    if _cast_watch:  # never holds address 0 (watch_casts)
        callback = _cast_watch.get(src.data_ptr())
        if callback is not None:
            callback(dst)


def create_empty_quantized_tensor(quantizer, shape, dtype, device=None, pin_memory=False):
    """TE 2.20's allocation entry point: TE's own pure-Python allocation where the quantizer
    declares its buffers, by hand for the delayed-scaling quantizer, which does not."""
    shape = [int(s) for s in shape]
    try:
        if type(quantizer).alloc_tensors is _base_alloc_tensors():
            # What TE's Quantizer.alloc_tensors does, with torch's own allocator: the CUDA
            # pose's device check on every buffer is what cost (docs/performance.md).
            tensors = {attr: _EMPTY(buffer_shape, dtype=buffer_dtype) for attr, (buffer_shape, buffer_dtype)
                       in quantizer.inner_tensor_specs(tuple(shape)).items()}
        else:
            tensors = quantizer.alloc_tensors(shape, device=_CPU)
        meta = quantizer.create_metadata(shape, dtype=dtype)
    except NotImplementedError:
        return _float8_by_hand(quantizer, shape, dtype)
    cls = meta["cls"]
    if not meta["is_tensor"]:
        # An internal storage: its constructor with the buffers by keyword, as TE's
        # __tensor_unflatten__ would call it, without the generic mapping.
        kwargs = dict(meta["nontensor_kwargs"])
        for attr, keyword in cls._INNER_TENSORS:
            kwargs[keyword] = tensors.get(attr)
        return cls(**kwargs)
    return cls.__tensor_unflatten__(tensors, meta, shape, None)


@functools.cache
def _base_alloc_tensors():
    from transformer_engine.pytorch.quantized_tensor import Quantizer

    return Quantizer.alloc_tensors


def _float8_by_hand(quantizer, shape, dtype):
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
    from transformer_engine.pytorch.utils import is_non_tn_fp8_gemm_supported

    non_tn = is_non_tn_fp8_gemm_supported()
    data = torch.empty(shape, dtype=torch.uint8) if quantizer.rowwise_usage or non_tn else None
    transpose = (torch.empty([shape[-1], *shape[:-1]], dtype=torch.uint8)
                 if quantizer.columnwise_usage and not non_tn else None)
    kwargs = dict(data=data, fp8_scale_inv=torch.empty(1, dtype=torch.float32),
                  fp8_dtype=quantizer.dtype, data_transpose=transpose, quantizer=quantizer)
    if getattr(quantizer, "internal", False):
        from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import (
            Float8TensorStorage)
        return Float8TensorStorage(fake_dtype=dtype, **kwargs)
    return Float8Tensor(shape=shape, dtype=dtype, requires_grad=False, **kwargs)


_CPU = torch.device("cpu")
# torch.empty itself, not the CUDA pose's wrapper (qaudit/runtime/standin/host.py): the
# stand-in allocates on the CPU by construction.
_EMPTY = getattr(torch.empty, "__wrapped__", torch.empty)


def _allocate(quantizer, shape, dtype):
    return quantizer.make_empty(list(shape), dtype=dtype, device=_CPU)


def quantize(tensor, quantizer, output=None, noop=None):
    if quantizer is None:
        return tensor
    if noop is not None and noop.numel() and float(noop.reshape(-1)[0]) != 0:
        return output  # TE's skip flag: leave the cached cast as it is
    src = tensor.detach()
    if output is None:
        output = _allocate(quantizer, src.shape, src.dtype if src.dtype.is_floating_point
                           else torch.float32)
    storage.fill(src, quantizer, output, _fp8_dtype(quantizer))
    _report_cast(tensor, output)
    return output


def bgrad_quantize(tensor, quantizer):
    grad_bias = tensor.reshape(-1, tensor.shape[-1]).sum(0)
    return grad_bias, quantize(tensor, quantizer)


def split_quantize(tensor, split_sizes, quantizers, *args, **kwargs):
    pieces = torch.split(tensor, [int(s) for s in split_sizes])
    return [quantize(piece, q) if q is not None else piece for piece, q in zip(pieces, quantizers)]


def dequantize(tensor, otype=None):
    shape = storage.logical_shape(tensor)
    usage = "rowwise"
    if storage.storage_family(tensor) == "float8" and tensor._data is None:
        usage = "columnwise"
    elif getattr(tensor, "_rowwise_data", True) is None:
        usage = "columnwise"
    matrix = storage.logical(tensor, usage, FP8_DTYPES)
    return matrix.reshape(shape).to(_torch_dtype(otype, _nominal_dtype(tensor)))


def fp8_transpose(data, dtype=None, out=None):
    transposed = data.reshape(-1, data.shape[-1]).t().contiguous()
    if out is None:
        return transposed
    out.copy_(transposed.reshape(out.shape))
    return out


def nvfp4_data_transpose(data, out=None):
    """An NVFP4 weight's columnwise copy made from its rowwise one (TE's 2D-scaled weights)."""
    transposed = storage.transpose_fp4(data)
    if out is None:
        return transposed
    out.copy_(transposed.reshape(out.shape))
    return out


def nvfp4_2d_scale_transpose(rowwise_scales, columnwise_scales, m_tiles, k_tiles):
    """The matching block scales: one scale a buffer (storage.py), so the same value."""
    columnwise_scales.fill_(int(rowwise_scales.reshape(-1)[0]) if rowwise_scales.numel() else 0)


def compute_amax(tensor, amax):
    amax.copy_(tensor.detach().abs().amax().float().reshape(amax.shape))


# -- norms -----------------------------------------------------------------------------------------

def _gamma(weight: torch.Tensor, zero_centered: bool) -> torch.Tensor:
    return weight + 1 if zero_centered else weight


def _norm_out(y: torch.Tensor, ln_out, quantizer, otype):
    if quantizer is not None:
        return quantize(y, quantizer, ln_out if ln_out is not None and hasattr(ln_out, "_quantizer") else None)
    y = y.to(_torch_dtype(otype, y.dtype))
    if ln_out is not None:
        ln_out.copy_(y.reshape(ln_out.shape))
        return ln_out
    return y


def layernorm_fwd(x, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    xf = x.float()
    mu = xf.mean(-1)
    rsigma = torch.rsqrt(xf.var(-1, unbiased=False) + eps)
    y = (xf - mu.unsqueeze(-1)) * rsigma.unsqueeze(-1) * _gamma(weight.float(), zero_centered_gamma)
    if bias is not None:
        y = y + bias.float()
    return _norm_out(y.to(x.dtype), ln_out, quantizer, otype), mu, rsigma


def rmsnorm_fwd(x, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    xf = x.float()
    rsigma = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    y = xf * rsigma.unsqueeze(-1) * _gamma(weight.float(), zero_centered_gamma)
    return _norm_out(y.to(x.dtype), ln_out, quantizer, otype), None, rsigma


def _norm_backward(forward, dy, x, params):
    # Recompute the norm with autograd: backward is running inside TE's own backward.
    with torch.enable_grad():
        leaves = [x.detach().float().requires_grad_(True)] + [
            p.detach().float().requires_grad_(True) for p in params]
        y = forward(*leaves)
        grads = torch.autograd.grad(y, leaves, dy.float().reshape(y.shape))
    return [g.to(t.dtype) for g, t in zip(grads, [x, *params])]


def layernorm_bwd(dy, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
    width = x.shape[-1]

    def forward(xf, g):
        return F.layer_norm(xf, (width,), _gamma(g, zero_centered_gamma), None,
                            eps=_eps_from(xf, mu, rsigma))

    dx, dgamma = _norm_backward(forward, dy, x, [gamma])
    dbeta = dy.float().reshape(-1, width).sum(0).to(gamma.dtype)
    return dx, dgamma, dbeta


def _eps_from(xf: torch.Tensor, mu, rsigma) -> float:
    # TE's backward gets rsigma, not eps; recover it from one row (it only shifts rounding).
    var = xf.detach().reshape(-1, xf.shape[-1])[0].var(unbiased=False)
    r = rsigma.reshape(-1)[0].float()
    return max(float(1.0 / (r * r) - var), 0.0)


def rmsnorm_bwd(dy, x, rsigma, gamma, sm_margin, zero_centered_gamma, *args):
    r = rsigma.detach().float().reshape(*x.shape[:-1], 1)
    eps = _rms_eps(x.float(), r)

    def forward(xf, g):  # rsigma depends on x too: recomputed, not held fixed
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * \
            _gamma(g, zero_centered_gamma)

    return tuple(_norm_backward(forward, dy, x, [gamma]))


def _rms_eps(xf: torch.Tensor, r: torch.Tensor) -> float:
    ms = xf.detach().reshape(-1, xf.shape[-1])[0].pow(2).mean()
    rr = r.reshape(-1)[0]
    return max(float(1.0 / (rr * rr) - ms), 0.0)


# -- grouped rows ------------------------------------------------------------------------------------

def _row_blocks(rows_in, rows_out):
    """(source start, destination start, rows copied, destination block end) per group."""
    src = dst = 0
    for m_in, m_out in zip(rows_in, rows_out):
        m_in, m_out = int(m_in), int(m_out)
        yield src, dst, min(m_in, m_out), dst + m_out
        src, dst = src + m_in, dst + m_out


def fused_multi_row_padding(inp, out, m_splits, padded_m_splits):
    """TE's Fp8Padding (Megatron's grouped experts under a quantized recipe): each group's
    rows, then zero rows up to its padded count."""
    for src, dst, rows, end in _row_blocks(m_splits, padded_m_splits):
        out[dst:dst + rows].copy_(inp[src:src + rows])
        out[dst + rows:end].zero_()


def fused_multi_row_unpadding(inp, out, padded_m_splits, m_splits):
    """The inverse: each group's first rows, its padding dropped."""
    for src, dst, rows, _ in _row_blocks(padded_m_splits, m_splits):
        out[dst:dst + rows].copy_(inp[src:src + rows])


# -- attention layouts (TE's MXFP8 attention) ----------------------------------------------------------

def multi_tensor_transpose_to_bhsd(tensors, original_format, outputs=None):
    """Each 4-D tensor ([s, b, h, d] or [b, s, h, d]) as [b, h, s, d]; into `outputs` when
    given (TE sizes those with the last dimension padded: the padding is left as it is)."""
    order = (1, 2, 0, 3) if original_format == "sbhd" else (0, 2, 1, 3)
    results = []
    for i, tensor in enumerate(tensors):
        if tensor is None:
            results.append(None)
            continue
        permuted = tensor.permute(*order)
        out = outputs[i] if outputs is not None else None
        if out is None:
            results.append(permuted.contiguous())
            continue
        out[..., :permuted.shape[-1]].copy_(permuted)
        results.append(out)
    return results


def multi_tensor_swizzle_scales_for_gemm_unchecked_(tensors, rowwise, columnwise):
    """cuBLAS's block-scale layout, in place. The stand-in writes one scale per buffer
    (storage.py), so any reordering of a buffer leaves it as it is."""
    for tensor in tensors:
        storage.storage_family(tensor)  # a format the stand-in cannot read is refused by name


# -- the module --------------------------------------------------------------------------------------

ENTRY_POINTS = {
    "generic_gemm": generic_gemm,
    "te_general_grouped_gemm": te_general_grouped_gemm,
    "te_general_grouped_gemm_for_grouped_tensor": te_general_grouped_gemm_for_grouped_tensor,
    "te_general_grouped_gemm_for_discrete_in": te_general_grouped_gemm_for_grouped_tensor,
    "te_general_grouped_gemm_for_discrete_out": te_general_grouped_gemm_for_grouped_tensor,
    "splits_to_offsets_multi": splits_to_offsets_multi,
    "quantize": quantize,
    "bgrad_quantize": bgrad_quantize,
    "split_quantize": split_quantize,
    "dequantize": dequantize,
    "fp8_transpose": fp8_transpose,
    "compute_amax": compute_amax,
    "nvfp4_data_transpose": nvfp4_data_transpose,
    "nvfp4_2d_scale_transpose": nvfp4_2d_scale_transpose,
    "create_empty_quantized_tensor": create_empty_quantized_tensor,
    "layernorm_fwd": layernorm_fwd,
    "layernorm_bwd": layernorm_bwd,
    "rmsnorm_fwd": rmsnorm_fwd,
    "rmsnorm_bwd": rmsnorm_bwd,
    "fused_multi_row_padding": fused_multi_row_padding,
    "fused_multi_row_unpadding": fused_multi_row_unpadding,
    "multi_tensor_transpose_to_bhsd": multi_tensor_transpose_to_bhsd,
    "multi_tensor_swizzle_scales_for_gemm_unchecked_": multi_tensor_swizzle_scales_for_gemm_unchecked_,
}
def _cublaslt_version() -> int:
    """12.8: below TE's grouped-tensor GEMM threshold, so TE keeps its per-group GEMMs. With
    QAUDIT_TE_CPU_GROUPED_GEMM=1, 13.4: TE 2.19+ take their grouped-tensor path (the only
    one for single_grouped_weight), served by te_general_grouped_gemm_for_grouped_tensor.
    Opt-in: the op fuser of those releases also switches on it, onto kernels not stood in."""
    return 130400 if os.environ.get("QAUDIT_TE_CPU_GROUPED_GEMM") == "1" else 120800


CONSTANTS = {
    "get_cublasLt_version": lambda: _cublaslt_version(),
    "get_cudnn_version": lambda: 91200,
    "get_num_cublas_streams": lambda: 1,
    "get_grouped_gemm_setup_workspace_size": lambda *a: 0,  # the stand-in needs none
    "get_stream_priority_range": lambda *a: (0, -1),
    "device_supports_multicast": lambda *a: False,
    "ubuf_built_with_mpi": lambda: False,
}


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stub = _Stub(name)
        setattr(self, name, stub)
        return stub


def build(with_max512_backend: bool) -> types.ModuleType:
    module = _StandIn("transformer_engine_torch")
    module.__doc__ = "qaudit's CPU stand-in for Transformer Engine's compiled extension"
    module.QAUDIT_STAND_IN = True
    # importlib.util.find_spec reads it (transformers does, for optional packages).
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    from qaudit.runtime.standin import optimizer_kernels

    for name, value in {**ENTRY_POINTS, **optimizer_kernels.ENTRY_POINTS, **CONSTANTS}.items():
        setattr(module, name, value)
    module.DType = DType
    module.FP8FwdTensors = FP8FwdTensors
    module.FP8BwdTensors = FP8BwdTensors
    module.CommOverlapType = CommOverlapType
    module.CommOverlapAlgo = CommOverlapAlgo
    module.Float8BlockScaleTensorFormat = Float8BlockScaleTensorFormat
    module.FP8TensorMeta = FP8TensorMeta
    module.NVTE_Fused_Attn_Backend = _fused_attn_backend(with_max512_backend)
    module.get_fused_attn_backend = _no_fused_attention(module.NVTE_Fused_Attn_Backend)
    return module


def _no_fused_attention(backends: type) -> Callable[..., Any]:
    """cuDNN's fused attention does not exist on a CPU: asked for a backend (BF16/FP16 inputs;
    FP32 is refused before asking), the answer is none, and TE runs its unfused PyTorch
    attention. TE 2.20 passes one FusedAttentionParams and takes (backend, reason); earlier
    releases pass the fields and take the backend."""

    def get_fused_attn_backend(*args: Any, **kwargs: Any) -> Any:
        none = backends.NVTE_No_Backend
        if len(args) + len(kwargs) == 1:
            return none, "no fused attention on the qaudit CPU stand-in"
        return none

    return get_fused_attn_backend
