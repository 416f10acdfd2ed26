"""A Megatron-Bridge ConfigContainer YAML (or Megatron-LM's PretrainConfigContainer) as the
flat TransformerConfig mapping the other readers produce, every field with its file and line.

What Bridge does between the file and the model, done here on data (nothing imported):
overrides merged (qaudit/load/bridge/overrides.py), `mixed_precision` applied as
`runtime_config_update()` applies it (mixed_precision.py), `comm_overlap` and the DDP / dist
settings (sections.py), the hybrid provider's MTP pattern composed as its `finalize()` does,
a serialized `quant_recipe` read as Megatron's recipe matching reads it (quant_recipe.py), and
`gradient_accumulation_fusion` resolved as the GPU job resolves it (`resolve_fusion`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from qaudit.errors import InputError
from qaudit.families.hybrid.pattern import composed_length
from qaudit.load.bridge import mixed_precision as mp
from qaudit.load.bridge import sections
from qaudit.load.bridge.nodes import is_reference, plain, short_name, target_of
from qaudit.load import config as config_module
from qaudit.load.config import MODELLED_FIELDS
from qaudit.load.unmodelled import no_effect_reason
from qaudit.load.bridge.provider import Provider, classify
from qaudit.load.bridge.startup import refuse_at_startup
from qaudit.load.yamlio import YamlMap, short_repr, type_name

Where = tuple[str, "int | None"]

CONTAINERS = ("ConfigContainer", "PretrainConfigContainer")

# Provider fields Bridge declares and Megatron never reads: named, since users believe they act.
BRIDGE_ONLY_FIELDS = {
    "keep_mtp_spec_in_bf16": (
        "a Bridge-only provider field that no code reads (Bridge v0.6.0 sets it in the "
        "Nemotron recipes; Megatron-LM d98e8a64 has no such field): the MTP layers run in the "
        "model's precision, as audited", lambda v: v is True),
}
# Provider fields that never change which TE modules run, how often or in which precision:
# Bridge's bookkeeping, subclass fields (HybridModelProvider's mamba_chunk_size, Gemma3's
# sliding-window pattern) and megatron-core 0.19.2 fields that Megatron-LM main dropped.
BRIDGE_PROVIDER_FIELDS = frozenset({
    "hybrid_stack_spec", "mtp_loss_scaling_factor", "mtp_hybrid_override_pattern",
    "keep_mtp_spec_in_bf16", "hf_model_id", "hf_model_revision", "_pg_collection",
    "mtp_enabled", "generation_config", "mamba_chunk_size", "interleaved_attn_pattern",
    "moe_ncclep_static_shape", "is_vision_language",
})


# Provider defaults that differ from TransformerConfig's, for fields the audit reads; a dump
# writes every field, a partial file or a live object may not (hybrid_provider.py v0.6.0;
# GPTModelProvider's agree with TransformerConfig's for these).
PROVIDER_DEFAULTS = {
    "hybrid": {"add_bias_linear": False, "share_embeddings_and_output_weights": False},
}


@dataclass
class BridgeFile:
    """What the reader found besides the model fields: for the report header and the audit."""

    container: str
    provider: Provider
    version: str | None = None
    # Fields whose value the file cannot pin down: field -> the values to audit.
    alternatives: dict[str, list[Any]] = field(default_factory=dict)
    explanations: list[str] = field(default_factory=list)


@dataclass
class Flat:
    """The flat model mapping (lines in their own files) and where each field came from."""

    mapping: YamlMap
    origins: dict[str, Where]
    notes: list[tuple[str, Where, str]]  # (message, where, key)
    # Settings read and shown to change nothing (qaudit/load/unmodelled.py NO_EFFECT): QA091.
    no_effect: list[tuple[str, Where, str]] = field(default_factory=list)
    recipe_node: Any = None
    recipe_where: Where | None = None
    info: BridgeFile | None = None


def container_kind(document: Any) -> str | None:
    target = target_of(document)
    if target is None:
        return None
    name = short_name(target)
    return name if name in CONTAINERS or name.endswith("ConfigContainer") else None


def flatten(document: YamlMap, display: str, origins: dict[str, Where],
            explicit: set[str], recipe_table: Callable[[], mp.RecipeTable] | None = None) -> Flat:
    """`origins`: dotted key -> where an override set it; `explicit`: dotted keys set by an
    override (which win over what Bridge resolves from the build machine); `recipe_table`:
    the named recipes (qaudit's table when None)."""

    def where(dotted: str, mapping: YamlMap, key: str) -> Where:
        return origins.get(dotted, (display, mapping.line_of(key)))

    kind = container_kind(document) or "ConfigContainer"
    model_node = document.get("model")
    if model_node is None:
        raise InputError("no 'model' section: not a model config (nothing to audit)",
                         file=display, line=document.line, key="model")
    if not isinstance(model_node, YamlMap):
        raise InputError(f"expected the model provider's fields under 'model', got "
                         f"{type_name(model_node)} {short_repr(model_node)}", file=display,
                         line=document.line_of("model"), key="model")
    provider = classify(target_of(model_node))
    if provider.family == "unsupported":
        raise InputError(f"{provider.name} is {provider.why}; nothing qaudit can audit",
                         file=display, line=model_node.line_of("_target_"), key="model._target_")
    if model_node.get("is_vision_language") is True:
        raise InputError(f"{provider.name} with is_vision_language: true is a vision-language "
                         "model: its vision encoder and projector are not modelled", file=display,
                         line=model_node.line_of("is_vision_language"),
                         key="model.is_vision_language")
    model = plain(model_node)
    if not isinstance(model, YamlMap):  # only `_target_`, `_call_`, `_args_`...: no field
        file, line = where("model", document, "model")
        raise InputError(f"'model' names {short_repr(target_of(model_node))} with no fields (only "
                         f"{', '.join(sorted(map(str, model_node)))}): the provider's sizes are "
                         "what qaudit audits, and a dump writes every field", file=file,
                         line=line, key="model")
    transformer = model.pop("transformer", None)
    if isinstance(transformer, YamlMap):  # GPTModelConfig / HybridModelConfig nest the fields
        for key, value in transformer.items():
            model[key] = value
            model.key_lines[key] = transformer.line_of(key)
            if f"model.transformer.{key}" in origins:
                origins[f"model.{key}"] = origins[f"model.transformer.{key}"]
            if f"model.transformer.{key}" in explicit:
                explicit.add(f"model.{key}")
    flat = Flat(YamlMap(line=model.line), {}, [],
                info=BridgeFile(kind, provider))

    def put(key: str, value: Any, at: Where) -> None:
        flat.mapping[key] = value
        flat.mapping.key_lines[key] = at[1]
        if at[0] != display:
            flat.origins[key] = at
        else:
            flat.origins.pop(key, None)

    for key, value in model.items():
        at = where(f"model.{key}", model, key)
        if key in BRIDGE_ONLY_FIELDS:
            why, on = BRIDGE_ONLY_FIELDS[key]
            if on(value):
                flat.notes.append((f"model.{key} {short_repr(value)}: {why}", at, key))
            continue
        if key == "quant_recipe":
            flat.recipe_node = model_node.get("quant_recipe")
            flat.recipe_where = at
            if flat.recipe_node is not None:
                put(key, "model.quant_recipe", at)
            continue
        if key in BRIDGE_PROVIDER_FIELDS:
            continue
        if at[0] != display and key not in MODELLED_FIELDS | config_module.ACCEPTED_FIELDS:
            # An override adding a field the provider lacks (`+model.new_field=1`): Bridge's
            # _apply_overrides logs "not found in config object ... Skipping." and runs on.
            flat.notes.append((f"model.{key}: not a field of {provider.name or 'the model'}; "
                               "Bridge skips it with a warning (_apply_overrides), and so does "
                               "the audit", at, f"model.{key}"))
            continue
        raw = model_node.get(key) if isinstance(model_node, YamlMap) else None
        if key in config_module.ACCEPTED_FIELDS and (is_reference(raw) or (
                isinstance(raw, list) and raw and all(is_reference(item) for item in raw))):
            continue  # a dtype, function or enum the audit does not read: not handed on
        put(key, value, at)
    if model.get("restore_modelopt_state") is True:
        at = where("model.restore_modelopt_state", model, "restore_modelopt_state")
        if provider.family == "hybrid":  # hybrid_provider: the ModelOpt hybrid stack spec
            put("layer_spec", "modelopt", at)
        else:
            flat.notes.append(("model.restore_modelopt_state true: the ModelOpt restore path "
                               "may swap the layer spec; audited with the TE spec", at,
                               "restore_modelopt_state"))
    if model.get("use_transformer_engine_full_layer_spec") is True:
        at = where("model.use_transformer_engine_full_layer_spec", model,
                   "use_transformer_engine_full_layer_spec")
        flat.notes.append(("model.use_transformer_engine_full_layer_spec true: TE's whole "
                           "TransformerLayer replaces Megatron's layer (other module names and "
                           "fusions); not modelled", at, "use_transformer_engine_full_layer_spec"))
    for key, value in PROVIDER_DEFAULTS.get(provider.family, {}).items():
        if key not in flat.mapping:
            put(key, value, (display, model.line_of("_target_")))
    _compose_mtp_pattern(model, flat, put, where)
    precision = _apply_mixed_precision(document, display, flat, put, where, explicit, model,
                                       recipe_table or (lambda: mp.QAUDIT_TABLE))
    _apply_parallel_sections(document, flat, put, where)
    refuse_at_startup(document, flat.mapping, where, precision)
    _sequence_parallel_needs_tp(flat, put, where, model)
    _resolve_fusion(flat, model, explicit, display, where)
    return flat


def _count(value) -> int | None:
    """A dump's integer setting, or None when unset or of another type: the reader computes
    with a few values before the field checks run, and a wrong type must reach those checks
    (exit 2 with the key's line), not a comparison."""
    if value is None:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _compose_mtp_pattern(model: YamlMap, flat: Flat, put, where) -> None:
    """HybridModelProvider.finalize(): main pattern + '/' + the MTP pattern once per depth
    (at least once with mtp_use_repeated_layer: the shared layer always exists)."""
    mtp_pattern = model.get("mtp_hybrid_override_pattern")
    pattern = model.get("hybrid_layer_pattern")
    if pattern is None and model.get("hybrid_override_pattern") is not None:
        return  # the deprecated key with a Bridge MTP pattern: left to the hybrid checks
    if not isinstance(pattern, str) or not isinstance(mtp_pattern, str) or not mtp_pattern:
        return
    depths = _count(model.get("mtp_num_layers"))
    if depths is None or depths > config_module.MAX_BUILT_LAYERS:
        # Not a count, or more depths than qaudit builds: the field and size checks name it
        # with its line. (Composing first would write one pattern copy per depth: 2**31 of
        # them exhausted the memory.)
        return
    copies = max(1, depths) if model.get("mtp_use_repeated_layer") is True else depths
    main = pattern.split("/")[0]
    # Sized before it is built: each symbol is a layer (or a pipeline split), and more than
    # twice the layers qaudit builds is refused whatever the rest says (a 900 KB MTP pattern
    # times its depths peaked at 1.85 GB before).
    size = composed_length(main, mtp_pattern, copies)
    if size > 2 * config_module.MAX_BUILT_LAYERS:
        file, line = where("model.mtp_hybrid_override_pattern", model,
                           "mtp_hybrid_override_pattern")
        raise InputError(f"the hybrid pattern composed with the MTP pattern once per depth "
                         f"({copies} x {len(mtp_pattern)} characters) would be {size} "
                         f"characters: more layers than the {config_module.MAX_BUILT_LAYERS} "
                         "qaudit builds", file=file, line=line, key="mtp_hybrid_override_pattern")
    composed = main + "".join("/" + mtp_pattern for _ in range(copies))
    put("hybrid_layer_pattern", composed, where("model.mtp_hybrid_override_pattern", model,
                                                "mtp_hybrid_override_pattern"))
    if copies and model.get("mtp_num_layers") is None:
        put("mtp_num_layers", copies, where("model.mtp_hybrid_override_pattern", model,
                                            "mtp_hybrid_override_pattern"))


def _apply_mixed_precision(document: YamlMap, display: str, flat: Flat, put, where,
                           explicit: set[str], model: YamlMap,
                           recipe_table: Callable[[], mp.RecipeTable]
                           ) -> tuple[dict[str, Any], dict[str, Where]] | None:
    """The section's values as Bridge finalizes them, and where each was set, for the
    start-up checks (None without a section)."""
    node = document.get("mixed_precision")
    if node is None:
        return None
    at_section = where("mixed_precision", document, "mixed_precision")
    key_of: dict[str, Where] = {}
    if isinstance(node, str):
        table = recipe_table()
        values = mp.recipe_by_name(node, table)
        if values is None:
            names = ", ".join(sorted(table.recipes))
            raise InputError(f"unknown mixed-precision recipe {short_repr(node)} (Bridge's "
                             f"get_mixed_precision_config raises ValueError); "
                             f"{table.describe()} has {names}", file=at_section[0],
                             line=at_section[1], key="mixed_precision")
        flat.info.explanations.append(f"mixed_precision: {node} (Bridge's named recipe, as "
                                      f"defined by {table.describe()})")
    elif isinstance(node, YamlMap):
        section = _mixed_precision_fields(node, at_section)
        values = dict(mp.DEFAULTS)
        for key, value in section.items():
            values[key] = value
            key_of[key] = where(f"mixed_precision.{key}", section, key)
        # The dataclass keeps each *_param / *_param_gather pair equal (__setattr__), and
        # Bridge's _apply_overrides writes the merged section back field by field in the
        # dataclass's order, where the gather flag comes after: it wins, whichever of the two
        # an override changed (`mixed_precision.fp8_param=true` alone ends false in 0.6.2).
        for param, gather in (("fp8_param", "fp8_param_gather"), ("fp4_param", "fp4_param_gather")):
            if param in key_of and gather in key_of and values[param] != values[gather] \
                    and values[param] is not None:
                values[param] = values[gather]
                if f"mixed_precision.{param}" in explicit \
                        and f"mixed_precision.{gather}" not in explicit:
                    flat.notes.append((f"mixed_precision.{param} {values[gather]!r}: Bridge "
                                       f"keeps {param} and {gather} equal and writes {gather} "
                                       f"last, so the override of {param} is undone; set "
                                       f"mixed_precision.{gather} instead", key_of[param],
                                       f"mixed_precision.{param}"))
        values = mp.finalized(values)
    else:
        raise InputError(f"expected a MixedPrecisionConfig mapping or a recipe name, got "
                         f"{type_name(node)} {short_repr(node)}", file=at_section[0],
                         line=at_section[1], key="mixed_precision")
    for name, value in mp.model_updates(values):
        at = key_of.get(name, at_section)
        if name in ("fp8_param", "fp4_param") and name not in key_of:
            at = key_of.get(name + "_gather", at_section)
        if f"model.{name}" in explicit and model.get(name) != value:
            file, line = where(f"model.{name}", model, name)
            flat.info.explanations.append(
                f"model.{name} {model.get(name)!r} ({file}{':' + str(line) if line else ''}) "
                f"is replaced by mixed_precision's {value!r}: Bridge's runtime_config_update "
                "copies the section onto the model; override mixed_precision instead")
        put(name, value, at)
    return values, {name: key_of.get(name, at_section) for name in values}


def _mixed_precision_fields(node: YamlMap, at: Where) -> YamlMap:
    """The section's settings. A bare `{_target_: ...MixedPrecisionConfig}` is the dataclass
    with its defaults; any other node without fields (a function, an enum member, another
    class) is no MixedPrecisionConfig."""
    section = plain(node)
    if isinstance(section, YamlMap):
        return section
    target = target_of(node) or ""
    if short_name(target) == "MixedPrecisionConfig" and set(node) <= {"_target_", "_call_"} \
            and node.get("_call_", True) is True:
        return YamlMap(line=node.line)
    raise InputError(f"expected a MixedPrecisionConfig mapping or a recipe name, got a node "
                     f"naming {short_repr(target)} with no fields (only "
                     f"{', '.join(sorted(map(str, node)))})", file=at[0], line=at[1],
                     key="mixed_precision")


def _apply_parallel_sections(document: YamlMap, flat: Flat, put, where) -> None:
    ddp = sections.section(document, "ddp")
    dist = sections.section(document, "dist")
    overlap = sections.section(document, "comm_overlap")
    mapping = flat.mapping
    fsdp_at = None
    for name, node in (("dist", dist), ("ddp", ddp)):
        for key in ("use_megatron_fsdp", "use_custom_fsdp"):  # the latter: its old name
            if node is not None and node.get(key) is True:
                fsdp_at = where(f"{name}.{key}", node, key)
    if fsdp_at is not None:
        # ConfigContainer.validate(): either switch turns on both.
        put("use_megatron_fsdp", True, fsdp_at)
        if ddp is not None and "data_parallel_sharding_strategy" in ddp:
            put("data_parallel_sharding_strategy", ddp["data_parallel_sharding_strategy"],
                where("ddp.data_parallel_sharding_strategy", ddp,
                      "data_parallel_sharding_strategy"))
    elif "use_megatron_fsdp" in mapping:
        put("use_megatron_fsdp", False, (where("model.use_megatron_fsdp", mapping,
                                               "use_megatron_fsdp")))
    ddp_values = dict(ddp or {})
    ddp_where = {key: where(f"ddp.{key}", ddp, key) for key in ddp_values} if ddp else {}
    if overlap is not None:
        # CommOverlapConfig.setup (training/comm_overlap.py:532-535 in 0.6.2) asserts it,
        # reading the model's value before the section is copied onto it.
        if overlap.get("delay_wgrad_compute") is True \
                and overlap.get("overlap_moe_expert_parallel_comm") is not True \
                and mapping.get("overlap_moe_expert_parallel_comm") is not True:
            at = where("comm_overlap.delay_wgrad_compute", overlap, "delay_wgrad_compute")
            raise InputError("overlap_moe_expert_parallel_comm is required for "
                             "delay_wgrad_compute (Bridge's CommOverlapConfig.setup asserts it "
                             "at start-up): set comm_overlap.overlap_moe_expert_parallel_comm"
                             "=true, or leave delay_wgrad_compute off", file=at[0], line=at[1],
                             key="comm_overlap.delay_wgrad_compute")
        for key in sections.COMM_OVERLAP_MODEL_FIELDS:
            value = overlap.get(key)
            at = where(f"comm_overlap.{key}", overlap, key)
            if value is not None and not isinstance(value, bool):
                raise InputError(f"expected true, false or null, got {type_name(value)} "
                                 f"{short_repr(value)}", file=at[0], line=at[1],
                                 key=f"comm_overlap.{key}")
            put(key, value is True, at)
        tp = _count(mapping.get("tensor_model_parallel_size")) or 1
        wanted = overlap.get("tp_comm_overlap") is True
        put("tp_comm_overlap", wanted and tp >= 2 and bool(mapping.get("sequence_parallel")),
            where("comm_overlap.tp_comm_overlap", overlap, "tp_comm_overlap"))
        if ddp is not None and ddp.get("use_distributed_optimizer"):
            for key in sections.COMM_OVERLAP_DDP_FIELDS:
                if overlap.get(key) is not None:
                    ddp_values[key] = overlap[key]
                    ddp_where[key] = where(f"comm_overlap.{key}", overlap, key)
    for key, why in sections.NAMED_DDP.items():
        if key in ddp_values and sections.is_on(ddp_values[key]):
            flat.notes.append((f"ddp.{key} {short_repr(ddp_values[key])}: {why}",
                               ddp_where[key], f"ddp.{key}"))
    optimizer = sections.section(document, "optimizer")
    # The same settings, the same "read, no effect" note as the launch-script and YAML routes.
    read = [(f"ddp.{key}", value, ddp_where[key]) for key, value in ddp_values.items()]
    read += [(f"optimizer.{key}", value, where(f"optimizer.{key}", optimizer, key))
             for key, value in (optimizer or {}).items() if isinstance(key, str)]
    for name, value, at in read:
        quiet = no_effect_reason(name.split(".", 1)[1], value)
        if quiet is not None:
            flat.no_effect.append((f"{name} {short_repr(value)}: {quiet}", at, name))
    for name, why in sections.NAMED_SECTIONS.items():
        if document.get(name) is not None:
            flat.notes.append((f"{name} is set: {why}", where(name, document, name), name))
    for key, why in sections.NAMED_DIST.items():
        if dist is not None and sections.is_on(dist.get(key)):
            flat.notes.append((f"dist.{key} {short_repr(dist[key])}: {why}",
                               where(f"dist.{key}", dist, key), f"dist.{key}"))


def _sequence_parallel_needs_tp(flat: Flat, put, where, model: YamlMap) -> None:
    """The provider's finalize() (Bridge 0.6.2 models/transformer_config.py, called from
    ConfigContainer.validate) turns sequence parallelism off at tensor-parallel size 1, where
    Megatron's own config check would refuse it. Nothing the audit judges reads it at TP 1
    (it only splits the token dimension across TP ranks), so no verdict changes."""
    tp = _count(flat.mapping.get("tensor_model_parallel_size"))
    if flat.mapping.get("sequence_parallel") is not True or tp is None or tp > 1:
        return
    file, line = where("model.tensor_model_parallel_size", model, "tensor_model_parallel_size")
    put("sequence_parallel", False, (file, line))
    flat.info.explanations.append(
        f"model.sequence_parallel: true with tensor_model_parallel_size {tp or 1} "
        f"({file}{':' + str(line) if line else ''}): Bridge's provider finalize() turns it off, "
        "and so does the audit (no verdict depends on it at TP 1)")


def _resolve_fusion(flat: Flat, model: YamlMap, explicit: set[str], display: str,
                    where) -> None:
    """gradient_accumulation_fusion's provider default is a probe of the machine that built
    the config (`fusions.can_enable_gradient_accumulation_fusion`: true where TE imports). A
    value an override sets is the user's; `true` in the file is what a TE machine gives; a
    missing one is what the GPU job's provider resolves (true); `false` may be the recipe's
    choice or a probe on a machine without TE, so both values are audited."""
    key = "gradient_accumulation_fusion"
    info = flat.info
    if f"model.{key}" in explicit:
        return
    value = model.get(key)
    at = where(f"model.{key}", model, key)
    if value is None:
        flat.mapping[key] = True
        info.explanations.append(f"{key}: not in the file; audited as true, what the provider's "
                                 "default resolves to on a GPU machine with Transformer Engine")
    elif value is False and flat.mapping.get("defer_embedding_wgrad_compute") is True:
        # The recipe's own false could not start (ModelParallelConfig refuses deferral
        # without the fusion): only the probe's false, which the GPU job turns true, runs.
        flat.mapping[key] = True
        flat.mapping.key_lines[key] = at[1]
        info.explanations.append(
            f"{key}: false in the file, with defer_embedding_wgrad_compute on: as the recipe's "
            "choice it could not start (megatron-core: \"Cannot defer embedding wgrad compute "
            "when gradient accumulation fusion is not used\"), so it is the build machine's "
            "probe, which the GPU job resolves to true: audited as true")
    elif value is False:
        info.alternatives[key] = [True, False]
        flat.mapping[key] = True
        flat.mapping.key_lines[key] = at[1]
        info.explanations.append(
            f"{key}: false in the file may be the build machine's probe (Bridge's default "
            "is true only where Transformer Engine imports) or the recipe's choice, so both "
            "values are audited")
