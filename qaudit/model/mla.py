"""Multi-latent attention (DeepSeek-V3) with the module names and classes of Megatron's spec.

Which class each projection gets (docs/upstream-model.md, "Multi-latent attention"):
- `qk_layernorm` decides the up projections: with it, the latent's norm is fused into them
  (TELayerNormColumnParallelLinear); without it there is no such norm and they are plain
  TEColumnParallelLinear. Without `q_lora_rank`, the single `linear_q_proj` fuses the norm
  likewise when `qk_layernorm` is on.
- `mla_down_proj_fusion` replaces the two down projections (and the layer's input norm) by
  one `linear_qkv_down_proj` (TELayerNormColumnParallelLinear) whose output is split into the
  query and the key/value latents.
The Builder picks the classes, so that the modelopt spec (Megatron's own linears) reuses the
same shapes and data flow.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qaudit.plan.dims import Dims
from qaudit.model.recompute import checkpointed


def _attend(d: Dims, q: torch.Tensor, kv: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Softmax attention over MLA's query and up-projected key/value; [s, b, heads * v]."""
    s, batch = q.shape[0], q.shape[1]
    q = q.reshape(s, batch, d.heads, d.qk_head_dim + d.qk_pos_emb_head_dim)
    kv = kv.reshape(s, batch, d.heads, d.qk_head_dim + d.v_head_dim)
    k_nope, v = kv.split([d.qk_head_dim, d.v_head_dim], dim=-1)
    k = torch.cat([k_nope, k_pos.unsqueeze(2).expand(s, batch, d.heads, d.qk_pos_emb_head_dim)], -1)
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return ctx.permute(2, 0, 1, 3).reshape(s, batch, d.heads * d.v_head_dim)


class MLASelfAttention(torch.nn.Module):
    """Separate input norm, then q and kv down projections (`linear_q_down_proj` /
    `linear_kv_down_proj`, or `linear_q_proj` without `q_lora_rank`)."""

    def __init__(self, b) -> None:
        super().__init__()
        d = b.dims
        self.dims = d
        q_width = d.heads * (d.qk_head_dim + d.qk_pos_emb_head_dim)
        kv_width = d.heads * (d.qk_head_dim + d.v_head_dim)
        norm = b.config.qk_layernorm  # fused into the up projections only with qk_layernorm
        self.input_layernorm = torch.nn.LayerNorm(d.hidden)
        if d.q_lora_rank:
            self.linear_q_down_proj = b.down_projection(d.hidden, d.q_lora_rank)
            self.linear_q_up_proj = b.up_projection(d.q_lora_rank, q_width, norm)
        else:
            self.linear_q_proj = b.up_projection(d.hidden, q_width, norm)
        self.linear_kv_down_proj = b.down_projection(d.hidden, d.kv_lora_rank + d.qk_pos_emb_head_dim)
        self.linear_kv_up_proj = b.up_projection(d.kv_lora_rank, kv_width, norm)
        self.linear_proj = b.row(d.heads * d.v_head_dim, d.hidden)
        self.runtime = b.session.runtime
        self.recompute_up_proj = b.config.selective_recompute("mla_up_proj")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        d = self.dims
        x = self.input_layernorm(h)
        q_latent = self.linear_q_down_proj(x) if d.q_lora_rank else x
        latent, k_pos = self.linear_kv_down_proj(x).split([d.kv_lora_rank, d.qk_pos_emb_head_dim], -1)
        q, kv = self.up_projections(q_latent, latent)
        return self.linear_proj(_attend(d, q, kv, k_pos))

    def up_projections(self, q_latent: torch.Tensor,
                       kv_latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Upstream's `qkv_up_proj_and_rope_apply`: under selective recompute of
        `mla_up_proj` it runs checkpointed (a no-grad pass, then a grad rerun in backward)."""
        def up(q_in: torch.Tensor, kv_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            q_proj = self.linear_q_up_proj if self.dims.q_lora_rank else self.linear_q_proj
            return q_proj(q_in), self.linear_kv_up_proj(kv_in)

        if self.recompute_up_proj and self.training:
            return checkpointed(up, self.runtime, q_latent, kv_latent)
        return up(q_latent, kv_latent)


class FusedMLASelfAttention(torch.nn.Module):
    """`mla_down_proj_fusion`: one `linear_qkv_down_proj` with the input norm fused in (the
    layer's own input norm is an identity), split into the q and kv latents."""

    def __init__(self, b) -> None:
        super().__init__()
        d = b.dims
        self.dims = d
        q_width = d.heads * (d.qk_head_dim + d.qk_pos_emb_head_dim)
        self.linear_qkv_down_proj = b.layernorm_linear(
            d.hidden, d.q_lora_rank + d.kv_lora_rank + d.qk_pos_emb_head_dim)
        norm = b.config.qk_layernorm
        self.linear_q_up_proj = b.up_projection(d.q_lora_rank, q_width, norm)
        self.linear_kv_up_proj = b.up_projection(d.kv_lora_rank, d.heads * (d.qk_head_dim + d.v_head_dim),
                                                 norm)
        self.linear_proj = b.row(d.heads * d.v_head_dim, d.hidden)
        self.runtime = b.session.runtime
        self.recompute_up_proj = b.config.selective_recompute("mla_up_proj")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        d = self.dims
        q_latent, kv_latent, k_pos = self.linear_qkv_down_proj(h).split(
            [d.q_lora_rank, d.kv_lora_rank, d.qk_pos_emb_head_dim], -1)
        q, kv = self.up_projections(q_latent, kv_latent)
        return self.linear_proj(_attend(d, q, kv, k_pos))

    up_projections = MLASelfAttention.up_projections
