"""CPU stand-ins, in plain PyTorch, for the `mamba_ssm` and `causal_conv1d` entry points that
Megatron's Mamba mixer imports (megatron/core/ssm/mamba_mixer.py): a gated RMSNorm module, the
chunked state-space scan, the fused conv1d + scan of the training path, and the causal
depthwise conv1d. Each runs forward and backward through autograd; the cross-check compares
the TE linears around them (calls, flags, wgrad decisions), never these numerics. A
reference form is enough: the scan is the quadratic ("attention-like") form of the SSD
recurrence, exact for the short sequences of the audit.

Put into sys.modules only while one cross-check builds and runs, by
qaudit/runtime/standin/boot.py, and only where no real package is importable. Each entry
point, with the upstream call it replaces, is listed in docs/cross-check.md.
"""

from __future__ import annotations

import importlib.machinery
import types
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from qaudit.runtime.standin import te_package as standin_te

# Megatron asks for these versions only for packed sequences (is_mamba_min_version,
# is_causal_conv1d_min_version): the releases its Mamba code was written against.
MAMBA_SSM_VERSION = "2.2.4"
CAUSAL_CONV1D_VERSION = "1.5.0"


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     seq_idx: Any = None, initial_states: Any = None,
                     return_final_states: bool = False, final_states_out: Any = None,
                     activation: str | None = None) -> torch.Tensor:
    """causal_conv1d.causal_conv1d_fn: x (batch, dim, seqlen), weight (dim, width); each channel
    sees only itself and the `width - 1` positions before it."""
    if seq_idx is not None or initial_states is not None or return_final_states:
        raise standin_te.NotOnCPU("causal_conv1d_fn with packed sequences or states "
                                  "(qaudit's CPU stand-in covers plain training)")
    width = weight.shape[-1]
    out = F.conv1d(F.pad(x, (width - 1, 0)), weight.unsqueeze(1), bias, groups=x.shape[1])
    return F.silu(out) if activation in ("silu", "swish") else out


def _per_head(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, l, groups, n) -> (b, l, heads, n): each group serves heads // groups heads."""
    return tensor.repeat_interleave(heads // tensor.shape[2], dim=2)


def _scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD recurrence h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t, y_t = C_t h_t, in its
    quadratic form: y_t = sum_{s<=t} (C_t . B_s) exp(sum_{s<r<=t} dt_r A) dt_s x_s.
    x (b, l, h, p), dt (b, l, h) already positive, A (h,), B and C (b, l, h, n).
    Returns y (b, l, h, p) and the final state (b, h, p, n)."""
    decay = torch.cumsum(dt * A, dim=1)  # (b, l, h)
    length = x.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
    gap = decay.unsqueeze(2) - decay.unsqueeze(1)  # (b, t, s, h): decay_t - decay_s
    weights = torch.exp(gap.masked_fill(~causal[None, :, :, None], float("-inf")))
    scores = torch.einsum("bthn,bshn->btsh", C, B) * weights
    inputs = x * dt.unsqueeze(-1)
    y = torch.einsum("btsh,bshp->bthp", scores, inputs)
    tail = torch.exp(decay[:, -1:, :] - decay)  # (b, s, h): decay from s to the end
    final = torch.einsum("bsh,bshp,bshn->bhpn", tail, inputs, B)
    return y, final


def mamba_chunk_scan_combined(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                              B: torch.Tensor, C: torch.Tensor, chunk_size: int,
                              D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                              dt_bias: torch.Tensor | None = None, initial_states: Any = None,
                              seq_idx: Any = None, chunk_indices: Any = None,
                              chunk_offsets: Any = None, cu_seqlens: Any = None,
                              dt_softplus: bool = False,
                              dt_limit: tuple[float, float] = (0.0, float("inf")),
                              return_final_states: bool = False,
                              return_varlen_states: bool = False,
                              state_dtype: Any = None) -> Any:
    """mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined: x (b, l, h, p), dt (b, l, h),
    A (h,), B and C (b, l, g, n), D (h,) or (h, p), z (b, l, h, p) gates the output by silu(z).
    `chunk_size` only tiles the kernel's work; the result does not depend on it."""
    if initial_states is not None or seq_idx is not None or cu_seqlens is not None \
            or return_varlen_states:
        raise standin_te.NotOnCPU("mamba_chunk_scan_combined with packed sequences or states "
                                  "(qaudit's CPU stand-in covers plain training)")
    heads = x.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)
    low, high = dt_limit
    if low > 0.0 or high != float("inf"):
        dt = dt.clamp(min=low, max=high)
    y, final = _scan(x, dt, A, _per_head(B, heads), _per_head(C, heads))
    if D is not None:
        y = y + x * (D if D.dim() == 2 else D.unsqueeze(-1))
    if z is not None:
        y = y * F.silu(z)
    return (y, final) if return_final_states else y


def _gated_rms_norm(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, eps: float,
                    group_size: int | None, norm_before_gate: bool) -> torch.Tensor:
    """RMS normalization over groups of `group_size` channels, gated by silu(z) before or
    after (mamba_ssm's layernorm_gated.rmsnorm_fn, without its bias)."""
    if z is not None and not norm_before_gate:
        x = x * F.silu(z)
    size = group_size or x.shape[-1]
    grouped = x.reshape(*x.shape[:-1], x.shape[-1] // size, size)
    normed = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    out = normed.reshape(x.shape) * weight
    if z is not None and norm_before_gate:
        out = out * F.silu(z)
    return out


class RMSNorm(torch.nn.Module):
    """mamba_ssm.ops.triton.layernorm_gated.RMSNorm (RMSNormGated in Megatron): one weight per
    channel, forward(x, z=None)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        return _gated_rms_norm(x, self.weight, z, self.eps, self.group_size,
                               self.norm_before_gate)


def mamba_split_conv1d_scan_combined(zxbcdt: torch.Tensor, conv1d_weight: torch.Tensor,
                                     conv1d_bias: torch.Tensor | None, dt_bias: torch.Tensor,
                                     A: torch.Tensor, D: torch.Tensor, chunk_size: int,
                                     initial_states: Any = None, seq_idx: Any = None,
                                     dt_limit: tuple[float, float] = (0.0, float("inf")),
                                     return_final_states: bool = False,
                                     activation: str = "silu",
                                     rmsnorm_weight: torch.Tensor | None = None,
                                     rmsnorm_eps: float = 1e-6,
                                     outproj_weight: torch.Tensor | None = None,
                                     outproj_bias: torch.Tensor | None = None,
                                     headdim: int | None = None, ngroups: int = 1,
                                     norm_before_gate: bool = True,
                                     state_dtype: Any = None) -> Any:
    """mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined, the mixer's
    training path: split in_proj's output (b, l, [z0 x0] z xBC dt), causal conv1d + silu over
    xBC, the scan gated by z, then the optional gated norm and output projection."""
    if initial_states is not None or seq_idx is not None:
        raise standin_te.NotOnCPU("mamba_split_conv1d_scan_combined with packed sequences or "
                                  "states (qaudit's CPU stand-in covers plain training)")
    heads = A.shape[0]
    headdim = headdim if headdim is not None else D.shape[-1]
    dim = heads * headdim
    conv_dim = conv1d_weight.shape[0]  # dim + 2 * ngroups * d_state
    state = (conv_dim - dim) // (2 * ngroups)
    extra = (zxbcdt.shape[-1] - dim - conv_dim - heads) // 2  # the non-SSM (SwiGLU) part
    zx0, z, xbc, dt = torch.split(zxbcdt, [2 * extra, dim, conv_dim, heads], dim=-1)
    xbc = causal_conv1d_fn(xbc.transpose(1, 2), conv1d_weight, conv1d_bias,
                           activation=activation).transpose(1, 2)
    x, B, C = torch.split(xbc, [dim, ngroups * state, ngroups * state], dim=-1)
    batch, length = zxbcdt.shape[:2]
    gate = z.reshape(batch, length, heads, headdim)
    scanned = mamba_chunk_scan_combined(
        x.reshape(batch, length, heads, headdim), dt, A,
        B.reshape(batch, length, ngroups, state), C.reshape(batch, length, ngroups, state),
        chunk_size, D=D, z=gate if rmsnorm_weight is None else None, dt_bias=dt_bias,
        dt_softplus=True, dt_limit=dt_limit, return_final_states=return_final_states)
    y, final = scanned if return_final_states else (scanned, None)
    y = y.reshape(batch, length, dim)
    if rmsnorm_weight is not None:
        y = _gated_rms_norm(y, rmsnorm_weight, z, rmsnorm_eps, dim // ngroups, norm_before_gate)
    if extra:
        first, second = zx0.chunk(2, dim=-1)
        y = torch.cat([F.silu(first) * second, y], dim=-1)
    if outproj_weight is not None:
        y = F.linear(y, outproj_weight, outproj_bias)
    return (y, final) if return_final_states else y


def _module(name: str, doc: str, **members: Any) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__dict__.update(members)
    module.__qaudit_standin__ = True
    module.__path__ = []  # a package: its submodules are the other entries
    # importlib.util.find_spec(name) reads it (transformers does, for optional packages).
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    return module


@lru_cache(maxsize=1)
def modules() -> dict[str, types.ModuleType]:
    """The stand-in packages, by sys.modules name; the same objects every time (imported
    Megatron modules keep references to them)."""
    doc = "qaudit's pure-PyTorch CPU stand-in (docs/cross-check.md)"
    gated = _module("mamba_ssm.ops.triton.layernorm_gated", doc, RMSNorm=RMSNorm)
    combined = _module("mamba_ssm.ops.triton.ssd_combined", doc,
                       mamba_chunk_scan_combined=mamba_chunk_scan_combined,
                       mamba_split_conv1d_scan_combined=mamba_split_conv1d_scan_combined)
    triton = _module("mamba_ssm.ops.triton", doc, layernorm_gated=gated, ssd_combined=combined)
    ops = _module("mamba_ssm.ops", doc, triton=triton)
    mamba = _module("mamba_ssm", doc, ops=ops, __version__=MAMBA_SSM_VERSION)
    varlen = _module("causal_conv1d.causal_conv1d_varlen", doc,
                     causal_conv1d_varlen_states=standin_te._cuda_kernel(
                         "causal_conv1d.causal_conv1d_varlen_states"))
    # causal_conv1d_update (decode, inference only) is imported by Megatron-LM main's mixer.
    conv = _module("causal_conv1d", doc, causal_conv1d_fn=causal_conv1d_fn,
                   causal_conv1d_update=standin_te._cuda_kernel("causal_conv1d.causal_conv1d_update"),
                   causal_conv1d_varlen=varlen, __version__=CAUSAL_CONV1D_VERSION)
    return {module.__name__: module for module in (mamba, ops, triton, gated, combined, conv,
                                                   varlen)}


def is_standin(function: Any) -> bool:
    return getattr(function, "__module__", "") == __name__

