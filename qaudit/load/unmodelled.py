"""The one table of settings qaudit accepts but does not model, shared by every input route.

A TransformerConfig YAML, a MODEL_ARGS file and a launch script all reach the same entry: the
YAML route by field name (qaudit/load/config.py), the flag routes by the parser destination of the
flag (qaudit/load/sources/translate.py, through `FLAG_FIELDS` for the few flags whose destination is
not the field's name). Each entry says what TE or Megatron does differently from the audited
model; rule QA090 turns it into the same warning whichever way the setting was given, naming
it as the user wrote it (`delay_wgrad_compute` or `--delay-wgrad-compute`).

Keys are TransformerConfig / GPTModelProvider field names, or Megatron argument names for
settings that are no config field (DDP and training-loop options). Settings that qaudit models
are not here (qaudit/load/config.py `ModelConfig`), except for the values of a modelled setting that
it still does not model (`cuda_graph_impl: full_iteration`). docs/te-settings.md says which
TE settings are modelled and how.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def _on(value: Any) -> bool:
    """Set to something other than its off value (False, None, 0, "", [])."""
    return bool(value)


def _above_one(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 1


def _is_false(value: Any) -> bool:
    return value is False


def _words(value: Any) -> set[str]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return {str(item).split(".")[-1] for item in items if item is not None}


def _full_iteration(value: Any) -> bool:
    return bool(_words(value) & {"full_iteration", "full_iteration_inference"})


@dataclass(frozen=True)
class Unmodelled:
    why: str
    # Whether a value turns the unmodelled behaviour on; a value it rejects says nothing.
    on: Callable[[Any], bool] = _on


_OVERLAP = ("communication overlap changes when and in which order gradients are reduced and "
            "weights gathered; not modelled")
_OVERLAP_SCHEDULE = ("the fine-grained expert-parallel overlap schedule runs layers as separate "
                     "forward/backward/backward_dw nodes (one node per MTP layer module); not "
                     "modelled")
_GTP = ("distributed (GTP) weights: TE main computes their weight gradient with accumulate=False "
        "and adds it in a later finalize step, whatever is_first_microbatch says; audited as "
        "ordinary weights")
_FULL_GRAPH = ("a whole-iteration CUDA graph (every microbatch's forward and backward replayed "
               "as one graph) is not modelled; audited without CUDA graphs")
_FACTORY = ("a custom quantizer factory is Python code qaudit never imports; modules are audited "
            "with the recipe's format only")

UNMODELLED: dict[str, Unmodelled] = {
    # Which modules exist.
    "experimental_attention_variant": Unmodelled(
        "experimental attention variants (gated delta net, DSA) build other attention modules; "
        "not modelled"),
    "linear_attention_freq": Unmodelled("linear attention layers are not modelled"),
    "heterogeneous_block_specs": Unmodelled(
        "heterogeneous layer configs (per-layer shapes) are not modelled"),
    "mtp_standalone": Unmodelled("MTP placed in its own pipeline stage is not modelled"),
    "microbatch_group_size_per_vp_stage": Unmodelled(
        "the interleaved schedule's microbatch grouping is not modelled", _above_one),
    "use_transformer_engine_op_fuser": Unmodelled(
        "TE op-fuser MLPs take no is_first_microbatch: they add into main_grad, or overwrite "
        "it where the parameter has overwrite_main_grad (Megatron-FSDP), and ignore "
        "per-module recipes; not modelled"),
    "use_grouped_gemm_for_shared_expert": Unmodelled("grouped shared experts are not modelled"),
    "use_grouped_gemm_for_dense_mlp": Unmodelled("grouped dense MLPs are not modelled"),
    "moe_single_grouped_weight": Unmodelled("a single grouped expert weight is not modelled"),
    "moe_use_grouped_tensor": Unmodelled("grouped expert tensors are not modelled"),
    "enable_mhc_connections": Unmodelled("hyper-connections are not modelled"),
    "mhc_recompute_layer_num": Unmodelled("hyper-connection recompute is not modelled"),
    "transformer_impl": Unmodelled("only transformer_engine layers are modelled",
                                   lambda v: v not in (None, "transformer_engine")),
    # CUDA graphs: per-layer graphs are modelled (qaudit/plan/graphs.py), this is not.
    "cuda_graph_impl": Unmodelled(_FULL_GRAPH, lambda v: v == "full_iteration"),
    "cuda_graph_modules": Unmodelled(_FULL_GRAPH, _full_iteration),
    "cuda_graph_scope": Unmodelled(_FULL_GRAPH, _full_iteration),
    # When and how gradients land.
    "overlap_moe_expert_parallel_comm": Unmodelled(_OVERLAP_SCHEDULE),
    "overlap_dispatch_backward_with_experts_wgrad": Unmodelled(
        "expert weight gradients deferred behind the dispatch backward are not modelled"),
    "tp_comm_overlap": Unmodelled(_OVERLAP),
    "defer_embedding_wgrad_compute": Unmodelled(
        "deferred output-layer weight gradients are not modelled"),
    "tensor_parallel_num_weight_shards": Unmodelled(_GTP, _above_one),
    "expert_tensor_parallel_num_weight_shards": Unmodelled(_GTP, _above_one),
    "gtp_weight_remat_size": Unmodelled(_GTP, _above_one),
    "expert_gtp_weight_remat_size": Unmodelled(_GTP, _above_one),
    "use_torch_fsdp2": Unmodelled(
        "FSDP2: TE keeps no quantized weight cache (no workspace key), so the flag never "
        "reuses a stale weight, while its weight-gradient decision still follows the flag; "
        "audited without FSDP2"),
    "keep_fp8_transpose_cache": Unmodelled("FSDP's FP8 transpose cache is not modelled"),
    # Quantization beyond the recipe and format.
    "fp8_quantizer_factory": Unmodelled(_FACTORY),
    "fp4_quantizer_factory": Unmodelled(_FACTORY),
    "fp8_wgrad": Unmodelled("high-precision weight-gradient GEMMs under FP8 are not modelled",
                            _is_false),
    "use_kitchen_attention": Unmodelled("kitchen attention is not modelled"),
    # Training loops other than pretraining.
    "perform_rl_step": Unmodelled("the RL training loop is not modelled"),
}

# Settings read and shown to change nothing the audit reports: listed once by QA091, never a
# warning. Each reason is one clause; docs/no-effect-settings.md gives the upstream evidence.
_REDUCE_AFTER_LAST_USE = ("the data-parallel reduce starts only once every parameter has "
                          "reported as many grad-ready events as in the first step, on the "
                          "last microbatch, so it sees the same main_grad")
_GATHER_BEFORE_USE = ("each module's forward waits for its parameters' all-gather, so every "
                      "call computes with the same weights")
NO_EFFECT: dict[str, Unmodelled] = {
    "overlap_grad_reduce": Unmodelled(_REDUCE_AFTER_LAST_USE),
    "overlap_param_gather": Unmodelled(_GATHER_BEFORE_USE),
    "overlap_param_gather_with_optimizer_step": Unmodelled(_GATHER_BEFORE_USE),
}

# Flags of Megatron's inference entry scripts (examples/inference/gpt/utils.py adds them to the
# training parser): what to generate and how to report it, read by the generation loop after
# the model is built. No module, precision or gradient depends on them.
INFERENCE_ONLY_FLAGS = frozenset({
    "--temperature", "--top_k", "--top_p", "--return-log-probs", "--num-tokens-to-generate",
    "--prompts", "--prompt-file", "--prompt-file-num-truncate", "--output-path",
    "--incoming-requests-per-sec", "--incoming-requests-per-step", "--inference-repeat-n",
    "--termination-id", "--output-every-n-results", "--stop-words", "--no-record-throughput",
    "--inference-ckpt-non-strict",
})
INFERENCE_ONLY_WHY = ("an inference entry script's generation setting, read after the model "
                      "is built")


def no_effect_reason(name: str, value: Any) -> str | None:
    """Why setting `name` to `value` changes nothing the audit reports, or None."""
    entry = NO_EFFECT.get(name)
    if entry is None or not entry.on(value):
        return None
    return entry.why


# A setting whose warning depends on another: is_hybrid_model without a layer pattern (the
# flag route notes it in qaudit/families/hybrid/flags.py, the YAML route in qaudit/load/config.py).
HYBRID_WITHOUT_PATTERN = ("the hybrid layers are not known without a layer pattern (Megatron "
                          "builds them from hybrid_layer_pattern); audited as a GPT stack")

# Flag destinations (Megatron's argparse `dest`) that are not the field's own name.
FLAG_FIELDS: dict[str, str] = {
    "cuda_graph_scope_deprecated": "cuda_graph_scope",
    "fp8_param_gather": "fp8_param",
    "fp4_param_gather": "fp4_param",
}


def field_of_dest(dest: str) -> str:
    return FLAG_FIELDS.get(dest, dest)


def note_for_setting(name: str, value: Any) -> str | None:
    """The QA090 reason for setting `name` to `value`, or None when it needs no warning."""
    entry = UNMODELLED.get(name)
    if entry is None or not entry.on(value):
        return None
    return entry.why
