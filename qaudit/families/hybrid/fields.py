"""Hybrid (Mamba) model fields: one pattern, resolved and checked as HybridModel does.

`resolve` turns the deprecated spellings into `hybrid_layer_pattern` and derives `num_layers`
and `mtp_num_layers` from it; `validate` rejects what upstream rejects at construction, at the
offending key. The command-line rules (`--num-layers` overridden, legacy MTP pattern) live in
`qaudit.load.sources.translate`. Facts and upstream paths: docs/hybrid.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from qaudit.errors import InputError
from qaudit.families.hybrid.pattern import MAMBA, MOE, parse_pattern, pattern_from_ratios
from qaudit.load.field_checks import POSITIVE, Check, optional, ratio
from qaudit.load.yamlio import short_repr

if TYPE_CHECKING:
    from qaudit.load.model_config import ModelConfig

_PATTERN_KEYS = ("hybrid_layer_pattern", "hybrid_override_pattern")


def _pattern(key: str, value: Any) -> Any:
    if value is None:
        return None
    try:
        parse_pattern(value)
    except ValueError as exc:
        raise ValueError(f"{exc} (pattern {short_repr(value)})") from None
    return value


# The family's fields (declared in ModelConfig) and the check of each value.
CHECKS: dict[str, Check] = {
    "hybrid_layer_pattern": _pattern,
    "hybrid_override_pattern": _pattern,
    "hybrid_attention_ratio": ratio,
    "hybrid_mlp_ratio": ratio,
    "mamba_state_dim": POSITIVE,
    "mamba_head_dim": POSITIVE,
    "mamba_num_groups": POSITIVE,
    "mamba_num_heads": optional(POSITIVE),
}


def claims(config: ModelConfig) -> bool:
    return config.hybrid_layer_pattern is not None


def counts_layers(values: dict[str, Any]) -> bool:
    """Whether the given fields hold a pattern, which then gives `num_layers`."""
    return any(values.get(key) is not None for key in _PATTERN_KEYS)


def resolve(config: ModelConfig, given: set[str]) -> None:
    def fail(key: str, message: str) -> None:
        raise InputError(message, file=config.file, line=config.line_of(key), key=key)

    if config.hybrid_override_pattern is not None:
        if config.hybrid_layer_pattern is not None:
            fail("hybrid_override_pattern", "cannot be set together with hybrid_layer_pattern "
                 "(HybridModel rejects it; the override form is the deprecated spelling)")
        config.hybrid_layer_pattern = config.hybrid_override_pattern
    key = "hybrid_layer_pattern" if "hybrid_layer_pattern" in given else "hybrid_override_pattern"
    ratios = config.hybrid_attention_ratio > 0 or config.hybrid_mlp_ratio > 0
    if ratios:
        ratio_key = "hybrid_attention_ratio" if config.hybrid_attention_ratio > 0 else "hybrid_mlp_ratio"
        if config.is_hybrid:
            fail(ratio_key, f"cannot be combined with {key} (HybridModel rejects it)")
        if config.hybrid_attention_ratio + config.hybrid_mlp_ratio > 1:
            fail(ratio_key, "hybrid_attention_ratio + hybrid_mlp_ratio must be at most 1")
        if "num_layers" not in given:
            fail(ratio_key, "the ratios need num_layers to allocate layers")
        config.hybrid_layer_pattern = pattern_from_ratios(
            config.num_layers, config.hybrid_attention_ratio, config.hybrid_mlp_ratio)
        # On through the pattern's checks: a ratio pattern has no MTP part, so mtp_num_layers
        # is refused below (building its depths from nothing was an internal error).
        key = f"the pattern {ratio_key} makes"
    pattern = config.hybrid_pattern()
    if pattern is None:
        return
    if "share_embeddings_and_output_weights" not in given:
        config.share_embeddings_and_output_weights = False  # HybridModel's default, unlike GPT's
    if "num_layers" in given and config.num_layers != len(pattern.main):
        fail("num_layers", f"contradicts {key}: the pattern has {len(pattern.main)} decoder "
             f"layers ({short_repr(pattern.main)}); drop num_layers or make them agree")
    config.num_layers = len(pattern.main)
    if config.mtp_num_layers and config.mtp_num_layers != pattern.mtp_depths:
        depths = (f"{pattern.mtp_depths} MTP depths" if pattern.mtp_depths
                  else "no MTP part ('/' followed by the layers of one depth)")
        fail("mtp_num_layers", f"contradicts {key}, which has {depths}; a hybrid model builds "
             "MTP depths only from the pattern")
    if pattern.mtp_depths:
        config.mtp_num_layers = pattern.mtp_depths


def mixer_widths(config: ModelConfig) -> tuple[int, int, int]:
    """(d_inner, nheads, in_proj outputs) of the Mamba mixer at real widths."""
    if config.mamba_num_heads is not None:
        nheads = config.mamba_num_heads
        d_inner = nheads * config.mamba_head_dim
    else:
        d_inner = 2 * config.hidden_size  # expand = 2, MambaLayer's default
        nheads = d_inner // config.mamba_head_dim
    in_proj = 2 * d_inner + 2 * config.mamba_num_groups * config.mamba_state_dim + nheads
    return d_inner, nheads, in_proj


def pattern_key(config: ModelConfig) -> str:
    """The key the file wrote the pattern under, for messages."""
    if config.line_of("hybrid_layer_pattern") is None \
            and config.line_of("hybrid_override_pattern") is not None:
        return "hybrid_override_pattern"
    return "hybrid_layer_pattern"


def validate(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    pattern = config.hybrid_pattern()
    if pattern is None:
        return
    key = pattern_key(config)
    symbols = pattern.main + (pattern.mtp or "")
    if MOE in symbols and not config.is_moe:
        fail(key, "the pattern has MoE ('E') layers but num_moe_experts is not set")
    if MAMBA in symbols:
        # A width check on a field the file leaves at its default points at the pattern.
        _validate_mixer(config, lambda field, message: fail(
            field if config.line_of(field) is not None else key, message))
    _validate_pipeline(config, pattern, key, fail)


def _validate_mixer(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    """MambaMixer's construction-time assertions (megatron/core/ssm/mamba_mixer.py)."""
    d_inner, nheads, in_proj = mixer_widths(config)
    if config.mamba_num_heads is None and d_inner % config.mamba_head_dim:
        fail("mamba_head_dim", f"2 * hidden_size ({d_inner}) must be a multiple of "
             f"mamba_head_dim ({config.mamba_head_dim}) when mamba_num_heads is not set")
    if nheads % config.mamba_num_groups:
        fail("mamba_num_groups", f"the Mamba head count ({nheads}) must be a multiple of "
             f"mamba_num_groups ({config.mamba_num_groups})")
    if config.fp8 and in_proj % 16:
        fail("mamba_state_dim", f"with fp8 the Mamba in_proj width (2 * d_inner {d_inner} + "
             f"2 * mamba_num_groups {config.mamba_num_groups} * mamba_state_dim "
             f"{config.mamba_state_dim} + heads {nheads} = {in_proj}) must be a multiple of 16")


def _validate_pipeline(config: ModelConfig, pattern, key: str,
                       fail: Callable[[str, str], None]) -> None:
    """The pipeline rules of Megatron's argument checks and `select_pipeline_segment`."""
    for field in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if getattr(config, field):
            fail(field, f"cannot be used with {key}: its '|' separators define the stages")
    stages = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size
    if not pattern.has_pipes:
        if vpp not in (None, 1):
            fail("virtual_pipeline_model_parallel_size", f"virtual pipelining of a hybrid model "
                 f"needs '|' separators in {key} (one segment per model chunk)")
        return
    for field in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        if getattr(config, field) is not None:
            fail(field, f"cannot be used when {key} has '|' separators: they define the stages")
    segments = len(pattern.segments)
    if segments % stages:
        fail(key, f"{segments} '|' segments do not split over pipeline_model_parallel_size="
             f"{stages} (Megatron rejects it)")
    derived = segments // stages
    if vpp not in (None, 1) and vpp != derived:
        fail("virtual_pipeline_model_parallel_size", f"contradicts {key}: {segments} segments "
             f"over {stages} stages make {derived} model chunks per stage")
    config.virtual_pipeline_model_parallel_size = derived if derived > 1 else None
