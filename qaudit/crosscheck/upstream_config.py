"""The user's config, as the user's Megatron would take it: TransformerConfig keyword arguments
and GPTModel's constructor arguments, from the input file itself (not from qaudit's reading).

YAML files hold TransformerConfig field names (flat or under `model:`): every key that is a
field of the installed TransformerConfig (MLATransformerConfig with multi-latent attention)
goes to it as written, so upstream's own `__post_init__` validates and derives the rest.
Then the audit's CPU settings replace widths (the same shrunk widths as qaudit's model: every
count kept) and parallel sizes (one process). What is replaced, and why, is in
docs/cross-check.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from qaudit.config import ModelConfig
from qaudit.megatron.dims import model_dims
from qaudit.yamlio import YamlList, YamlMap

# GPTModel constructor arguments a YAML file may carry (Megatron-Bridge provider fields).
GPT_MODEL_ARGS = ("share_embeddings_and_output_weights", "position_embedding_type",
                  "rotary_percent", "rotary_base", "rope_scaling", "rope_scaling_factor")
# Fields qaudit reads that are not TransformerConfig fields: handled by the builder itself.
HANDLED_ELSEWHERE = frozenset({"quant_recipe", "vocab_size", "seq_length",
                               "use_megatron_fsdp", "data_parallel_sharding_strategy",
                               *GPT_MODEL_ARGS})


@dataclass
class UpstreamInput:
    """What the builder hands to upstream's classes."""

    mla: bool
    config_kwargs: dict[str, Any]
    model_kwargs: dict[str, Any]
    recipe_path: str | None  # the --te-precision-config-file to load with upstream's loader
    unknown_fields: list[str] = field(default_factory=list)  # not fields of the installed config
    notes: list[str] = field(default_factory=list)


def _plain(value: Any) -> Any:
    if isinstance(value, YamlMap):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, YamlList):
        return [_plain(v) for v in value]
    return value


def cpu_overrides(config: ModelConfig) -> dict[str, Any]:
    """Widths shrunk as qaudit's own model is, one process, float32 parameters on CPU."""
    d = model_dims(config)
    overrides: dict[str, Any] = {
        "hidden_size": d.hidden, "num_attention_heads": d.heads,
        "num_query_groups": d.query_groups, "kv_channels": d.kv_channels,
        "ffn_hidden_size": d.ffn, "moe_ffn_hidden_size": d.moe_ffn if config.is_moe else None,
        "tensor_model_parallel_size": 1, "context_parallel_size": 1,
        "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1,
        "sequence_parallel": False, "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
        "bf16": False, "fp16": False, "params_dtype": torch.float32,
        "use_cpu_initialization": True, "perform_initialization": True,
        "gradient_accumulation_fusion": config.gradient_accumulation_fusion,
    }
    if config.moe_shared_expert_intermediate_size:
        overrides["moe_shared_expert_intermediate_size"] = d.shared_ffn
    if config.multi_latent_attention:
        overrides.update(q_lora_rank=d.q_lora_rank, kv_lora_rank=d.kv_lora_rank,
                         qk_head_dim=d.qk_head_dim, qk_pos_emb_head_dim=d.qk_pos_emb_head_dim,
                         v_head_dim=d.v_head_dim)
    return overrides


def from_yaml(config: ModelConfig, recipe_file: str | None, config_fields: set[str],
              mla_fields: set[str]) -> UpstreamInput:
    """`recipe_file`: the recipe qaudit opened (`--recipe` or `quant_recipe`); `config_fields`:
    the installed TransformerConfig's field names, `mla_fields`: MLATransformerConfig's."""
    mapping = config.source.mapping if config.source else {}
    written = {key: _plain(value) for key, value in mapping.items()}
    mla = bool(written.get("multi_latent_attention", False))
    known = mla_fields if mla else config_fields
    kwargs = {key: value for key, value in written.items() if key in known}
    unknown = sorted(key for key in written
                     if key not in known and key not in HANDLED_ELSEWHERE)
    overrides = cpu_overrides(config)
    kwargs.update({key: value for key, value in overrides.items() if key in known})
    if "gradient_accumulation_fusion" in written:
        kwargs["gradient_accumulation_fusion"] = written["gradient_accumulation_fusion"]
    # num_layers comes from the config as qaudit resolved it only for hybrid patterns.
    kwargs.setdefault("num_layers", config.num_layers)
    d = model_dims(config)
    model_kwargs = {
        "vocab_size": d.vocab, "max_sequence_length": d.seq_length,
        # qaudit's default, as on the training command line (upstream's GPTModel says False).
        "share_embeddings_and_output_weights": config.share_embeddings_and_output_weights,
    }
    model_kwargs.update({key: written[key] for key in GPT_MODEL_ARGS if key in written})
    return UpstreamInput(mla, kwargs, model_kwargs, recipe_file, unknown)


def dataclass_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
