"""Tensor widths of the built model: shrunk by default, real with `full_size`.

Invocation patterns depend on structure (layers, experts, MTP depths, router top-k), not on
width, so the default build keeps every count and cuts every width to a small value.
"""

from __future__ import annotations

from dataclasses import dataclass

from qaudit.load.config import ModelConfig
from qaudit.families.hybrid.fields import mixer_widths


@dataclass(frozen=True, kw_only=True)
class Dims:
    hidden: int
    heads: int
    query_groups: int
    kv_channels: int
    ffn: int
    moe_ffn: int
    shared_ffn: int
    vocab: int
    moe_latent: int = 0  # the experts' width between the MoE latent projections (0: none)
    seq_length: int = 8
    micro_batch_size: int = 2
    # Multi-latent attention (0 / None when the model does not use it).
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    # Mamba mixer (hybrid models): d_inner = mamba_heads * mamba_head_dim.
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_groups: int = 0
    mamba_state: int = 0

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.query_groups) * self.kv_channels

    @property
    def d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def in_proj_out(self) -> int:
        """The mixer's in_proj packs z, x (d_inner each), B, C (groups * state each), dt (heads)."""
        return 2 * self.d_inner + 2 * self.mamba_groups * self.mamba_state + self.mamba_heads


def model_dims(config: ModelConfig, full_size: bool = False) -> Dims:
    mla = config.multi_latent_attention
    if full_size:
        _, nheads, _ = mixer_widths(config)
        return Dims(hidden=config.hidden_size, heads=config.num_attention_heads,
                    query_groups=config.num_query_groups, kv_channels=config.kv_channels,
                    ffn=config.ffn_hidden_size, moe_ffn=config.moe_ffn_hidden_size,
                    shared_ffn=config.moe_shared_expert_intermediate_size or 0,
                    vocab=config.vocab_size or 32000, moe_latent=config.moe_latent_size or 0,
                    q_lora_rank=config.q_lora_rank if mla else None,
                    kv_lora_rank=config.kv_lora_rank if mla else 0,
                    qk_head_dim=config.qk_head_dim if mla else 0,
                    qk_pos_emb_head_dim=config.qk_pos_emb_head_dim if mla else 0,
                    v_head_dim=config.v_head_dim if mla else 0,
                    mamba_heads=nheads, mamba_head_dim=config.mamba_head_dim,
                    mamba_groups=config.mamba_num_groups, mamba_state=config.mamba_state_dim)
    grouped = config.num_query_groups < config.num_attention_heads
    return Dims(hidden=32, heads=2, query_groups=1 if grouped else 2, kv_channels=16, ffn=64,
                moe_ffn=32, shared_ffn=32 if config.moe_shared_expert_intermediate_size else 0,
                vocab=64, moe_latent=16 if config.moe_latent_size else 0,
                # Whether q has its own down-projection changes the module names: keep it.
                q_lora_rank=(32 if config.q_lora_rank else None) if mla else None,
                kv_lora_rank=16 if mla else 0, qk_head_dim=16 if mla else 0,
                qk_pos_emb_head_dim=8 if mla else 0, v_head_dim=16 if mla else 0,
                # Mamba: d_inner = 2 * hidden as upstream's default expand; 8 heads in 2 groups.
                mamba_heads=8, mamba_head_dim=8, mamba_groups=2, mamba_state=8)
