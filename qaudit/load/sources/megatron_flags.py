"""Megatron-LM training flags, classified for the audit.

Three kinds, checked against `megatron/training/arguments.py` and
`megatron/training/argument_utils.py::core_transformer_config_from_args` at the commit named in
`upstream_flags`:

- `MODELLED`: the flag sets a `TransformerConfig` field qaudit models (see `qaudit.load.config`);
  `translate` turns it into that field. Flags whose effect is not a plain field copy (GQA,
  SwiGLU's default FFN width, kitchen, recompute shortcuts) are handled there by name.
- `UNMODELLED`: flags whose reading the audit does not follow (custom specs, argument files,
  checkpoint arguments, and features modelled only once a field exists). Each becomes a
  `SourceNote` (rule QA090 turns it into a warning); the audit goes on without it. Flags that
  set a config field or a Megatron argument the audit does not model are looked up in the
  table every input route shares, qaudit/load/unmodelled.py (qaudit/load/sources/translate.py).
- everything else Megatron's parser knows (data, logging, optimizer, checkpointing, learning
  rate, parallel sizes that do not change per-module behaviour, ...): irrelevant to the audit,
  accepted silently.

A flag the upstream parser does not know also becomes a note: real scripts carry custom flags
for their own entry points, so it is not an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from qaudit.load.config import MODELLED_FIELDS
from qaudit.load.sources.listexpr import is_list_expression, parse_list_expression


# --- value conversions (argv text -> field value); ValueError names what was expected ----

def to_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def to_str(text: str) -> str:
    return text


def to_layer_freq(text: str) -> int | list[int]:
    """Upstream's `moe_freq_type`: an integer N (every N-th layer is MoE) or a list pattern."""
    text = text.strip()
    if is_list_expression(text):
        return parse_list_expression(text)
    return to_int(text)


@dataclass(frozen=True)
class Modelled:
    field: str
    convert: Callable[[str], Any] | None = None  # None: a switch storing `value`
    value: Any = True
    many: bool = False  # takes a list of values (argparse nargs '+')


# Flag -> config field. Switch entries store `value`; the rest convert their one value.
_MODELLED: dict[str, Modelled] = {
    "--num-layers": Modelled("num_layers", to_int),
    "--hidden-size": Modelled("hidden_size", to_int),
    "--ffn-hidden-size": Modelled("ffn_hidden_size", to_int),
    "--num-attention-heads": Modelled("num_attention_heads", to_int),
    # Upstream copies --num-query-groups only with --group-query-attention (translate does it).
    "--num-query-groups": Modelled("num_query_groups", to_int),
    "--kv-channels": Modelled("kv_channels", to_int),
    "--swiglu": Modelled("gated_linear_unit"),
    "--quick-geglu": Modelled("gated_linear_unit"),  # gated as well, with quick GELU
    "--num-experts": Modelled("num_moe_experts", to_int),
    "--moe-ffn-hidden-size": Modelled("moe_ffn_hidden_size", to_int),
    "--moe-shared-expert-intermediate-size": Modelled("moe_shared_expert_intermediate_size", to_int),
    "--moe-latent-size": Modelled("moe_latent_size", to_int),
    "--moe-layer-freq": Modelled("moe_layer_freq", to_layer_freq),
    "--moe-grouped-gemm": Modelled("moe_grouped_gemm"),
    "--moe-router-topk": Modelled("moe_router_topk", to_int),
    "--mtp-num-layers": Modelled("mtp_num_layers", to_int),
    "--mtp-use-repeated-layer": Modelled("mtp_use_repeated_layer"),
    "--fp8-format": Modelled("fp8", to_str),
    "--fp8-recipe": Modelled("fp8_recipe", to_str),
    "--fp4-format": Modelled("fp4", to_str),
    "--fp4-recipe": Modelled("fp4_recipe", to_str),
    "--first-last-layers-bf16": Modelled("first_last_layers_bf16"),
    "--num-layers-at-start-in-bf16": Modelled("num_layers_at_start_in_bf16", to_int),
    "--num-layers-at-end-in-bf16": Modelled("num_layers_at_end_in_bf16", to_int),
    "--fp8-output-proj": Modelled("fp8_output_proj"),
    "--no-gradient-accumulation-fusion": Modelled("gradient_accumulation_fusion", value=False),
    "--untie-embeddings-and-output-weights": Modelled("share_embeddings_and_output_weights",
                                                      value=False),
    "--te-precision-config-file": Modelled("quant_recipe", to_str),
    "--vocab-size": Modelled("vocab_size", to_int),
    "--padded-vocab-size": Modelled("vocab_size", to_int),  # the real embedding size: wins
    # Kitchen: upstream sets use_kitchen from either option (payloads are not public).
    "--kitchen-config-file": Modelled("use_kitchen"),
    "--kitchen-recipe-number": Modelled("use_kitchen"),
    # Not an upstream flag; accepted for scripts written against TransformerConfig.use_kitchen.
    "--use-kitchen": Modelled("use_kitchen"),
    "--recompute-granularity": Modelled("recompute_granularity", to_str),
    "--recompute-method": Modelled("recompute_method", to_str),
    "--recompute-num-layers": Modelled("recompute_num_layers", to_int),
    "--recompute-modules": Modelled("recompute_modules", to_str, many=True),
    # validate_args turns it into recompute_granularity = 'selective', whatever else was given.
    "--recompute-activations": Modelled("recompute_granularity", value="selective"),
    # TransformerConfig turns it into selective recompute of "moe" (qaudit.load.config does too).
    "--moe-layer-recompute": Modelled("moe_layer_recompute"),
    "--pipeline-model-parallel-size": Modelled("pipeline_model_parallel_size", to_int),
    "--num-virtual-stages-per-pipeline-rank": Modelled("virtual_pipeline_model_parallel_size",
                                                       to_int),
    "--decoder-first-pipeline-num-layers": Modelled("num_layers_in_first_pipeline_stage", to_int),
    "--decoder-last-pipeline-num-layers": Modelled("num_layers_in_last_pipeline_stage", to_int),
    "--account-for-embedding-in-pipeline-split": Modelled("account_for_embedding_in_pipeline_split"),
    "--account-for-loss-in-pipeline-split": Modelled("account_for_loss_in_pipeline_split"),
    # validate_args derives the virtual pipeline size from it (config does, as TransformerConfig).
    "--pipeline-model-parallel-layout": Modelled("pipeline_model_parallel_layout", to_str),
    # Multi-latent attention (translate fills the CLI defaults of the two ranks).
    "--multi-latent-attention": Modelled("multi_latent_attention"),
    "--q-lora-rank": Modelled("q_lora_rank", to_int),
    "--kv-lora-rank": Modelled("kv_lora_rank", to_int),
    "--qk-head-dim": Modelled("qk_head_dim", to_int),
    "--qk-pos-emb-head-dim": Modelled("qk_pos_emb_head_dim", to_int),
    "--v-head-dim": Modelled("v_head_dim", to_int),
    "--qk-layernorm": Modelled("qk_layernorm"),
    "--mla-down-proj-fusion": Modelled("mla_down_proj_fusion"),
    "--use-megatron-fsdp": Modelled("use_megatron_fsdp"),
    # Hybrid (Mamba) models: translate derives num_layers, MTP depths and virtual pipelining
    # from the pattern and handles --hybrid-override-pattern / --mtp-hybrid-override-pattern.
    "--hybrid-layer-pattern": Modelled("hybrid_layer_pattern", to_str),
    "--mamba-state-dim": Modelled("mamba_state_dim", to_int),
    "--mamba-head-dim": Modelled("mamba_head_dim", to_int),
    "--mamba-num-groups": Modelled("mamba_num_groups", to_int),
    "--mamba-num-heads": Modelled("mamba_num_heads", to_int),
    "--data-parallel-sharding-strategy": Modelled("data_parallel_sharding_strategy", to_str),
    # Encoder-decoder (T5): translate sets num_layers too and handles --decoder-num-layers.
    "--encoder-num-layers": Modelled("encoder_num_layers", to_int),
    # Settings that change what TE does (docs/te-settings.md).
    "--delay-wgrad-compute": Modelled("delay_wgrad_compute"),
    "--cuda-graph-impl": Modelled("cuda_graph_impl", to_str),
    "--enable-cuda-graph": Modelled("enable_cuda_graph"),
    "--external-cuda-graph": Modelled("external_cuda_graph"),
    "--cuda-graph-modules": Modelled("cuda_graph_modules", to_str, many=True),
    "--cuda-graph-scope": Modelled("cuda_graph_scope", to_str, many=True),
    "--fp8-param-gather": Modelled("fp8_param"),  # argument_utils: fp8_param = fp8_param_gather
    "--fp4-param-gather": Modelled("fp4_param"),
    "--freeze-all-layers": Modelled("freeze_all_layers"),
}

# Flags that are not a field copy but still decide modelled fields (handled in translate).
SPECIAL = frozenset({"--group-query-attention", "--transformer-impl",
                     "--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-layout",
                     "--hybrid-override-pattern", "--mtp-hybrid-override-pattern",
                     "--is-hybrid-model", "--decoder-num-layers"})


@dataclass(frozen=True)
class Unmodelled:
    why: str
    # Only noted when the value says the feature is on (e.g. a size above 1); None: always.
    when: Callable[[list[str]], bool] | None = None
    # Only noted when this other flag is given too (detail flags of a feature).
    requires: str | None = None
    # Not noted once qaudit.load.config models this field (the flag is then in the table above).
    unless_modelled: str | None = None


def _above_one(values: list[str]) -> bool:
    try:
        return int(values[0]) > 1
    except (ValueError, IndexError):
        return True


def _not_hybrid_spec(values: list[str]) -> bool:
    words = set(" ".join(values).strip("[]\"' ").replace(",", " ").split())
    return not (_HYBRID_FIELD in MODELLED_FIELDS and words in _HYBRID_SPECS)


_PIPELINE = "pipeline layouts (per-stage layer positions, per-chunk re-arming) are not modelled"
_MLA = ("multi-latent attention is not modelled: the audit builds standard attention "
        "(linear_qkv/linear_proj) instead of the MLA projections")
_MLA_FLAG, _MLA_FIELD = "--multi-latent-attention", "multi_latent_attention"
_VPP = "virtual_pipeline_model_parallel_size"
_HYBRID = "hybrid (Mamba) layers are not modelled: the audit builds a plain transformer stack"
_HYBRID_FIELD = "hybrid_layer_pattern"
# The spec every hybrid example passes (the module, then the spec's name); others may build
# other modules. mamba_layer_specs is the deprecated module name of the same spec.
_HYBRID_SPECS = ({"megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"},
                 {"megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"})
_T5, _T5_FIELD = "encoder-decoder (T5) models are not modelled", "encoder_num_layers"

UNMODELLED: dict[str, Unmodelled] = {
    # Pipeline and virtual pipeline: modelled once qaudit.load.config has the layout fields.
    "--pipeline-model-parallel-size": Unmodelled(_PIPELINE, _above_one, unless_modelled=_VPP),
    "--num-layers-per-virtual-pipeline-stage": Unmodelled(_PIPELINE, unless_modelled=_VPP),
    "--num-virtual-stages-per-pipeline-rank": Unmodelled(_PIPELINE, unless_modelled=_VPP),
    "--decoder-first-pipeline-num-layers": Unmodelled(
        _PIPELINE, unless_modelled="num_layers_in_first_pipeline_stage"),
    "--decoder-last-pipeline-num-layers": Unmodelled(
        _PIPELINE, unless_modelled="num_layers_in_last_pipeline_stage"),
    "--account-for-embedding-in-pipeline-split": Unmodelled(
        _PIPELINE, unless_modelled="account_for_embedding_in_pipeline_split"),
    "--account-for-loss-in-pipeline-split": Unmodelled(
        _PIPELINE, unless_modelled="account_for_loss_in_pipeline_split"),
    # Multi-latent attention: modelled when qaudit.load.config models it (see note_for).
    "--multi-latent-attention": Unmodelled(_MLA, unless_modelled=_MLA_FIELD),
    "--q-lora-rank": Unmodelled(_MLA, requires=_MLA_FLAG, unless_modelled=_MLA_FIELD),
    "--kv-lora-rank": Unmodelled(_MLA, requires=_MLA_FLAG, unless_modelled=_MLA_FIELD),
    "--qk-head-dim": Unmodelled(_MLA, requires=_MLA_FLAG, unless_modelled=_MLA_FIELD),
    "--qk-pos-emb-head-dim": Unmodelled(_MLA, requires=_MLA_FLAG, unless_modelled=_MLA_FIELD),
    "--v-head-dim": Unmodelled(_MLA, requires=_MLA_FLAG, unless_modelled=_MLA_FIELD),
    # Hybrid / Mamba models, heterogeneous stacks, encoder-decoder models, custom specs.
    # (Modelled once qaudit.load.config has the pattern field; translate notes --is-hybrid-model
    # given without a pattern.)
    "--is-hybrid-model": Unmodelled(_HYBRID, unless_modelled=_HYBRID_FIELD),
    "--hybrid-layer-pattern": Unmodelled(_HYBRID, unless_modelled=_HYBRID_FIELD),
    "--hybrid-override-pattern": Unmodelled(_HYBRID, unless_modelled=_HYBRID_FIELD),
    "--mtp-hybrid-override-pattern": Unmodelled(_HYBRID, unless_modelled=_HYBRID_FIELD),
    "--heterogeneous-layers-config-path": Unmodelled(
        "heterogeneous layer configs (per-layer shapes) are not modelled"),
    "--heterogeneous-layers-config-encoded-json": Unmodelled(
        "heterogeneous layer configs (per-layer shapes) are not modelled"),
    "--encoder-num-layers": Unmodelled(_T5, unless_modelled=_T5_FIELD),
    "--decoder-num-layers": Unmodelled(_T5, unless_modelled=_T5_FIELD),
    "--spec": Unmodelled("a custom layer spec may build other modules than the TE GPT spec",
                         _not_hybrid_spec),
    "--yaml-cfg": Unmodelled("arguments read from a YAML config file are not seen"),
    "--use-checkpoint-args": Unmodelled("model arguments loaded from the checkpoint are not seen"),
    # Settings that are config fields or Megatron arguments (overlaps, CUDA graph modes, GTP
    # weights, ...) are in the table every route shares: qaudit/load/unmodelled.py.
}

_EXTRA_NOTES = {
    # Kitchen payloads are not public: only use_kitchen's tracking is modelled.
    "--kitchen-config-file": "the kitchen recipe itself is not read; modules are audited as "
                             "tracked kitchen modules in the ambient precision",
    "--kitchen-recipe-number": "the kitchen recipe itself is not read; modules are audited as "
                               "tracked kitchen modules in the ambient precision",
}


def modelled_flags() -> dict[str, Modelled]:
    """The table, limited to fields `qaudit.load.config` models now (others fall back to notes)."""
    return {flag: spec for flag, spec in _MODELLED.items() if spec.field in MODELLED_FIELDS}


def note_for(flag: str) -> Unmodelled | None:
    if flag in UNMODELLED:
        note = UNMODELLED[flag]
        return None if note.unless_modelled in MODELLED_FIELDS else note
    if flag in _MODELLED and _MODELLED[flag].field not in MODELLED_FIELDS:
        return Unmodelled(f"sets {_MODELLED[flag].field}, which the audit does not model")
    if flag in _EXTRA_NOTES:
        return Unmodelled(_EXTRA_NOTES[flag])
    return None

