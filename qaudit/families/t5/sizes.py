"""Weights of a T5 model's layer stacks at real widths (qaudit.families.protocols.FamilySizes)."""

from __future__ import annotations

from qaudit.load.config import ModelConfig
from qaudit.plan.sizes import gpt_decoder_params, layer_params


def stack_params(config: ModelConfig) -> int:
    """The encoder's layers as GPT's dense ones; each decoder layer adds cross-attention
    (linear_q, linear_kv, linear_proj)."""
    h = config.hidden_size
    cross = 4 * h * config.num_attention_heads * config.kv_channels
    return (gpt_decoder_params(config) + config.encoder_num_layers * layer_params(config, False)
            + config.num_layers * cross)


def mtp_layer_params(config: ModelConfig) -> None:
    return None  # T5 builds no MTP layers (fields.validate refuses them)
