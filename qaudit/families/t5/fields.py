"""Encoder-decoder (T5) model fields, checked as `pretrain_t5.py` and `T5Model` do.

`encoder_num_layers` marks a T5 model: T5Model gets a deep copy of the config whose
`num_layers` is the encoder's count (`encoder_config`) and keeps `num_layers` for the decoder.
`validate` rejects at the offending key what upstream rejects (pipelining, grouped-query
cross-attention) and what T5's spec never builds (MoE, MTP, MLA, hybrid layers). The
command-line rules (`--encoder-num-layers` vs `--num-layers`, `--decoder-num-layers`) live in
`qaudit.families.t5.flags`. Facts and upstream paths: docs/t5.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from qaudit.load.field_checks import POSITIVE, Check, optional

if TYPE_CHECKING:
    from qaudit.load.model_config import ModelConfig

# The family's field (declared in ModelConfig) and the check of its value.
CHECKS: dict[str, Check] = {"encoder_num_layers": optional(POSITIVE)}

# Fields whose feature T5's fixed TE spec (megatron/core/models/T5/t5_spec.py) cannot build.
_NOT_IN_T5_SPEC = (
    ("num_moe_experts", "the T5 spec builds dense MLPs only (no MoE layers)"),
    ("mtp_num_layers", "T5Model builds no multi-token prediction layers"),
    ("multi_latent_attention", "the T5 spec builds standard attention only (no MLA)"),
    ("hybrid_layer_pattern", "the T5 spec builds transformer layers only (no hybrid pattern)"),
    ("hybrid_override_pattern", "the T5 spec builds transformer layers only (no hybrid pattern)"),
)


def claims(config: ModelConfig) -> bool:
    return config.encoder_num_layers is not None


def counts_layers(values: dict[str, Any]) -> bool:
    return False  # encoder_num_layers gives the encoder's count; num_layers stays required


def resolve(config: ModelConfig, given: set[str]) -> None:
    if config.is_t5 and "share_embeddings_and_output_weights" not in given:
        config.share_embeddings_and_output_weights = False  # T5Model's default, unlike GPT's
    if config.is_t5 and config.quant_recipe is not None and config.source is not None:
        from qaudit.load.model_config import SourceNote

        # T5Model has no finish_init walk: its modules never bind a recipe config (docs/t5.md).
        config.source.notes.append(SourceNote(
            "quant_recipe: T5Model binds no module to a recipe config (it has no finish_init "
            "walk), so the recipe changes no module's precision; the global fp8/fp4 settings "
            "decide (docs/t5.md)", config.line_of("quant_recipe"), "quant_recipe",
            no_effect=True))


def validate(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    if not config.is_t5:
        return
    if config.pipeline_model_parallel_size > 1:
        fail("pipeline_model_parallel_size", "encoder-decoder (T5) models cannot be pipelined: "
             "Megatron's pretrain_t5.py raises 'Pipeline parallelism is not supported for T5.'")
    for field, why in _NOT_IN_T5_SPEC:
        if getattr(config, field):
            fail(field, f"cannot be used with encoder_num_layers (a T5 model): {why}")
    if config.num_query_groups != config.num_attention_heads:
        fail("num_query_groups", f"T5's cross-attention needs as many query groups as attention "
             f"heads ({config.num_attention_heads}); upstream's CrossAttention asserts it")
