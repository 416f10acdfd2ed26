"""Cross-field assertions Megatron makes when it builds a model, refused here with its reason.

`TransformerConfig.__post_init__` (megatron/core/transformer/transformer_config.py),
`validate_args` (megatron/training/arguments.py) and the MoE modules reject some combinations
of fields that the audit would otherwise build and bless. The ones that decide which modules
exist or their shapes are checked here on every input route (TransformerConfig YAML,
MODEL_ARGS, launch script), with upstream's reason; docs/upstream-checks.md lists them, the
upstream lines they come from (main at d98e8a64 and megatron-core 0.19.2, identical), and the
assertions judged irrelevant to the audit.

Some fields are read only here (`CHECKED_FIELDS`): `add_bias_linear`, the router's options,
the parallel sizes. In YAML they are ordinary TransformerConfig keys; from a command line,
`qaudit.load.sources.checked_flags` fills them in (or marks them `UNKNOWN` when the value comes from
outside the file, and then the checks that need them are skipped).
"""

from __future__ import annotations

from typing import Any, Callable

from qaudit.load.yamlio import YamlMap, short_repr, type_name


class _Unknown:
    """A checked field whose value the file takes from outside (an unset variable)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()

# Field -> (kind, TransformerConfig's default). Kinds: "bool", "int" (>= 1), "str", "strs"
# (a string or a list of strings).
CHECKED_FIELDS: dict[str, tuple[str, Any]] = {
    "add_bias_linear": ("bool", True),
    "moe_router_pre_softmax": ("bool", False),
    "moe_router_score_function": ("str", "softmax"),
    "moe_router_load_balancing_type": ("strs", "aux_loss"),
    "moe_router_num_groups": ("int", None),
    "moe_router_group_topk": ("int", None),
    "tensor_model_parallel_size": ("int", 1),
    "expert_model_parallel_size": ("int", 1),
    # Read for the GEMM shapes at real widths (qaudit/plan/shapes.py), not by a check here.
    "expert_tensor_parallel_size": ("int", None),
    "context_parallel_size": ("int", 1),
    "sequence_parallel": ("bool", False),
    "make_vocab_size_divisible_by": ("int", 128),
    "seq_length": ("int", None),
    "moe_router_padding_for_fp8": ("bool", False),
    "moe_router_padding_for_quantization": ("bool", False),
    "fp16": ("bool", False),
    "bf16": ("bool", False),
    # Read only by the start-up refusals below (issue 48); Bridge's comm_overlap sets both.
    "overlap_moe_expert_parallel_comm": ("bool", False),
    "defer_embedding_wgrad_compute": ("bool", False),
}

Fail = Callable[[str, str], None]


def _value(mapping: YamlMap, key: str, fail: Fail) -> Any:
    """The field's value (its default when absent, UNKNOWN when not knowable), type-checked."""
    kind, default = CHECKED_FIELDS[key]
    if key not in mapping or mapping[key] is None and default is None:
        return default
    value = mapping[key]
    if value is UNKNOWN:
        return UNKNOWN
    ok = {"bool": lambda v: isinstance(v, bool),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1_000_000,
          "str": lambda v: isinstance(v, str),
          "strs": lambda v: isinstance(v, str) or isinstance(v, list)
          and all(isinstance(x, str) for x in v)}[kind](value)
    if not ok:
        expected = {"bool": "true or false", "int": "an integer from 1 to 1,000,000",
                    "str": "a string", "strs": "a string or a list of strings"}[kind]
        fail(key, f"expected {expected}, got {type_name(value)} {short_repr(value)}")
    return value


def checked_value(mapping: YamlMap | None, key: str) -> Any:
    """A checked field's value as `check_upstream` read it (its default when absent or when
    there is no mapping; UNKNOWN when the file takes it from outside)."""
    if mapping is None:
        return CHECKED_FIELDS[key][1]

    def refuse(field: str, message: str) -> None:  # check_upstream refused it already
        raise ValueError(f"{field}: {message}")

    return _value(mapping, key, refuse)


def check_upstream(config, mapping: YamlMap, fail: Fail) -> None:
    """Refuse (through `fail(key, message)`, exit 2) what upstream refuses; `config` is the
    ModelConfig with derived defaults filled in, `mapping` the fields as written."""
    values = {key: _value(mapping, key, fail) for key in CHECKED_FIELDS}

    def known(*keys: str) -> bool:
        return all(values[key] is not UNKNOWN for key in keys)

    # TransformerConfig.__post_init__ raises ValueError (transformer_config.py:1314 in 0.19.2).
    if known("fp16", "bf16") and values["fp16"] is True and values["bf16"] is True:
        fail("fp16", "Only one of fp16 and bf16 should be True (TransformerConfig raises "
             "ValueError: \"Only one of self.fp16: True and self.bf16 True should be True.\")")
    heads = config.num_attention_heads
    # validate_args: the default head width must divide the hidden size. `kv_channels: null`
    # is not set, as on the command line (args.kv_channels is None either way).
    if mapping.get("kv_channels") is None and config.hidden_size % heads:
        fail("hidden_size", f"hidden_size ({config.hidden_size}) must be divisible by "
             f"num_attention_heads ({heads}) when kv_channels is not set (Megatron's "
             "validate_args asserts it: the head width is hidden_size // num_attention_heads); "
             "set kv_channels, or a hidden_size that divides")
    tp = values["tensor_model_parallel_size"]
    if known("tensor_model_parallel_size"):
        if heads % tp:
            fail("tensor_model_parallel_size", f"num_attention_heads ({heads}) must be a multiple "
                 f"of tensor_model_parallel_size ({tp}) (TransformerConfig rejects it)")
        groups = config.num_query_groups
        if groups % tp and tp % groups:
            fail("tensor_model_parallel_size", f"num_query_groups ({groups}) must be a multiple or "
                 f"divisor of tensor_model_parallel_size ({tp}) (TransformerConfig rejects it)")
    _check_moe(config, mapping, values, known, fail)
    _check_recompute(config, mapping, fail)
    _check_startup(config, mapping, values, known, fail)


# What megatron-core 0.19.2 refuses at start-up about settings the audit otherwise only notes
# (issue 48): upstream's words, and where (docs/upstream-checks.md, "Start-up refusals").
MTP_WITH_EP_OVERLAP = ("MTP supports at most one layer when enabling "
                       "overlap_moe_expert_parallel_comm.")
DELAYED_RECOMPUTE = "Delayed scaling does not support moe_act and layernorm recompute for fp8."
DEFER_WITHOUT_PP = "Cannot defer embedding wgrad compute when pipeline model parallel is not used"
DEFER_WITHOUT_FUSION = ("Cannot defer embedding wgrad compute when gradient accumulation fusion "
                        "is not used")


def _check_startup(config, mapping: YamlMap, values: dict, known: Callable[..., bool],
                   fail: Fail) -> None:
    def refuse(key: str, words: str, where: str) -> None:
        fail(key, f"upstream refuses this at start-up: \"{words}\" ({where}, megatron-core "
             "0.19.2)")

    # transformer_config.py:2709-2713, in __post_init__'s overlap_moe_expert_parallel_comm
    # block (Bridge's CommOverlapConfig.setup asserts the same first, comm_overlap.py).
    if known("overlap_moe_expert_parallel_comm") and values["overlap_moe_expert_parallel_comm"] \
            and config.mtp_depths > 1:
        key = "overlap_moe_expert_parallel_comm" if "overlap_moe_expert_parallel_comm" \
            in mapping else "mtp_num_layers"
        refuse(key, MTP_WITH_EP_OVERLAP, "TransformerConfig.__post_init__, "
               "transformer_config.py:2709")
    # transformer_config.py:1821-1826: selective recompute of moe_act/layernorm under fp8.
    if config.fp8 and config.fp8_recipe == "delayed" \
            and config.recompute_granularity == "selective" \
            and {"moe_act", "layernorm"} & set(config.recompute_modules or []):
        refuse("recompute_modules", DELAYED_RECOMPUTE, "TransformerConfig.__post_init__, "
               "transformer_config.py:1823")
    # model_parallel_config.py:545-553 (ModelParallelConfig.__post_init__), in that order.
    if known("defer_embedding_wgrad_compute") and values["defer_embedding_wgrad_compute"]:
        if config.pipeline_model_parallel_size == 1:
            refuse("defer_embedding_wgrad_compute", DEFER_WITHOUT_PP,
                   "ModelParallelConfig.__post_init__, model_parallel_config.py:545")
        if not config.gradient_accumulation_fusion:
            refuse("defer_embedding_wgrad_compute", DEFER_WITHOUT_FUSION,
                   "ModelParallelConfig.__post_init__, model_parallel_config.py:550")


def _check_moe(config, mapping: YamlMap, values: dict, known: Callable[..., bool],
               fail: Fail) -> None:
    experts = config.num_moe_experts
    freq = config.moe_layer_freq
    if experts is None and "moe_ffn_hidden_size" in mapping \
            and mapping["moe_ffn_hidden_size"] is not None:
        mixed = isinstance(freq, list) and 0 in freq or isinstance(freq, int) and freq > 1
        if not mixed:
            fail("moe_ffn_hidden_size", "moe_ffn_hidden_size is set but num_moe_experts is "
                 "None (TransformerConfig rejects it): set num_moe_experts or remove "
                 "moe_ffn_hidden_size")
    ep = values["expert_model_parallel_size"]
    if known("expert_model_parallel_size") and ep > 1:
        if experts is None:
            fail("expert_model_parallel_size", "num_moe_experts must be set to use expert "
                 "parallelism (TransformerConfig rejects it)")
        elif experts % ep:
            fail("expert_model_parallel_size", f"num_moe_experts ({experts}) must be a multiple "
                 f"of expert_model_parallel_size ({ep}) (Megatron's validate_args asserts it)")
    # TransformerConfig: softmax over the one selected expert has a zero gradient.
    if config.moe_router_topk == 1 and known("moe_router_score_function",
                                            "moe_router_pre_softmax",
                                            "moe_router_load_balancing_type") \
            and values["moe_router_score_function"] == "softmax" \
            and not values["moe_router_pre_softmax"] \
            and values["moe_router_load_balancing_type"] != "sinkhorn":
        fail("moe_router_topk", "moe_router_topk 1 with the softmax score function needs "
             "moe_router_pre_softmax (TransformerConfig: \"Please use --moe-router-pre-softmax "
             "when topk is 1\"; softmax over one expert has a zero gradient)")
    group_topk, num_groups = values["moe_router_group_topk"], values["moe_router_num_groups"]
    if known("moe_router_group_topk", "moe_router_num_groups") and group_topk:
        if not num_groups:
            fail("moe_router_group_topk", "group-limited routing needs moe_router_num_groups "
                 "(TransformerConfig rejects it)")
        elif experts is not None and experts % num_groups:
            fail("moe_router_num_groups", f"num_moe_experts ({experts}) must be divisible by "
                 f"moe_router_num_groups ({num_groups}) (TransformerConfig asserts it)")
        elif group_topk > num_groups:
            fail("moe_router_group_topk", f"moe_router_group_topk ({group_topk}) must not "
                 f"exceed moe_router_num_groups ({num_groups}) (TransformerConfig asserts it)")
    # megatron/core/transformer/moe/shared_experts.py: SharedExpertMLP asserts no bias.
    builds_moe = experts is not None and any(config.moe_layer_pattern())
    if builds_moe and config.moe_shared_expert_intermediate_size is not None \
            and known("add_bias_linear") and values["add_bias_linear"]:
        fail("moe_shared_expert_intermediate_size", "bias is not supported in the shared "
             "experts (Megatron's SharedExpertMLP asserts add_bias_linear is False, and "
             "TransformerConfig defaults it to True): set add_bias_linear: false "
             "(--disable-bias-linear)")


def _check_recompute(config, mapping: YamlMap, fail: Fail) -> None:
    if config.recompute_granularity != "selective":
        return
    if config.recompute_num_layers is not None:
        fail("recompute_num_layers", "must not be set with selective recompute "
             "(TransformerConfig rejects it)")
    modules = config.recompute_modules or []
    if "moe_act" in modules and not config.moe_grouped_gemm:
        fail("recompute_modules", "moe_act in recompute_modules is only supported with "
             "moe_grouped_gemm (TransformerConfig rejects it)")
    if "mla_up_proj" in modules and not config.multi_latent_attention:
        fail("recompute_modules", "mla_up_proj in recompute_modules is only supported with "
             "multi_latent_attention (TransformerConfig rejects it)")
