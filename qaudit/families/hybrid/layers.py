"""The layers of a hybrid (Mamba) model, one sublayer each, with HybridStack's module names.

Upstream's hybrid spec builds one kind of layer per pattern symbol (docs/hybrid.md):
`M` a Mamba layer (`mixer.in_proj` TELayerNormColumnParallelLinear, `mixer.out_proj`
TERowParallelLinear), `*` an attention-only layer (`self_attention.linear_qkv/linear_proj`),
`-` an MLP-only layer (`mlp.linear_fc1/fc2`), `E` an MoE-only layer whose experts are always
grouped (`mlp.experts.linear_fc1/fc2`, `mlp.router`, `mlp.shared_experts.*`).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from qaudit.families.hybrid.pattern import ATTENTION, MAMBA, MLP as MLP_SYMBOL, MOE
from qaudit.model.layers import MLP, Builder, MoELayer, SelfAttention
from qaudit.model.recompute import checkpointed
from qaudit.load.precision import Quant


class MambaMixer(torch.nn.Module):
    """The two TE linears of upstream's MambaMixer around a cheap stand-in for its
    convolution and selective scan: only the linears are audited, and the stand-in lets every
    in_proj output (z, x, B, C, dt) reach out_proj so both get realistic gradients."""

    def __init__(self, b: Builder) -> None:
        super().__init__()
        d = b.dims
        self.dims = d
        self.in_proj = b.norm_column(d.hidden, d.in_proj_out)  # TE spec: the layer's norm fused
        self.out_proj = b.row(d.d_inner, d.hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        d = self.dims
        s, batch, _ = h.shape
        bc_width = d.mamba_groups * d.mamba_state
        z, x, b, c, dt = self.in_proj(h).split([d.d_inner, d.d_inner, bc_width, bc_width,
                                                d.mamba_heads], dim=-1)
        per_group = (b * c).reshape(s, batch, d.mamba_groups, d.mamba_state).sum(-1)
        per_head = dt + per_group.repeat_interleave(d.mamba_heads // d.mamba_groups, dim=-1)
        gate = torch.sigmoid(per_head).repeat_interleave(d.mamba_head_dim, dim=-1)
        return self.out_proj(x * gate * F.silu(z))


class MambaLayer(torch.nn.Module):
    def __init__(self, b: Builder) -> None:
        super().__init__()
        self.mixer = MambaMixer(b)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mixer(h)


class AttentionLayer(torch.nn.Module):
    """A TransformerLayer built with only its self-attention (the norm fused into linear_qkv)."""

    def __init__(self, b: Builder) -> None:
        super().__init__()
        self.self_attention = SelfAttention(b)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.self_attention(h)


class _MLPOnlyLayer(torch.nn.Module):
    """A TransformerLayer built with only its MLP; selective recompute applies as in GPT."""

    def __init__(self, b: Builder, mlp: torch.nn.Module, recompute_kind: str) -> None:
        super().__init__()
        self.runtime = b.session.runtime
        self.recompute_mlp = b.config.selective_recompute(recompute_kind)
        self.mlp = mlp

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        if self.recompute_mlp and self.training:
            return checkpointed(self.mlp, self.runtime, h)
        return self.mlp(h)


class MLPLayer(_MLPOnlyLayer):
    def __init__(self, b: Builder) -> None:
        super().__init__(b, MLP(b, b.dims.ffn), "mlp")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self._mlp(h)


class MoETransformerLayer(_MLPOnlyLayer):
    def __init__(self, b: Builder) -> None:
        # The hybrid spec asks for grouped experts whatever moe_grouped_gemm says.
        super().__init__(b, MoELayer(b, grouped=True), "moe")
        self.pre_mlp_layernorm = torch.nn.LayerNorm(b.dims.hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self._mlp(self.pre_mlp_layernorm(h))


_LAYERS: dict[str, Callable[[Builder], torch.nn.Module]] = {
    MAMBA: MambaLayer, ATTENTION: AttentionLayer, MLP_SYMBOL: MLPLayer, MOE: MoETransformerLayer}


def hybrid_layers(b: Builder, symbols: str) -> list[torch.nn.Module]:
    return [_LAYERS[symbol](b) for symbol in symbols]


class HybridStack(torch.nn.Module):
    """The layers of one MTP depth (`mtp_model_layer.layers.J`): each under its own ambient
    precision, checkpointed under full recompute as upstream's stack does."""

    def __init__(self, b: Builder, symbols: str, ambient: Callable[[int], Quant | None]) -> None:
        super().__init__()
        self.runtime, self.ambient = b.session.runtime, ambient
        self.layers = torch.nn.ModuleList(hybrid_layers(b, symbols))
        self.recompute = b.config.recomputed_layers(len(self.layers))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            with self.runtime.autocast(self.ambient(index)):
                if self.recompute[index] and self.training:
                    h = checkpointed(layer, self.runtime, h)
                else:
                    h = layer(h)
        return h
