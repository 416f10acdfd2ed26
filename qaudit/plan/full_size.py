"""--full-size builds every weight at its real width (on the meta device: no storage). A
tensor's element count must still exist: torch computes its byte size in int64, and widths
each within their own plausibility bound (1,000,000) multiply past that (hidden, heads and
kv_channels of 1,000,000: a 3e18-element linear_qkv). Refused here, naming the fields, before
anything is built.
"""

from __future__ import annotations

from qaudit.errors import InputError
from qaudit.load.config import ModelConfig
from qaudit.plan.dims import model_dims
from qaudit.plan.shapes import Parallel, module_widths

# The largest weight of a real model is about 2.1e9 elements (Llama-3.1-405B's 128,256 x
# 16,384 output layer); 2^36 (6.9e10) is 30x that, and at 8 bytes an element far inside int64.
MAX_TENSOR_ELEMENTS = 2 ** 36

# The fields each weight's widths come from, for the message.
_ATTENTION = ("hidden_size", "num_attention_heads", "num_query_groups", "kv_channels")
_MLA = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
        "qk_pos_emb_head_dim", "v_head_dim")
_FIELDS = {
    "embedding": ("vocab_size", "hidden_size"),
    "output_layer": ("vocab_size", "hidden_size"),
    "linear_qkv": _ATTENTION, "linear_proj": _ATTENTION, "linear_q": _ATTENTION,
    "linear_kv": _ATTENTION,
    "linear_q_down_proj": _MLA, "linear_q_up_proj": _MLA, "linear_q_proj": _MLA,
    "linear_kv_down_proj": _MLA, "linear_kv_up_proj": _MLA, "linear_qkv_down_proj": _MLA,
    "linear_fc1": ("hidden_size", "ffn_hidden_size"),
    "linear_fc2": ("hidden_size", "ffn_hidden_size"),
    "experts.linear_fc1": ("hidden_size", "moe_ffn_hidden_size", "moe_latent_size"),
    "experts.linear_fc2": ("hidden_size", "moe_ffn_hidden_size", "moe_latent_size"),
    "shared_experts.linear_fc1": ("hidden_size", "moe_shared_expert_intermediate_size"),
    "shared_experts.linear_fc2": ("hidden_size", "moe_shared_expert_intermediate_size"),
    "fc1_latent_proj": ("hidden_size", "moe_latent_size"),
    "fc2_latent_proj": ("hidden_size", "moe_latent_size"),
    "eh_proj": ("hidden_size",),
    "in_proj": ("hidden_size", "mamba_num_heads", "mamba_head_dim", "mamba_num_groups",
                "mamba_state_dim"),
    "out_proj": ("hidden_size", "mamba_num_heads", "mamba_head_dim"),
}
_PLACES = {"experts": "decoder.layers.mlp.experts", "shared_experts":
           "decoder.layers.mlp.shared_experts", "": "decoder.layers.self_attention"}


def largest_weights(config: ModelConfig) -> list[tuple[str, int]]:
    """(weight, elements) for every kind of weight a full-size build makes, widths unsplit."""
    dims = model_dims(config, full_size=True)
    found = [("embedding", dims.vocab * dims.hidden)]
    for name in _FIELDS:
        place, _, leaf = name.rpartition(".")
        if leaf == "embedding":
            continue
        widths = module_widths(leaf, f"{_PLACES[place]}.{leaf}", config, dims, Parallel())
        if widths is not None and widths[0] > 0 and widths[1] > 0:
            found.append((name, widths[0] * widths[1]))
    found.append(("router", dims.hidden * (config.num_moe_experts or 0)))
    return found


def check_full_size_tensors(config: ModelConfig) -> None:
    """Refuse a weight past MAX_TENSOR_ELEMENTS, naming the fields its widths come from."""
    for name, elements in largest_weights(config):
        if elements <= MAX_TENSOR_ELEMENTS:
            continue
        fields = _FIELDS.get(name, ("hidden_size", "num_moe_experts"))
        values = ", ".join(f"{field} {getattr(config, field, None)}" for field in fields
                           if getattr(config, field, None) is not None)
        key = fields[-1] if name not in ("embedding", "output_layer") else "vocab_size"
        raise InputError(f"--full-size: the {name} weight would have {elements:.3g} elements "
                         f"({values}); more than {MAX_TENSOR_ELEMENTS:.3g} (30x the largest real "
                         "model's largest weight) cannot be a real model's. Audit without "
                         "--full-size (same layers and experts, shrunk widths)",
                         file=config.file, line=config.line_of(key), key=key)
