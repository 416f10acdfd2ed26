"""The model config: Megatron `TransformerConfig` field names, with the YAML line of each key,
read and checked (the types themselves are in qaudit/load/model_config.py)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

from qaudit import families
from qaudit.errors import InputError
from qaudit.families.hybrid import fields as hybrid
from qaudit.load.field_checks import (POSITIVE, Check, boolean, choice, int_at_least,
                                     optional, string)
from qaudit.load.known_fields import MODEL_PROVIDER_FIELDS, TRANSFORMER_CONFIG_FIELDS
from qaudit.load.precision import FP4_RECIPES, FP8_FORMATS, FP8_RECIPES
from qaudit.load.unmodelled import HYBRID_WITHOUT_PATTERN, no_effect_reason, note_for_setting
from qaudit.load.upstream_checks import check_upstream
# The types, re-exported: the stages import them from here.
from qaudit.load.model_config import ConfigSource, ModelConfig, SourceNote  # noqa: F401
from qaudit.load.yamlio import YamlMap, did_you_mean, load_yaml, short_repr, type_name


# --- field validation ---------------------------------------------------------------------

_RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                      "shared_experts")


def _recompute_modules(key: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"expected a list of module kinds, got {type_name(value)} {short_repr(value)}")
    for item in value:
        if item not in _RECOMPUTE_MODULES:
            hint = did_you_mean(item, _RECOMPUTE_MODULES) if isinstance(item, str) else ""
            raise ValueError(f"unknown recompute module {short_repr(item)}{hint}; "
                             f"expected some of {', '.join(_RECOMPUTE_MODULES)}")
    return list(value)


_GRAPH_MODULES = ("full", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba",
                  "full_iteration", "full_iteration_inference")


def _graph_modules(key: str, value: Any) -> Any:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    for item in items:
        if item not in _GRAPH_MODULES:
            hint = did_you_mean(item, _GRAPH_MODULES) if isinstance(item, str) else ""
            raise ValueError(f"unknown CUDA graph scope {short_repr(item)}{hint}; expected "
                             f"some of {', '.join(_GRAPH_MODULES)}")
    return list(value) if isinstance(value, list) else value


def _layout(key: str, value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(row, list) for row in value):
        return [list(row) for row in value]
    raise ValueError(f"expected a layout string such as 'Et*3|(tt|)*6tmL' or a list of lists "
                     f"of layer types, got {type_name(value)} {short_repr(value)}")


def _layer_freq(key: str, value: Any) -> Any:
    if isinstance(value, list):
        for item in value:
            if isinstance(item, bool) or item not in (0, 1):
                raise ValueError(f"a list must hold only 0 and 1 (one per layer), got {short_repr(item)}")
        return list(value)
    return int_at_least(1)(key, value)


_CHECKS: dict[str, Check] = {
    "num_layers": POSITIVE,
    "hidden_size": POSITIVE,
    "num_attention_heads": POSITIVE,
    "ffn_hidden_size": optional(POSITIVE),
    "num_query_groups": optional(POSITIVE),
    "kv_channels": optional(POSITIVE),
    "gated_linear_unit": boolean,
    "num_moe_experts": optional(POSITIVE),
    "moe_ffn_hidden_size": optional(POSITIVE),
    "moe_shared_expert_intermediate_size": optional(POSITIVE),
    "moe_latent_size": optional(POSITIVE),
    "moe_layer_freq": _layer_freq,
    "moe_grouped_gemm": boolean,
    "moe_router_topk": POSITIVE,
    "mtp_num_layers": optional(int_at_least(0)),
    "mtp_use_repeated_layer": boolean,
    "fp8": choice(*FP8_FORMATS, nullable=True),
    "fp8_recipe": choice(*FP8_RECIPES, "custom"),
    "fp4": choice("e2m1", nullable=True),
    "fp4_recipe": choice(*FP4_RECIPES, "custom"),
    "first_last_layers_bf16": boolean,
    "num_layers_at_start_in_bf16": int_at_least(0),
    "num_layers_at_end_in_bf16": int_at_least(0),
    "fp8_output_proj": boolean,
    "gradient_accumulation_fusion": boolean,
    "disable_parameter_transpose_cache": boolean,
    "use_kitchen": boolean,
    "share_embeddings_and_output_weights": boolean,
    "vocab_size": optional(POSITIVE),
    "quant_recipe": string,
    "multi_latent_attention": boolean,
    "q_lora_rank": optional(POSITIVE),
    "kv_lora_rank": POSITIVE,
    "qk_head_dim": POSITIVE,
    "qk_pos_emb_head_dim": POSITIVE,
    "v_head_dim": POSITIVE,
    "qk_layernorm": boolean,
    "mla_down_proj_fusion": boolean,
    "recompute_granularity": choice("full", "selective", nullable=True),
    "recompute_method": choice("uniform", "block", nullable=True),
    "recompute_num_layers": optional(POSITIVE),
    "recompute_modules": _recompute_modules,
    "moe_layer_recompute": boolean,
    "pipeline_model_parallel_size": POSITIVE,
    "virtual_pipeline_model_parallel_size": optional(POSITIVE),
    "num_layers_in_first_pipeline_stage": optional(int_at_least(0)),
    "num_layers_in_last_pipeline_stage": optional(int_at_least(0)),
    "account_for_embedding_in_pipeline_split": boolean,
    "account_for_loss_in_pipeline_split": boolean,
    "pipeline_model_parallel_layout": _layout,
    "use_megatron_fsdp": boolean,
    "data_parallel_sharding_strategy": choice("no_shard", "optim", "optim_grads",
                                               "optim_grads_params"),
    "delay_wgrad_compute": boolean,
    "cuda_graph_impl": choice("none", "local", "transformer_engine", "full_iteration"),
    "enable_cuda_graph": boolean,
    "external_cuda_graph": boolean,
    "cuda_graph_modules": _graph_modules,
    "cuda_graph_scope": _graph_modules,
    "fp8_param": boolean,
    "fp4_param": boolean,
    "freeze_all_layers": boolean,
    "layer_spec": choice("te", "modelopt"),
}
for _family in families.parts("fields"):  # each family checks its own fields
    _CHECKS.update(_family.CHECKS)
MODELLED_FIELDS = frozenset(f.name for f in fields(ModelConfig) if f.name != "source")
assert MODELLED_FIELDS == frozenset(_CHECKS), "every modelled field needs a check"
REQUIRED_FIELDS = ("num_layers", "hidden_size", "num_attention_heads")
# Upstream fields the audit does not model are accepted as is: they do not change which TE
# modules exist, how often they run or in which precision.
ACCEPTED_FIELDS = (TRANSFORMER_CONFIG_FIELDS | MODEL_PROVIDER_FIELDS) - MODELLED_FIELDS


def load_model_config(path: Path, display: str | None = None) -> ModelConfig:
    display = display or str(path)
    document = load_yaml(path, display)
    if not isinstance(document, YamlMap):
        raise InputError(f"expected a mapping of TransformerConfig fields, got {type_name(document)}",
                         file=display, line=getattr(document, "line", 1))
    mapping = document
    if "model" in document:
        mapping = document["model"]
        if not isinstance(mapping, YamlMap):
            raise InputError(f"expected a mapping under 'model', got {type_name(mapping)}",
                             file=display, line=document.line_of("model"), key="model")
        refuse_beside_model(document, display)
    return config_from_mapping(mapping, ConfigSource(display, path, mapping))


def refuse_beside_model(document: YamlMap, display: str) -> None:
    """A config that nests its fields under `model:` is read from there only: any other
    top-level key would be ignored (a model field written beside `model:` would silently
    drop out of the audit), so it is refused at its line."""
    known = MODELLED_FIELDS | ACCEPTED_FIELDS
    for key in document:
        if key == "model":
            continue
        line = document.line_of(key)
        if key in known:
            raise InputError("a model field at the top level, beside 'model:', where nothing "
                             "reads it: it belongs under `model:` (indent it there)",
                             file=display, line=line, key=str(key))
        close = did_you_mean(key, known | {"model"}) if isinstance(key, str) else ""
        where = " (it belongs under `model:`)" if close and close != did_you_mean(
            "model", {"model"}) else ""
        raise InputError(f"unknown top-level key{close}{where}; a config that nests its fields "
                         "under 'model:' has no other top-level key (a Megatron-Bridge "
                         "ConfigContainer names itself with a top-level _target_)",
                         file=display, line=line, key=str(key))


def config_from_mapping(mapping: YamlMap, source: ConfigSource,
                        note_settings: bool = True) -> ModelConfig:
    """`note_settings`: add a QA090 note for each setting in the unmodelled table
    (qaudit/load/unmodelled.py); the flag routes have noted their flags already."""
    values: dict[str, Any] = {}
    for key, value in mapping.items():
        line = mapping.line_of(key)
        if not isinstance(key, str):
            raise InputError("field names must be strings", file=source.file, line=line, key=str(key))
        if note_settings and key in MODELLED_FIELDS | ACCEPTED_FIELDS:
            _note_setting(source, key, value, line)
        if key in _CHECKS:
            try:
                values[key] = _CHECKS[key](key, value)
            except ValueError as exc:
                raise InputError(str(exc), file=source.file, line=line, key=key) from None
        elif key not in ACCEPTED_FIELDS:
            hint = did_you_mean(key, MODELLED_FIELDS | ACCEPTED_FIELDS)
            raise InputError(f"unknown field{hint}", file=source.file, line=line, key=key)
    for key in REQUIRED_FIELDS:
        if key not in values and not (key == "num_layers" and any(
                family.counts_layers(values) for family in families.parts("fields"))):
            raise InputError("required field is missing", file=source.file, line=mapping.line, key=key)
    if note_settings and mapping.get("is_hybrid_model") is True and not hybrid.counts_layers(values):
        source.notes.append(SourceNote(f"is_hybrid_model true: {HYBRID_WITHOUT_PATTERN}",
                                       mapping.line_of("is_hybrid_model"), "is_hybrid_model"))
    given = set(values)
    values.setdefault("num_layers", 0)  # a family may give it (a hybrid pattern does)
    config = ModelConfig(**values, source=source)
    for family in families.parts("fields"):
        family.resolve(config, given)
    fill_derived_defaults(config)
    _validate(config)
    return config


def setting_text(value: Any) -> str:
    """A setting's value as the user would write it in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return short_repr(value, 40)[1:-1]
    if isinstance(value, list):
        return "[" + ", ".join(setting_text(v) for v in value[:8]) + (", ..." if len(value) > 8 else "") + "]"
    return short_repr(value, 40)


def _note_setting(source: ConfigSource, key: str, value: Any, line: int | None) -> None:
    quiet = no_effect_reason(key, value)
    if quiet is not None:
        source.notes.append(SourceNote(f"{key} {setting_text(value)}: {quiet}", line, key,
                                       no_effect=True))
        return
    why = note_for_setting(key, value)
    if why is None:
        return
    if key == "transformer_impl" and value == "local":
        # As on the command line (qaudit/load/sources/translate.py): nothing to audit.
        raise InputError("transformer_impl local: no TE modules, nothing to audit",
                         file=source.file, line=line, key=key)
    shown = setting_text(value)
    source.notes.append(SourceNote(f"{key} {shown}: {why}", line, key))


def fill_derived_defaults(config: ModelConfig) -> None:
    """Derived defaults, as `TransformerConfig.__post_init__` fills them."""
    if config.ffn_hidden_size is None:
        config.ffn_hidden_size = 4 * config.hidden_size
    if config.num_query_groups is None:
        config.num_query_groups = config.num_attention_heads
    if config.kv_channels is None:
        config.kv_channels = max(1, config.hidden_size // config.num_attention_heads)
    if config.moe_ffn_hidden_size is None:
        config.moe_ffn_hidden_size = config.ffn_hidden_size
    if config.moe_layer_recompute:
        # The deprecated switch becomes selective recompute of "moe" (both input routes).
        if config.recompute_granularity == "full":
            raise InputError("cannot be combined with full recompute (TransformerConfig rejects "
                             "it)", file=config.file, line=config.line_of("moe_layer_recompute"),
                             key="moe_layer_recompute")
        modules = list(config.recompute_modules or ["core_attn"])
        config.recompute_granularity = "selective"
        config.recompute_modules = modules + (["moe"] if "moe" not in modules else [])


def _validate(config: ModelConfig) -> None:
    """Contradictions upstream rejects at construction, reported at the offending key."""

    def fail(key: str, message: str) -> None:
        raise InputError(message, file=config.file, line=config.line_of(key), key=key)

    if config.fp8 and config.fp4:
        fail("fp4", "fp8 and fp4 cannot both be set (TransformerConfig rejects it)")
    if config.fp8 and config.fp8_recipe == "custom":
        fail("fp8_recipe", "a global 'custom' recipe needs a quantizer factory (Python code), "
             "which qaudit does not import; use a recipe file instead")
    if config.fp4 and config.fp4_recipe == "custom":
        fail("fp4_recipe", "a global 'custom' recipe needs a quantizer factory (Python code), "
             "which qaudit does not import; use a recipe file instead")
    if config.num_attention_heads % config.num_query_groups:
        fail("num_query_groups", f"num_attention_heads ({config.num_attention_heads}) must be a "
             f"multiple of num_query_groups ({config.num_query_groups})")
    if config.fp8_output_proj:
        if not (config.fp8 and config.fp8_recipe == "mxfp8"):
            fail("fp8_output_proj", "needs fp8 with fp8_recipe: mxfp8 (TransformerConfig rejects it)")
        # One stage holds both: the TE head cannot take the embedding's weight. With
        # pipelining the last stage has its own copy of it. (HybridModel and T5Model never
        # build it.)
        if config.share_embeddings_and_output_weights and config.pipeline_model_parallel_size == 1 \
                and config.family == families.BASE:
            fail("fp8_output_proj", "a TE output layer cannot use the embedding's weight: set "
                 "share_embeddings_and_output_weights: false")
    if config.fp8 and config.first_last_layers_bf16:
        if config.fp8_recipe == "delayed":
            fail("first_last_layers_bf16", "not supported with fp8_recipe: delayed "
                 "(one autocast covers the whole block); upstream rejects it")
        per_stage = config.num_layers // config.pipeline_model_parallel_size
        for key in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if getattr(config, key) > per_stage:
                fail(key, f"must be at most num_layers // pipeline_model_parallel_size ({per_stage})")
    if isinstance(config.moe_layer_freq, list) and len(config.moe_layer_freq) != config.num_layers \
            and not config.is_hybrid:  # the pattern places MoE layers instead
        fail("moe_layer_freq", f"a list needs one entry per layer: {len(config.moe_layer_freq)} "
             f"given, num_layers is {config.num_layers}")
    if config.is_moe and config.moe_router_topk > config.num_moe_experts:
        fail("moe_router_topk", f"cannot exceed num_moe_experts ({config.num_moe_experts})")
    if config.mla_down_proj_fusion:
        if not config.multi_latent_attention:
            fail("mla_down_proj_fusion", "needs multi_latent_attention: true (Megatron asserts "
                 "'--mla-down-proj-fusion requires --multi-latent-attention')")
        if config.q_lora_rank is None:
            fail("mla_down_proj_fusion", "needs q_lora_rank (Megatron's FusedMLASelfAttention "
                 "asserts it: the fused projection holds the query's down projection)")
    if config.mtp_use_repeated_layer and not config.mtp_depths:
        fail("mtp_use_repeated_layer", "needs mtp_num_layers >= 1")
    if config.recompute_granularity == "full" and config.recompute_method is None:
        fail("recompute_granularity", "full recompute needs recompute_method: uniform or block")
    if config.recompute_granularity == "full" and not config.recompute_num_layers:
        fail("recompute_granularity", "full recompute needs recompute_num_layers (layers per "
             "checkpointed chunk for uniform, checkpointed layers for block)")
    if config.quant_recipe is not None and config.use_kitchen:
        fail("quant_recipe", "cannot be combined with use_kitchen (Megatron rejects a kitchen "
             "recipe together with --te-precision-config-file)")
    _validate_te_settings(config, fail)
    _apply_layout(config, fail)
    _check_modelopt_spec(config, fail)
    for family in families.parts("fields"):
        family.validate(config, fail)
    _check_virtual_needs_stages(config, fail)
    if config.source is not None:
        check_upstream(config, config.source.mapping, fail)
    _check_build_size(config, fail)


def _validate_te_settings(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    """What TransformerConfig.__post_init__ rejects about the TE settings qaudit models."""
    if config.fp8_param and not config.fp8:
        fail("fp8_param", "fp8_param must be used together with fp8 (TransformerConfig rejects it)")
    if config.fp4_param and not config.fp4:
        fail("fp4_param", "fp4_param must be used together with fp4 (TransformerConfig rejects it)")
    for key in ("enable_cuda_graph", "external_cuda_graph"):
        if getattr(config, key) and config.cuda_graph_impl != "none":
            fail(key, "cannot be combined with cuda_graph_impl (TransformerConfig rejects it; "
                 "the switch is the deprecated spelling of cuda_graph_impl)")
    if config.enable_cuda_graph and config.external_cuda_graph:
        fail("external_cuda_graph", "enable_cuda_graph and external_cuda_graph cannot both be set")
    if config.cuda_graph_scope is not None and config.cuda_graph_modules not in (None, "full", []):
        fail("cuda_graph_scope", "cuda_graph_scope and cuda_graph_modules cannot be set together "
             "(cuda_graph_scope is the deprecated name)")


def _apply_layout(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    """TransformerConfig's checks of an explicit layout; it sets the virtual pipeline size."""
    from qaudit.load.pp_layout import LayoutError, read_layout

    key = "pipeline_model_parallel_layout"
    if config.pipeline_model_parallel_layout is None:
        return
    for other in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        if getattr(config, other) is not None:
            fail(other, f"cannot be set with {key} (TransformerConfig raises ValueError)")
    for other in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if getattr(config, other):
            fail(other, f"cannot be set with {key} (TransformerConfig raises ValueError)")
    if config.family != families.BASE:
        fail(key, "is not modelled for hybrid or T5 models (Megatron's argument checks reject "
             "it with a hybrid pattern; layouts do not hold encoder layers)")
    try:
        layout = read_layout(config.pipeline_model_parallel_layout,
                             config.pipeline_model_parallel_size, config.num_layers,
                             config.mtp_depths)
    except LayoutError as exc:
        fail(key, str(exc))
    vpp = config.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp != layout.virtual:
        fail("virtual_pipeline_model_parallel_size", f"contradicts {key}: its {len(layout.chunks)} "
             f"model chunks over {layout.stages} stages make {layout.virtual} per stage "
             "(TransformerConfig asserts they match)")
    config.virtual_pipeline_model_parallel_size = layout.virtual if layout.virtual > 1 else None


def _check_virtual_needs_stages(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    """Virtual chunks need more than one stage (parallel_state.initialize_model_parallel and
    validate_args; qaudit's row names would also collide)."""
    vpp = config.virtual_pipeline_model_parallel_size or 1
    if vpp == 1 or config.pipeline_model_parallel_size > 1:
        return
    key = ("pipeline_model_parallel_layout" if config.pipeline_model_parallel_layout is not None
           else hybrid.pattern_key(config) if config.is_hybrid
           else "virtual_pipeline_model_parallel_size")
    fail(key, f"makes {vpp} model chunks on one pipeline stage: Megatron raises "
         "'pipeline-model-parallel size should be greater than 1 with interleaved schedule'")


def _check_modelopt_spec(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    """What Megatron raises when it builds the modelopt spec (docs/upstream-model.md)."""
    if config.layer_spec != "modelopt":
        return
    if config.is_t5:
        fail("layer_spec", "the modelopt spec builds GPT and hybrid models only (ModelOpt's "
             "builder raises for other model types)")
    if config.virtual_pipeline_model_parallel_size not in (None, 1):
        fail("virtual_pipeline_model_parallel_size", "ModelOpt's builder raises 'ModelOpt "
             "integration does not currently support virtual pipeline parallel'")
    if config.multi_latent_attention and not config.is_hybrid:
        # The spec sets q_layernorm/kv_layernorm modules on MLA; mla_qk_norm_config.py
        # rejects them unless qk_layernorm is on and a q_lora_rank consumes the q norm.
        if not config.qk_layernorm:
            fail("multi_latent_attention", "the modelopt spec gives MLA explicit q/kv norms, "
                 "which Megatron rejects without qk_layernorm (ValueError: 'qk_layernorm/"
                 "qk_l2_norm are supposed to be disabled')")
        if config.q_lora_rank is None:
            fail("multi_latent_attention", "the modelopt spec gives MLA an explicit q norm, "
                 "which Megatron rejects without q_lora_rank (ValueError: the q norm 'will not "
                 "be used')")


# What one audit may build: every layer and every expert is a real module (only widths
# shrink), so these bound its time and memory. The biggest real models fit with room to spare:
# Llama-3.1-405B has 126 layers, Qwen3-235B 94 x 128 experts, DeepSeek-V3 61 layers with 256
# experts in 58 MoE layers + MTP (~15,000 experts built), Kimi-K2 ~23,000.
MAX_BUILT_LAYERS = 1024     # decoder (+ T5 encoder) layers + MTP depths, each run every microbatch
MAX_BUILT_EXPERTS = 32_768  # routed experts summed over every MoE layer built (decoder + MTP)


def _check_build_size(config: ModelConfig, fail: Callable[[str, str], None]) -> None:
    built_depths = 1 if config.mtp_use_repeated_layer else config.mtp_depths
    mtp_layers = config.mtp_moe_layers() if config.mtp_depths else []
    encoder = config.encoder_num_layers or 0
    layers = config.num_layers + encoder + config.mtp_depths * len(mtp_layers)
    if layers > MAX_BUILT_LAYERS:
        key = "mtp_num_layers" if config.mtp_depths > config.num_layers else "num_layers"
        if encoder > config.num_layers and config.line_of("encoder_num_layers") is not None:
            key = "encoder_num_layers"
        t5_part = f" + encoder_num_layers {encoder}" if encoder else ""
        if config.is_hybrid and config.line_of(key) is None:
            key = hybrid.pattern_key(config)  # the pattern gave the count
        per_depth = f" x {len(mtp_layers)} layers" if config.is_hybrid and mtp_layers else ""
        fail(key, f"the audit would build and run {layers} transformer layers (num_layers "
             f"{config.num_layers}{t5_part} + mtp_num_layers {config.mtp_depths}{per_depth}); the limit "
             f"is {MAX_BUILT_LAYERS}. Audit a copy with fewer layers: verdicts repeat per layer, "
             "so keep the first/last BF16 layers, the MoE pattern and the MTP setting")
    if config.is_moe:
        moe_layers = sum(config.moe_layer_pattern()) + built_depths * sum(mtp_layers)
        experts = config.num_moe_experts * moe_layers
        if experts > MAX_BUILT_EXPERTS:
            fail("num_moe_experts", f"the audit would build {experts} routed experts "
                 f"({config.num_moe_experts} in each of {moe_layers} MoE layers); the limit is "
                 f"{MAX_BUILT_EXPERTS}. Audit a copy with fewer experts or layers: verdicts "
                 "repeat per expert, so a few experts (at least moe_router_topk) show the same")
