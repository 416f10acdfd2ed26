"""The megatron-core releases qaudit knows, each with the tracking behaviour its code has.

Every row was read from that release's wheel on the package index by `scripts/megatron-releases`,
which runs qaudit's own source reader (qaudit/plan/upstream/detect.py) over each wheel and checks the
result against this table; docs/megatron-releases.md is the table with the files and functions
each column comes from. `main` is Megatron-LM main as qaudit models it: commit d98e8a64 with
PR #6965 merged (qaudit/plan/upstream/commits.py defines it, beside the commits known by name).
"""

from __future__ import annotations

from dataclasses import dataclass

from qaudit.plan.policies import POLICIES, TrackingPolicy

# Releases from the first whose TE wrappers pass `is_first_microbatch` (0.5.0) to the newest.
RELEASES = ("0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0", "0.10.0", "0.11.0", "0.12.0", "0.12.1",
            "0.12.2", "0.12.3", "0.13.0", "0.13.1", "0.14.0", "0.15.0", "0.15.1", "0.15.2",
            "0.15.3", "0.16.0", "0.16.1", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.18.2",
            "0.19.0", "0.19.1", "0.19.2")
NEWEST_RELEASE = RELEASES[-1]
MAIN = "main"
# Releases the package index marks yanked, with the index's reason (read by
# `scripts/megatron-releases check`, which fails when the index says otherwise). pip installs
# them only when asked for by exact version; their code is still what the table says.
YANKED: dict[str, str] = {"0.18.1": "wrong version", "0.19.1": "wrong version"}

# The first release whose TransformerConfig (or ModelParallelConfig) has each field qaudit
# models, for fields younger than 0.5.0; read from transformer_config.py and
# model_parallel_config.py of each wheel.
FIELD_SINCE: dict[str, str] = {
    "moe_grouped_gemm": "0.5.0", "moe_router_topk": "0.5.0",
    "disable_parameter_transpose_cache": "0.6.0", "qk_layernorm": "0.6.0",
    "moe_layer_recompute": "0.7.0",
    "moe_ffn_hidden_size": "0.10.0", "moe_shared_expert_intermediate_size": "0.10.0",
    "moe_layer_freq": "0.10.0", "multi_latent_attention": "0.10.0", "q_lora_rank": "0.10.0",
    "kv_lora_rank": "0.10.0", "qk_head_dim": "0.10.0", "qk_pos_emb_head_dim": "0.10.0",
    "v_head_dim": "0.10.0",
    "num_layers_in_first_pipeline_stage": "0.11.0", "num_layers_in_last_pipeline_stage": "0.11.0",
    "account_for_embedding_in_pipeline_split": "0.11.0",
    "account_for_loss_in_pipeline_split": "0.11.0",
    "mtp_num_layers": "0.12.0", "fp8_recipe": "0.12.0", "first_last_layers_bf16": "0.12.0",
    "num_layers_at_start_in_bf16": "0.12.0", "num_layers_at_end_in_bf16": "0.12.0",
    "recompute_modules": "0.12.0", "mamba_state_dim": "0.12.0", "mamba_head_dim": "0.12.0",
    "mamba_num_groups": "0.12.0",
    "use_kitchen": "0.13.0", "mamba_num_heads": "0.13.0",
    "pipeline_model_parallel_layout": "0.13.0",
    "fp4": "0.15.0", "fp4_recipe": "0.15.0",
    "mtp_use_repeated_layer": "0.17.0", "mla_down_proj_fusion": "0.17.0",
    "moe_latent_size": "0.16.0",
    "fp8_output_proj": "0.18.0",
    # TE settings (docs/te-settings.md).
    "enable_cuda_graph": "0.7.0", "external_cuda_graph": "0.9.0", "cuda_graph_scope": "0.12.0",
    "fp8_param": "0.12.0", "delay_wgrad_compute": "0.13.0", "cuda_graph_impl": "0.15.0",
    "fp4_param": "0.15.0", "cuda_graph_modules": "0.18.0",
}


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class MegatronBehaviour:
    """What one Megatron does with the flag, and which of qaudit's settings it has."""

    policy: str  # a name in POLICIES: how the wrappers pass the flag
    # What the wrappers pass, as read: "flag" (the stored flag, 0.5.0), "legacy" (None when
    # disable_parameter_transpose_cache, else the flag), "config" (PR #6965), "module" (#7353).
    passing: str
    rearm_on: tuple[str, ...] | None  # settings that re-arm the flags; None: always
    te_recipes: bool  # reads TE quant recipes (TEQuantizationParams, quant_recipe)
    will_execute_quantized: bool  # the wrappers answer will_execute_quantized
    # TransformerConfig fields qaudit models that this Megatron lacks (a config setting one
    # cannot run on it).
    missing_fields: frozenset[str] = frozenset()

    def tracking_policy(self) -> TrackingPolicy:
        return POLICIES[self.policy].rearming_on(self.rearm_on)

    @property
    def repeated_mtp_layer(self) -> bool:
        return "mtp_use_repeated_layer" not in self.missing_fields


def _rearm_guard(version: str) -> tuple[str, ...] | None:
    key = version_key(version)
    if key < (0, 9):
        return None
    if key < (0, 13):
        return ("fp8",)
    if key < (0, 15):
        return ("fp8", "use_kitchen")
    if key < (0, 19):
        return ("fp8", "fp4", "use_kitchen")
    return ("fp8", "fp4", "use_kitchen", "quant_recipe")


def _release_behaviour(version: str) -> MegatronBehaviour:
    key = version_key(version)
    rearm_on = _rearm_guard(version)
    policy = ("always-rearm" if rearm_on is None
              else "legacy" if "quant_recipe" in rearm_on else "pre-5642")
    return MegatronBehaviour(
        policy=policy, passing="flag" if key < (0, 6) else "legacy", rearm_on=rearm_on,
        te_recipes=key >= (0, 16),
        will_execute_quantized=key >= (0, 16),
        missing_fields=frozenset(name for name, since in FIELD_SINCE.items()
                                 if version_key(since) > key))


KNOWN: dict[str, MegatronBehaviour] = {version: _release_behaviour(version) for version in RELEASES}
KNOWN[MAIN] = MegatronBehaviour(policy="config", passing="config",
                                rearm_on=("fp8", "fp4", "use_kitchen", "quant_recipe"),
                                te_recipes=True, will_execute_quantized=True)


def behaviour_of(version: str) -> MegatronBehaviour | None:
    return KNOWN.get(version)


def yank_note(version: str | None) -> str | None:
    """`yanked on the package index ("wrong version")` for a yanked release, else None."""
    reason = YANKED.get(version or "")
    return None if reason is None else f'yanked on the package index ("{reason}")'


def releases_with_policy(policy: str) -> list[str]:
    return [v for v in RELEASES if KNOWN[v].policy == policy]


def version_span(versions: list[str]) -> str:
    """`0.15.0-0.18.2` for a run of releases, one version alone, `main` for main."""
    if not versions:
        return ""
    return versions[0] if len(versions) == 1 else f"{versions[0]}-{versions[-1]}"


def policy_versions(policy: str) -> str:
    """Which Megatron versions behave as `policy`, for column labels: `0.19.0-0.19.2`, `main`."""
    if policy == KNOWN[MAIN].policy:
        return MAIN
    if policy == "module":
        return "PR #7353"
    return version_span(releases_with_policy(policy))
