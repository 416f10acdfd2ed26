"""Writing and reading the buffers of TE's quantized tensors on the CPU.

TE's Python allocates a quantized tensor's buffers (FP8 bytes, scale inverses, a transpose)
and hands them to its cast kernel to fill; its GEMM then reads them. The stand-in plays both
kernels, so the only contract is with itself: what `fill` writes, `logical` reads back. The
buffer shapes are TE's own (its quantizers allocate them); the values are the stand-in's:

- per-tensor FP8 (delayed and current scaling): the scale TE's quantizer holds (delayed) or
  amax-derived (current), E4M3/E5M2 bytes, the transpose where TE asked for one;
- MXFP8 and Float8 block scaling: one power-of-two scale for the whole tensor written into
  every entry of TE's block-scale buffer. Real kernels scale per 32-element or 128-element
  block; the audit reads decisions, not bits (docs/te-runtime.md, "limits");
- NVFP4: E2M1 codes packed two to a byte (the even element in the low nibble), the tensor's
  amax in TE's amax buffer and the largest E4M3 block scale (448) in every block-scale entry,
  so a value decodes as code x amax / 6, TE's two-level scaling with one block scale for the
  whole tensor. The columnwise copy is the transpose; the random Hadamard transform TE's
  kernel applies to both operands of a weight-gradient GEMM cancels in that product and is
  not applied (H is orthogonal), and rounding is to nearest, never stochastic.
"""

from __future__ import annotations

import math
import struct

import torch

from qaudit.runtime.fakequant import E2M1_GRID, E2M1_MAX as FP4_MAX

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# E2M1's magnitudes by code (bit 3 is the sign) and the midpoints that round to them.
_E2M1 = torch.tensor(E2M1_GRID)
_E2M1_SIGNED = torch.cat([_E2M1, -_E2M1])
_E2M1_MIDPOINTS = (_E2M1[1:] + _E2M1[:-1]) / 2
_E4M3_MAX_BYTE = int(torch.tensor(448.0).to(torch.float8_e4m3fn).view(torch.uint8))


class NotStoodIn(NotImplementedError):
    """A TE kernel or format the CPU stand-in does not provide."""


def family(quantizer) -> str:
    name = type(quantizer).__name__
    if name in ("Float8Quantizer", "Float8CurrentScalingQuantizer"):
        return "float8"
    if name == "MXFP8Quantizer":
        return "mxfp8"
    if name == "Float8BlockQuantizer":
        return "block"
    if name == "NVFP4Quantizer":
        return "nvfp4"
    raise NotStoodIn(f"the qaudit CPU stand-in has no cast kernel for TE's {name}")


def storage_family(tensor) -> str | None:
    """Which quantized storage `tensor` is (None for a plain tensor)."""
    # Asked for every GEMM operand and cast: answered once per class (TE's constructors set
    # every buffer attribute, so all instances of a class look alike).
    kind = type(tensor)
    found = _FAMILIES.get(kind, _UNSEEN)
    if found is _UNSEEN:
        found = _FAMILIES[kind] = _family_of(tensor)
    return found


_FAMILIES: dict[type, str | None] = {}
_UNSEEN = object()


def _family_of(tensor) -> str | None:
    if isinstance(tensor, torch.Tensor) and not hasattr(tensor, "_quantizer"):
        return None
    if hasattr(tensor, "_transpose") and hasattr(tensor, "_data"):
        return "float8"
    if hasattr(tensor, "_is_2D_scaled"):
        return "block"
    if hasattr(tensor, "_rowwise_data") and "MXFP8" in type(tensor).__name__:
        return "mxfp8"
    if hasattr(tensor, "_amax_rowwise") and "NVFP4" in type(tensor).__name__:
        return "nvfp4"
    if hasattr(tensor, "_rowwise_data"):
        raise NotStoodIn(f"the qaudit CPU stand-in cannot read TE's {type(tensor).__name__}")
    return None


def _encode(x: torch.Tensor, scale: float, fp8: torch.dtype) -> torch.Tensor:
    limit = FP8_MAX[fp8]
    return torch.mul(x, scale).clamp_(-limit, limit).to(fp8).view(torch.uint8)


def _decode(data: torch.Tensor, scale_inv: float, fp8: torch.dtype) -> torch.Tensor:
    return data.view(fp8).float().mul_(scale_inv)


def _float32(value: float) -> float:
    """`value` rounded to float32, as TE's kernels hold scales (double rounding through
    float64 is exact for one division: 53 >= 2 * 24 + 2 bits)."""
    try:
        return _F32.unpack(_F32.pack(value))[0]
    except OverflowError:  # beyond float32's range: infinite, as the kernel's float32 is
        return math.copysign(math.inf, value)


def _reciprocal(scale: float) -> float:
    return 1.0 / scale if scale else math.inf


_F32 = struct.Struct("f")


def _amax(x: torch.Tensor) -> float:
    # One reduction pass and one read back: scales are worked out on the host in Python
    # floats, where a tensor expression per scalar would cost a kernel dispatch each.
    return float(x.abs().amax()) if x.numel() else 0.0


def _current_scale(amax: float, fp8: torch.dtype, pow2: bool, epsilon: float) -> float:
    if epsilon:
        amax = max(amax, _float32(epsilon))
    scale = _float32(FP8_MAX[fp8] / amax) if amax > 0 else 1.0
    if pow2 and scale != math.inf:
        mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
        scale = math.ldexp(1.0, exponent - 1)
    return scale


def _first(buffer: torch.Tensor, default: float = 1.0) -> float:
    """The one scale the stand-in writes per buffer (an empty tensor has an empty buffer)."""
    return float(buffer.reshape(-1)[0]) if buffer.numel() else default


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def _transposed_as_2d(x: torch.Tensor) -> torch.Tensor:
    """A transposed buffer [last, *rest] as the matrix [last, rows]."""
    return x.reshape(x.shape[0], -1) if x.dim() != 2 else x


def fill(src: torch.Tensor, quantizer, dst, fp8: torch.dtype) -> None:
    """Quantize `src` into the buffers of `dst`, which `quantizer` allocated."""
    kind = family(quantizer)
    src = src.detach()
    if src.dtype != torch.float32:
        src = src.float()
    if src.numel() == 0:  # an expert without tokens: nothing to cast, unit scales
        _fill_empty(dst, kind)
        return
    if kind == "nvfp4":
        _fill_nvfp4(_as_2d(src), dst)
        return
    if kind == "float8":
        if type(quantizer).__name__ == "Float8Quantizer":  # delayed: TE holds scale and amax
            scale = _first(quantizer.scale)
            if quantizer.amax.numel():
                quantizer.amax.reshape(-1)[0:1].fill_(_amax(src))
        else:
            scale = _current_scale(_amax(src), fp8, bool(getattr(quantizer, "force_pow_2_scales", False)),
                                   float(getattr(quantizer, "amax_epsilon", 0.0)))
        data = _encode(src, scale, fp8)
        if dst._data is not None:
            dst._data.copy_(data.reshape(dst._data.shape))
        if getattr(dst, "_transpose", None) is not None:
            dst._transpose.copy_(_as_2d(data).t().reshape(dst._transpose.shape))
            dst._transpose_invalid = False
        dst._scale_inv.fill_(_reciprocal(scale))
        return
    pow2 = _current_scale(_amax(src), fp8, True, 0.0)
    data = _encode(src, pow2, fp8)
    if kind == "mxfp8":
        exponent = 0 if pow2 == math.inf else min(max(127 - int(math.log2(pow2)), 0), 254)
        for buffer, scales in ((dst._rowwise_data, dst._rowwise_scale_inv),
                               (dst._columnwise_data, dst._columnwise_scale_inv)):
            if buffer is not None:
                buffer.copy_(data.reshape(buffer.shape))
                scales.fill_(exponent)
        return
    if dst._rowwise_data is not None:
        dst._rowwise_data.copy_(data.reshape(dst._rowwise_data.shape))
        dst._rowwise_scale_inv.fill_(_reciprocal(pow2))
    if dst._columnwise_data is not None:
        columnwise = _as_2d(data)
        if _block_columnwise_transposed(dst):
            columnwise = columnwise.t()
        dst._columnwise_data.copy_(columnwise.reshape(dst._columnwise_data.shape))
        dst._columnwise_scale_inv.fill_(_reciprocal(pow2))


def _encode_fp4(x: torch.Tensor, amax: float) -> torch.Tensor:
    """The matrix `x` [rows, cols] as E2M1 codes of x * 6 / amax, two to a byte."""
    scaled = x * (FP4_MAX / amax) if amax > 0 else torch.zeros_like(x)
    codes = torch.bucketize(scaled.abs(), _E2M1_MIDPOINTS).to(torch.uint8)
    codes |= (scaled < 0).to(torch.uint8) << 3
    return _pack_fp4(codes)


def _pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def _decode_fp4(packed: torch.Tensor, scale: float) -> torch.Tensor:
    return _E2M1_SIGNED[_unpack_fp4(packed).long()].mul_(scale)


def transpose_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Packed codes [rows, cols / 2] as the packed transpose [cols, rows / 2]. The codes are
    kept: one scale covers both copies."""
    return _pack_fp4(_unpack_fp4(packed.reshape(-1, packed.shape[-1])).t().contiguous())


def _fill_nvfp4(x: torch.Tensor, dst) -> None:
    amax = _amax(x)
    for buffer, scales, amax_buffer, source in (
            (dst._rowwise_data, dst._rowwise_scale_inv, dst._amax_rowwise, x),
            (dst._columnwise_data, dst._columnwise_scale_inv, dst._amax_columnwise, x.t().contiguous())):
        if buffer is None:
            continue
        buffer.copy_(_encode_fp4(source, amax).reshape(buffer.shape))
        scales.fill_(_E4M3_MAX_BYTE)
        amax_buffer.fill_(amax)


def _nvfp4_logical(tensor, use_columnwise: bool) -> torch.Tensor:
    data, scales, amax = ((tensor._columnwise_data, tensor._columnwise_scale_inv, tensor._amax_columnwise)
                          if use_columnwise else
                          (tensor._rowwise_data, tensor._rowwise_scale_inv, tensor._amax_rowwise))
    block_scale = float(scales.reshape(-1)[:1].view(torch.float8_e4m3fn).float()) if scales.numel() else 448.0
    # TE's decode: code x block scale x (amax / (6 x 448)), the second factor the global scale.
    scale = block_scale * _first(amax, 0.0) / (FP4_MAX * 448.0)
    if use_columnwise:
        return _decode_fp4(data.reshape(data.shape[0], -1), scale).t()
    return _decode_fp4(data.reshape(-1, data.shape[-1]), scale)


def _fill_empty(dst, kind: str) -> None:
    names = (("_scale_inv",) if kind == "float8" else ("_rowwise_scale_inv", "_columnwise_scale_inv"))
    unit = {"mxfp8": 127, "nvfp4": _E4M3_MAX_BYTE}.get(kind, 1.0)  # E8M0 bias 127: a scale of 1
    if kind == "nvfp4":  # no element: an amax of 0, never the allocation's leftover bytes
        for amax in (dst._amax_rowwise, dst._amax_columnwise):
            if amax is not None:
                amax.zero_()
    for name in names:
        buffer = getattr(dst, name, None)
        if buffer is not None and buffer.numel():
            buffer.fill_(unit)


def _block_columnwise_transposed(storage) -> bool:
    fmt = getattr(storage, "_data_format", None)
    return fmt is None or "COMPACT" not in str(getattr(fmt, "name", fmt))


def _fp8_of(storage, dtypes) -> torch.dtype:
    return dtypes[int(storage._fp8_dtype)]


def logical(tensor, usage: str, dtypes) -> torch.Tensor:
    """`tensor` as a float32 matrix [rows, last dim], read from the buffer `usage` selects
    ("rowwise" or "columnwise", as TE's GEMM picks it per operand and layout)."""
    kind = storage_family(tensor)
    if kind is None:
        return _as_2d(tensor.float() if tensor.dtype != torch.float32 else tensor)
    if kind == "nvfp4":
        columnwise = tensor._columnwise_data is not None
        return _nvfp4_logical(tensor, (usage == "columnwise" and columnwise) or tensor._rowwise_data is None)
    fp8 = _fp8_of(tensor, dtypes)
    if kind == "float8":
        scale_inv = _first(tensor._scale_inv)
        transpose = getattr(tensor, "_transpose", None)
        if usage == "columnwise" and transpose is not None and not tensor._transpose_invalid:
            return _decode(_transposed_as_2d(transpose), scale_inv, fp8).t()
        if tensor._data is None:
            return _decode(_transposed_as_2d(transpose), scale_inv, fp8).t()
        return _decode(_as_2d(tensor._data), scale_inv, fp8)
    rowwise, columnwise = tensor._rowwise_data, tensor._columnwise_data
    use_columnwise = (usage == "columnwise" and columnwise is not None) or rowwise is None
    if kind == "mxfp8":
        data, scales = ((columnwise, tensor._columnwise_scale_inv) if use_columnwise
                        else (rowwise, tensor._rowwise_scale_inv))
        scale_inv = math.ldexp(1.0, int(_first(scales, 127.0)) - 127)
        return _decode(_as_2d(data), scale_inv, fp8)
    if use_columnwise:
        scale_inv = _first(tensor._columnwise_scale_inv)
        if _block_columnwise_transposed(tensor):
            return _decode(_transposed_as_2d(columnwise), scale_inv, fp8).t()
        return _decode(_as_2d(columnwise), scale_inv, fp8)
    return _decode(_as_2d(rowwise), _first(tensor._rowwise_scale_inv), fp8)


def logical_shape(tensor) -> tuple[int, ...]:
    """The shape TE's quantized tensor stands for."""
    if isinstance(tensor, torch.Tensor):
        return tuple(tensor.shape)
    kind = storage_family(tensor)
    if kind == "float8":
        if tensor._data is not None:
            return tuple(tensor._data.shape)
        t = tensor._transpose.shape
        return (*t[1:], t[0])
    if kind == "nvfp4":  # two codes a byte; the columnwise copy is the transpose
        if tensor._rowwise_data is not None:
            *rest, last = tensor._rowwise_data.shape
            return (*rest, last * 2)
        first, *rest = tensor._columnwise_data.shape
        rest[-1] *= 2
        return (*rest, first)
    if tensor._rowwise_data is not None:
        return tuple(tensor._rowwise_data.shape)
    c = tensor._columnwise_data.shape
    if kind == "block" and _block_columnwise_transposed(tensor):
        return (*c[1:], c[0])
    return tuple(c)


_BUFFERS = ("_data", "_transpose", "_rowwise_data", "_columnwise_data")


def buffer_addresses(tensor) -> set[int]:
    """Addresses of a quantized tensor's data buffers: TE may keep a different Python object
    (a wrapper, a view) over the buffers its cast kernel filled."""
    found = set()
    for name in _BUFFERS:
        buffer = getattr(tensor, name, None)
        if isinstance(buffer, torch.Tensor) and buffer.numel():
            found.add(buffer.data_ptr())
    return found
