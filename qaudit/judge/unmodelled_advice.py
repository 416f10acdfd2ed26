"""What QA090 tells a reviewer per unmodelled setting: what qaudit cannot see, the concrete way
to check it, and whether the setting can change this verdict.

The reason a setting is unmodelled comes from the loaders (qaudit/load/unmodelled.py and the
flag tables); this table adds the reviewer's next step. Three ways to check, from cheapest:

- `--cross-check`: builds the config with the installed Megatron and compares its modules,
  calls and flags with qaudit's (docs/cross-check.md). It sees which modules exist.
- `qaudit guard -- LAUNCH`: watches the real run's first step and stops before the optimizer
  when a gradient is overwritten (docs/guard.md). It sees when and how gradients land.
- the upstream code path that decides it, to read where neither applies.

A setting shown to change nothing the audit reports is not a warning: `NO_EFFECT` names them
and QA091 lists them with the settings the loaders already mark so.
"""

from __future__ import annotations

from dataclasses import dataclass

CROSS_CHECK = "run qaudit check CONFIG --cross-check with your Megatron installed (it compares "\
    "the modules it builds with the audited ones)"
GUARD = "run qaudit guard -- LAUNCH_COMMAND on the real job (it watches every main_grad write "\
    "of the first step and stops before the optimizer on a lost gradient)"


@dataclass(frozen=True)
class Advice:
    unseen: str  # what qaudit cannot see
    check: str  # how to check it
    verdict: str  # whether it can change this verdict, and why


_MODULES = Advice("which modules the real model builds", CROSS_CHECK,
                  "yes: other modules can run more than once or in another precision")
_WHEN = Advice("when and in which order the real run writes gradients", GUARD,
               "yes: a reordered or deferred weight-gradient write can overwrite or be "
               "overwritten")
_QUANT = Advice("the quantizer the factory builds (Python qaudit never imports)",
                "pass --allow-import to import the factory, or read it",
                "the precision can differ; the accumulation verdict cannot")
_RUN = Advice("the rest of the run's arguments", "audit the file they come from, or "
              "run qaudit guard -- LAUNCH_COMMAND on the real job", "yes: unknown settings")

ADVICE: dict[str, Advice] = {
    "use_transformer_engine_op_fuser": Advice(
        "the op-fuser MLP's modules (TE's fused operations replace linear_fc1/linear_fc2)",
        "read megatron/core/transformer/moe/experts.py (the fused GroupedMLP) and "
        "megatron/core/models/gpt/gpt_layer_specs.py (use_te_op_fuser), and run qaudit guard "
        "-- LAUNCH_COMMAND",
        "not through is_first_microbatch for the modules it replaces (they add into main_grad, "
        "or under Megatron-FSDP overwrite it, every microbatch), but their own bugs can: on TE "
        "2.14 and 2.14.1 the fused grouped-MLP backward never writes a single grouped weight's "
        "main_grad under Megatron-FSDP (QA051); yes for the modules around them, audited as "
        "usual"),
    "tp_comm_overlap": Advice(
        "TE's userbuffer overlap of tensor-parallel communication", GUARD,
        "not through is_first_microbatch (TE takes the same flag with or without the overlap); "
        "only if the overlap reorders weight-gradient writes, which the guard shows"),
    "transformer_impl": _MODULES,
    "experimental_attention_variant": _MODULES,
    "linear_attention_freq": _MODULES,
    "heterogeneous_block_specs": _MODULES,
    "mtp_standalone": _MODULES,
    "use_grouped_gemm_for_shared_expert": _MODULES,
    "use_grouped_gemm_for_dense_mlp": _MODULES,
    "moe_single_grouped_weight": _MODULES,
    "moe_use_grouped_tensor": _MODULES,
    "enable_mhc_connections": _MODULES,
    "mhc_recompute_layer_num": _MODULES,
    "microbatch_group_size_per_vp_stage": _WHEN,
    "cuda_graph_impl": _WHEN,
    "cuda_graph_modules": _WHEN,
    "cuda_graph_scope": _WHEN,
    "overlap_moe_expert_parallel_comm": _WHEN,
    "overlap_dispatch_backward_with_experts_wgrad": _WHEN,
    "defer_embedding_wgrad_compute": _WHEN,
    "tensor_parallel_num_weight_shards": _WHEN,
    "expert_tensor_parallel_num_weight_shards": _WHEN,
    "gtp_weight_remat_size": _WHEN,
    "expert_gtp_weight_remat_size": _WHEN,
    "use_torch_fsdp2": _WHEN,
    "keep_fp8_transpose_cache": _WHEN,
    "perform_rl_step": _WHEN,
    "fp8_quantizer_factory": _QUANT,
    "fp4_quantizer_factory": _QUANT,
    "fp8_wgrad": Advice("the weight-gradient GEMM's precision",
                        "read TE's Float8 recipe handling of fp8_wgrad (the wgrad GEMM)",
                        "no for accumulation (main_grad is written the same way); the "
                        "precision column can differ"),
    "use_kitchen_attention": _MODULES,
    "yaml_cfg": _RUN,
    "use_checkpoint_args": _RUN,
}

# Settings shown to change nothing the audit reports (the reason says why): QA091, not QA090.
NO_EFFECT = frozenset({"keep_mtp_spec_in_bf16"})

_DEFAULT = Advice("what this setting does to the modules or their gradients",
                  f"{CROSS_CHECK}; or {GUARD}", "possibly: qaudit does not know")


def setting_name(key: str | None) -> str:
    """A note's key as the table names it: `--tp-comm-overlap`, `model.tp_comm_overlap` and
    `tp_comm_overlap` are one setting."""
    name = (key or "").lstrip("-").replace("-", "_")
    return name.rsplit(".", 1)[-1]


def advice_for(key: str | None) -> Advice:
    return ADVICE.get(setting_name(key), _DEFAULT)


def shown_without_effect(key: str | None) -> bool:
    return setting_name(key) in NO_EFFECT


def fix_text(key: str | None) -> str:
    advice = advice_for(key)
    return (f"qaudit cannot see {advice.unseen}; to check: {advice.check}; can it change this "
            f"verdict: {advice.verdict}")
