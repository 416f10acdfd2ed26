"""Tensor widths of the built model: shrunk by default, real with `full_size`.

Invocation patterns depend on structure (layers, experts, MTP depths, router top-k), not on
width, so the default build keeps every count and cuts every width to a small value.
"""

from __future__ import annotations

from dataclasses import dataclass

from qaudit.config import ModelConfig


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    query_groups: int
    kv_channels: int
    ffn: int
    moe_ffn: int
    shared_ffn: int
    vocab: int
    seq_length: int = 8
    micro_batch_size: int = 2
    # Multi-latent attention (0 / None when the model does not use it).
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.query_groups) * self.kv_channels


def model_dims(config: ModelConfig, full_size: bool = False) -> Dims:
    mla = config.multi_latent_attention
    if full_size:
        return Dims(config.hidden_size, config.num_attention_heads, config.num_query_groups,
                    config.kv_channels, config.ffn_hidden_size, config.moe_ffn_hidden_size,
                    config.moe_shared_expert_intermediate_size or 0, config.vocab_size or 32000,
                    q_lora_rank=config.q_lora_rank if mla else None,
                    kv_lora_rank=config.kv_lora_rank if mla else 0,
                    qk_head_dim=config.qk_head_dim if mla else 0,
                    qk_pos_emb_head_dim=config.qk_pos_emb_head_dim if mla else 0,
                    v_head_dim=config.v_head_dim if mla else 0)
    grouped = config.num_query_groups < config.num_attention_heads
    return Dims(hidden=32, heads=2, query_groups=1 if grouped else 2, kv_channels=16, ffn=64,
                moe_ffn=32, shared_ffn=32 if config.moe_shared_expert_intermediate_size else 0,
                vocab=64,
                # Whether q has its own down-projection changes the module names: keep it.
                q_lora_rank=(32 if config.q_lora_rank else None) if mla else None,
                kv_lora_rank=16 if mla else 0, qk_head_dim=16 if mla else 0,
                qk_pos_emb_head_dim=8 if mla else 0, v_head_dim=16 if mla else 0)
