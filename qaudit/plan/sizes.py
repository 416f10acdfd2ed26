"""Parameter counts and memory at a config's real widths, without building anything."""

from __future__ import annotations

import os

from qaudit.load.config import ModelConfig
from qaudit.families import part_of

# A --full-size audit keeps, per parameter, the float32 weight, its main_grad, a quantized
# workspace copy and the gradient scratch of one backward.
FULL_SIZE_BYTES_PER_PARAM = 16


def layer_params(config: ModelConfig, moe: bool) -> int:
    """Weights of one transformer layer at real widths (linears and router)."""
    h = config.hidden_size
    heads, groups, kv = config.num_attention_heads, config.num_query_groups, config.kv_channels
    glu = 2 if config.gated_linear_unit else 1
    attention = h * (heads + 2 * groups) * kv + heads * kv * h
    if config.multi_latent_attention:
        q_width = heads * (config.qk_head_dim + config.qk_pos_emb_head_dim)
        q = (h * config.q_lora_rank + config.q_lora_rank * q_width) if config.q_lora_rank else h * q_width
        attention = (q + h * (config.kv_lora_rank + config.qk_pos_emb_head_dim)
                     + config.kv_lora_rank * heads * (config.qk_head_dim + config.v_head_dim)
                     + heads * config.v_head_dim * h)
    if not moe:
        return attention + h * config.ffn_hidden_size * glu + config.ffn_hidden_size * h
    return attention + moe_params(config)


def moe_params(config: ModelConfig) -> int:
    """One MoE layer's experts, router, shared experts and latent projections."""
    h = config.hidden_size
    glu = 2 if config.gated_linear_unit else 1
    latent = config.moe_latent_size or 0
    width = latent or h
    expert = width * config.moe_ffn_hidden_size * glu + config.moe_ffn_hidden_size * width
    shared = config.moe_shared_expert_intermediate_size or 0
    return (config.num_moe_experts * expert + h * config.num_moe_experts
            + h * shared * glu + shared * h + 2 * h * latent)



def mtp_depth_params(config: ModelConfig) -> int:
    """One MTP depth: eh_proj plus its layer (GPT's, or its family's)."""
    family = part_of(config, "sizes")
    inner = family.mtp_layer_params(config) if family is not None else None
    if inner is None:
        inner = layer_params(config, config.moe_layer_pattern()[-1])
    return inner + 2 * config.hidden_size ** 2


def gpt_decoder_params(config: ModelConfig) -> int:
    return sum(layer_params(config, moe) for moe in config.moe_layer_pattern())


def model_params(config: ModelConfig) -> int:
    """Every weight the audit builds: embedding, decoder (and a T5 encoder), MTP layers and
    output layer."""
    vocab = config.vocab_size or 32000
    h = config.hidden_size
    family = part_of(config, "sizes")
    layers = family.stack_params(config) if family is not None else None
    if layers is None:
        layers = gpt_decoder_params(config)
    mtp_count = 1 if config.mtp_use_repeated_layer else config.mtp_depths
    mtp = mtp_count * mtp_depth_params(config) if config.mtp_depths else 0
    output = 0 if config.share_embeddings_and_output_weights else vocab * h
    return vocab * h + layers + mtp + output


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else None
    return pages * os.sysconf("SC_PAGE_SIZE") if pages else None
