"""Per-layer CUDA graphs (`cuda_graph_impl: local | transformer_engine`): which TE modules a
graph captures, and what TE sees at their replays. Facts and upstream paths:
docs/te-settings.md (CUDA graphs).

- Captured: the TE modules of the layers Megatron graphs, in training. Transformer Engine's
  implementation (TECudaGraphHelper) graphs the decoder layers and each MTP layer's inner
  transformer layer (`mtp.layers.K.mtp_model_layer`), never `eh_proj` nor the output layer;
  the local implementation graphs every transformer layer, T5's encoder layers too.
  `cuda_graph_modules` narrows a layer to parts: `attn` (self- and cross-attention), `mlp`
  (a dense MLP), `moe` (a MoE layer's experts and shared experts), `moe_router` (the router
  and, not overlapped, the shared experts), `mamba` (a Mamba mixer); empty: the whole layer.
- With fp8 or fp4 set, both implementations create TE's skip-weight-update flag: during
  capture a TE module forces `is_first_microbatch=False` (so its backward, replayed as
  captured, accumulates with fusion) and records its weight quantization with the flag as a
  no-op switch; at replay the flag is `not is_first_microbatch` of the graphed layer's
  microbatch, so the cached weight is refreshed on each step's first microbatch.
- Without fp8/fp4 there is no flag: the graph replays what the wrappers passed at capture,
  which follows warm-up. Warm-up consumes the armed flag, so the capture sees the policy's
  value for a consumed flag (False, or None under PR #6965), except with Transformer Engine
  before v2.14, whose `make_graphed_callables` re-arms every flag after warm-up: the first
  microbatch's graph (Transformer Engine's implementation) then captures the armed value.
  (inference: from the capture order in TE `graph.py`; not confirmed on a GPU.)
"""

from __future__ import annotations

from qaudit.load.config import ModelConfig

GRAPH_IMPLS = ("local", "transformer_engine")


def _layer_part(name: str, impl: str) -> str | None:
    """The part of `name` inside a graphable layer (`self_attention.linear_qkv`), or None when
    the module is outside every graphable layer."""
    parts = name.split(".")
    if len(parts) > 3 and parts[0] in ("decoder", "encoder") and parts[1] == "layers" \
            and parts[2].isdigit():
        if parts[0] == "encoder" and impl != "local":
            return None  # TECudaGraphHelper looks at the decoder and MTP only
        return ".".join(parts[3:])
    if len(parts) > 4 and parts[0] == "mtp" and parts[1] == "layers" and parts[3] == "mtp_model_layer" \
            and parts[4] != "layers":  # a hybrid MTP depth is a stack, not one graphable layer
        return ".".join(parts[4:])
    return None


def _in_scope(part: str, scopes: list[str]) -> bool:
    if not scopes:
        return True
    moe = part.startswith(("mlp.experts.", "mlp.shared_experts."))
    checks = {
        "attn": part.startswith(("self_attention.", "cross_attention.")),
        "mlp": part.startswith("mlp.") and not moe,
        "moe": moe,
        "moe_router": part.startswith("mlp.shared_experts."),
        "mamba": part.startswith("mixer."),
    }
    return any(checks.get(scope, False) for scope in scopes)


def is_graphed(config: ModelConfig, name: str) -> bool:
    """Whether the TE module named `name` (local to its model chunk) runs inside a per-layer
    CUDA graph in training."""
    impl = config.graph_impl
    if impl not in GRAPH_IMPLS:
        return False
    part = _layer_part(name, impl)
    return part is not None and _in_scope(part, config.graph_modules())


def has_skip_flag(config: ModelConfig) -> bool:
    """TE's skip-weight-update flag exists: both implementations create it when the config
    sets fp8 or fp4 (a recipe alone does not)."""
    return bool(config.fp8 or config.fp4)


def captured_armed(config: ModelConfig, microbatch: int, warmup_rearms: bool) -> bool:
    """Without the skip flag: whether the graph replayed at `microbatch` captured the armed
    flag (TE before v2.14 re-arms after warm-up; its first microbatch's graph is captured
    first)."""
    return warmup_rearms and config.graph_impl == "transformer_engine" and microbatch == 0
