"""The layers of an encoder-decoder (T5) model with the T5 TE spec's module names.

Upstream's spec (docs/t5.md): an encoder layer is a TransformerLayer with self-attention
(`linear_qkv` TELayerNormColumnParallelLinear, `linear_proj` TERowParallelLinear; padding mask)
and a dense MLP (`linear_fc1` fused with its norm, `linear_fc2`); a decoder layer adds, between
its causal self-attention and its MLP, a separate `pre_cross_attn_layernorm` (TENorm) and a
`cross_attention` whose `linear_q` and `linear_kv` are TEColumnParallelLinear (no fused norm)
and whose `linear_proj` is TERowParallelLinear. `linear_kv` reads the encoder's output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qaudit.model import wrappers as w
from qaudit.model.layers import MLP, Builder, SelfAttention
from qaudit.model.recompute import checkpointed
from qaudit.plan.execution import decoder_layer_ambient


class CrossAttention(torch.nn.Module):
    """Queries from the decoder, keys and values from the encoder's output (upstream asserts
    as many query groups as heads, so q and kv have the same head count)."""

    def __init__(self, b: Builder) -> None:
        super().__init__()
        d = b.dims
        self.dims = d
        width = d.heads * d.kv_channels
        # Registration order as upstream's named_modules() shows the projections, the output
        # projection last as for self-attention rows.
        self.linear_q = b.linear(w.TEColumnParallelLinear, d.hidden, width)
        self.linear_kv = b.linear(w.TEColumnParallelLinear, d.hidden, 2 * width)
        self.linear_proj = b.linear(w.TERowParallelLinear, width, d.hidden)

    def forward(self, h: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        d = self.dims
        s, batch, _ = h.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(t.shape[0], batch, d.heads, d.kv_channels).permute(1, 2, 0, 3)

        # Upstream's call order: linear_kv on the context first, then linear_q.
        k, v = self.linear_kv(context).chunk(2, dim=-1)
        q = self.linear_q(h)
        ctx = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
        return self.linear_proj(ctx.permute(2, 0, 1, 3).reshape(s, batch, d.heads * d.kv_channels))


class _T5Layer(torch.nn.Module):
    def __init__(self, b: Builder, causal: bool) -> None:
        super().__init__()
        self.runtime = b.session.runtime
        self.recompute_mlp = b.config.selective_recompute("mlp")
        self.self_attention = SelfAttention(b, causal=causal)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        if self.recompute_mlp and self.training:
            return h + checkpointed(self.mlp, self.runtime, h)
        return h + self.mlp(h)


class T5EncoderLayer(_T5Layer):
    def __init__(self, b: Builder) -> None:
        super().__init__(b, causal=False)
        self.mlp = MLP(b, b.dims.ffn)

    def forward(self, h: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        return self._mlp(h + self.self_attention(h))


class T5DecoderLayer(_T5Layer):
    def __init__(self, b: Builder) -> None:
        super().__init__(b, causal=True)
        self.pre_cross_attn_layernorm = torch.nn.LayerNorm(b.dims.hidden)  # TENorm, not fused
        self.cross_attention = CrossAttention(b)
        self.mlp = MLP(b, b.dims.ffn)

    def forward(self, h: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attention(h)
        h = h + self.cross_attention(self.pre_cross_attn_layernorm(h), context)
        return self._mlp(h)


class T5Block(torch.nn.Module):
    """One TransformerBlock (the encoder or the decoder): each layer under the ambient
    precision of its own block's index and count (the encoder's config copy has the encoder's
    num_layers), full recompute per layer, a final norm."""

    def __init__(self, b: Builder, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.config, self.runtime = b.config, b.session.runtime
        self.layers = torch.nn.ModuleList(layers)
        self.final_layernorm = torch.nn.LayerNorm(b.dims.hidden)
        self.recompute = b.config.recomputed_layers(len(self.layers))

    def forward(self, h: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        count = len(self.layers)
        for index, layer in enumerate(self.layers):
            inputs = (h,) if context is None else (h, context)
            with self.runtime.autocast(decoder_layer_ambient(self.config, index, count)):
                if self.recompute[index] and self.training:
                    h = checkpointed(layer, self.runtime, *inputs)
                else:
                    h = layer(*inputs)
        return self.final_layernorm(h)
