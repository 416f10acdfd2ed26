"""Weights of a hybrid model's layers at real widths (qaudit.families.protocols.FamilySizes): each
layer holds one sublayer, as upstream's HybridStack builds it (docs/hybrid.md)."""

from __future__ import annotations

from qaudit.families.hybrid.fields import mixer_widths
from qaudit.families.hybrid.pattern import ATTENTION, MAMBA, MOE
from qaudit.load.config import ModelConfig
from qaudit.plan.sizes import layer_params


def stack_params(config: ModelConfig) -> int:
    return sum(hybrid_layer_params(config, symbol) for symbol in config.hybrid_pattern().main)


def mtp_layer_params(config: ModelConfig) -> int:
    return sum(hybrid_layer_params(config, symbol) for symbol in config.hybrid_pattern().mtp or "")


def hybrid_layer_params(config: ModelConfig, symbol: str) -> int:
    """Weights of one layer of the pattern, by its symbol."""
    h = config.hidden_size
    if symbol == MAMBA:
        d_inner, _, in_proj = mixer_widths(config)
        return h * in_proj + d_inner * h
    attention_and_dense = layer_params(config, moe=False)
    mlp = h * config.ffn_hidden_size * (2 if config.gated_linear_unit else 1) \
        + config.ffn_hidden_size * h
    if symbol == ATTENTION:
        return attention_and_dense - mlp
    if symbol == MOE:
        return layer_params(config, moe=True) - (attention_and_dense - mlp)
    return mlp
