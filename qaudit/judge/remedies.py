"""QA001's remedies, priced on one config and written in the input's own syntax and place.

The fix line (rule QA001) and `--suggest` (which re-audits each remedy) share this pricing and
this order, so the two never disagree on which remedy comes first. The order:

1. remedies the user can write in the input they gave (a YAML key under `model:`, a Megatron-LM
   flag, a Bridge `model.x=y` override), then those that need a code change or another
   Megatron, marked so and saying where;
2. within each, remedies that cost nothing here, then those priced in one unit, cheapest
   first, then those whose cost is precision (no common unit with the others).

The common unit is the extra memory traffic a remedy adds per microbatch, in GiB, at the
config's real widths before any sharding: an estimate from the bytes each element is read or
written (docs/evidence.md, "QA001's fix line"), not a measurement. A cost paid once per
optimizer step counts in full, so it is an upper bound on its per-microbatch share. Ties keep
the order the remedies were offered in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from qaudit.judge.remedy_syntax import (CONFIG_FROM_FLAGS, flag_for, python_value, route,
                                        snippet, switched_off, written)
from qaudit.load.config import ModelConfig
from qaudit.load.upstream_checks import checked_value
from qaudit.plan.sizes import model_params, mtp_depth_params

__all__ = ["Remedy", "cheapest_first", "fix_line", "needs_code_change", "route", "snippet",
           "written"]

# bf16 weight + fp32 main_grad + fp32 master weight + two fp32 Adam moments.
TRAINING_BYTES_PER_PARAM = 2 + 4 + 4 + 8
# Re-quantizing one weight element: read bf16 (2), write the quantized copy and its
# transpose (1 + 1).
REQUANTIZE_BYTES = 2 + 1 + 1
# Unfused accumulation: the wgrad GEMM writes a bf16 .grad (2) that the hook reads back (2)
# before adding it to main_grad, which the fused GEMM does in place.
UNFUSED_BYTES = 2 + 2

# Cost ranks, cheapest first. PRICED remedies sort among themselves by `price`; SPEED and
# PRECISION are costs with no figure in that unit here, after the priced ones.
FREE, UPGRADE, PRICED, SPEED, PRECISION = range(5)


@dataclass(frozen=True)
class Remedy:
    name: str  # what --suggest calls it
    setting: tuple[str, Any] | None  # the config field and value it sets; None: an upgrade
    why: str  # why it helps, for the fix line
    cost: str  # --suggest's cost line
    short: str  # the fix line's cost ("" for an upgrade that costs nothing else)
    rank: int  # FREE .. PRECISION
    price: float | None = None  # PRICED: GiB of extra memory traffic per microbatch


def needs_code_change(config: ModelConfig | None, remedy: Remedy) -> bool:
    """The remedy cannot be written in this input: another Megatron, or a field that the
    input's syntax has no way to set (no Megatron-LM flag sets it)."""
    if remedy.setting is None:
        return True
    return config is not None and route(config) == "flags" \
        and flag_for(*remedy.setting) is None


# Settings upstream refuses a remedy beside, each with the store_true flag that turns it on.
_REFUSED_BESIDE = {"defer_embedding_wgrad_compute": "--defer-embedding-wgrad-compute"}


def refused_with(config: ModelConfig | None, remedy: Remedy) -> str | None:
    """The setting this input keeps that makes upstream refuse the remedy at start-up, if
    any: deferred embedding wgrad needs fused accumulation (megatron-core
    model_parallel_config.py:550), so turning fusion off alone would not start."""
    if config is None or remedy.setting != ("gradient_accumulation_fusion", False):
        return None
    source = config.source
    deferred = checked_value(source.mapping if source is not None else None,
                             "defer_embedding_wgrad_compute")
    return "defer_embedding_wgrad_compute" if deferred is True else None


def also_needed(config: ModelConfig, remedy: Remedy) -> str | None:
    """The second edit, in the input's own syntax, without which upstream refuses the
    remedy (None when it needs none)."""
    kept = refused_with(config, remedy)
    return None if kept is None else switched_off(config, kept, _REFUSED_BESIDE[kept])


def _order_key(config: ModelConfig | None, remedy: Remedy) -> tuple:
    return (needs_code_change(config, remedy), remedy.rank,
            remedy.price if remedy.price is not None else 0.0)


def cheapest_first(remedies: Iterable[Remedy], config: ModelConfig | None = None) -> list[Remedy]:
    """Writable before code changes, then free, upgrades, priced (by price), unpriced."""
    return sorted(remedies, key=lambda remedy: _order_key(config, remedy))  # stable


def _count(params: int) -> str:
    return f"{params / 1e9:.2f} B" if params >= 10**9 else f"{params / 1e6:.1f} M"


def _gib_of(nbytes: float) -> float:
    return nbytes / 2**30


def _gib_text(gib: float) -> str:
    if gib < 1:  # the same unit, bytes, at a readable scale
        return f"{gib * 1024:,.1f} MiB"
    return f"{gib:,.1f} GiB"


def _gib(params: int) -> str:
    return _gib_text(_gib_of(params * TRAINING_BYTES_PER_PARAM))


def _linear_params(config: ModelConfig) -> int:
    """Every weight but the embedding's: the linears whose gradients and quantized copies the
    remedies change (an upper bound: a module kept in bf16 has no quantized copy)."""
    return max(model_params(config) - (config.vocab_size or 32000) * config.hidden_size, 0)


def one_layer_per_depth(config: ModelConfig) -> Remedy:
    extra = max(config.mtp_depths - 1, 0) * mtp_depth_params(config)
    if extra == 0:
        return Remedy("one MTP layer per depth", ("mtp_use_repeated_layer", False),
                      "one MTP layer per depth", "none here: a single MTP depth adds no layer",
                      "no cost here", FREE)
    # The depths already run once each; what grows is the optimizer's state, read and
    # written once per step.
    traffic = _gib_of(2 * extra * TRAINING_BYTES_PER_PARAM)
    return Remedy("one MTP layer per depth", ("mtp_use_repeated_layer", False),
                  "one MTP layer per depth",
                  f"memory: +{_count(extra)} parameters ({_gib(extra)} of weights, gradients "
                  "and Adam state before sharding), and the optimizer reads and writes "
                  f"{_gib_text(traffic)} more per step; the depths no longer share weights",
                  f"costs +{_count(extra)} parameters, {_gib(extra)} held, "
                  f"{_gib_text(traffic)} more traffic per step", PRICED, traffic)


def own_output_layer() -> Remedy:
    return Remedy("Megatron's own output layer", ("fp8_output_proj", False),
                  "Megatron's own output layer accumulates outside Megatron-FSDP",
                  "precision and speed: the output projection runs bf16 instead of quantized",
                  "costs precision and speed", PRECISION)


def megatron_main() -> Remedy:
    return Remedy("Megatron-LM main with PR #6965 (--megatron main)", None,
                  "upgrade to Megatron-LM main with PR #6965 (check with --megatron main: BF16 "
                  "configs pass None and accumulate)",
                  "none: an upgrade (configs without fp8/fp4/kitchen/recipe pass None and "
                  "accumulate)", "", UPGRADE)


def module_policy(quantized: int) -> Remedy:
    if quantized:
        return Remedy("--policy module (needs Megatron-LM PR #7353)", None,
                      "apply Megatron-LM PR #7353 (still open upstream: no release has it) and "
                      "force these modules to bf16",
                      f"precision/speed: {quantized} module(s) run bf16 instead of quantized",
                      "costs precision and speed", PRECISION)
    return Remedy("--policy module (needs Megatron-LM PR #7353)", None,
                  "apply Megatron-LM PR #7353 (still open upstream: no release has it; check "
                  "with --policy module: this module runs high precision, so it would get None "
                  "and accumulate)",
                  "none: the modules already run bf16, PR #7353 stops tracking them", "",
                  UPGRADE)


def no_weight_cache(any_quantized: bool, config: ModelConfig | None = None) -> Remedy:
    """Passing None everywhere. Its cost is the weight cache it gives up: none in BF16 (nothing
    cached), none with primary quantized weights (`fp8_param`, from --fp8-param-gather: the
    parameter is already quantized and TE keeps no workspace for it), else re-quantizing every
    quantized weight on every microbatch instead of once per step."""
    setting = ("disable_parameter_transpose_cache", True)
    why = "every call passes is_first_microbatch=None and accumulates"
    if not any_quantized:
        return Remedy("no weight caching", setting, why,
                      "none here: no module runs quantized, so nothing is cached",
                      "no cost here: nothing runs quantized", FREE)
    if config is not None and (config.fp8_param or config.fp4_param) and not config.quant_recipe:
        return Remedy("no weight caching", setting, why,
                      "none here: the weights are primary quantized weights (fp8_param / "
                      "fp4_param, e.g. from --fp8-param-gather), which TE keeps no weight "
                      "cache for", "no cost here: primary quantized weights have no cache",
                      FREE)
    if config is None:
        return Remedy("no weight caching", setting, why,
                      "speed: every quantized weight is re-quantized on every microbatch (no "
                      "cached weight or transpose)", "costs speed: every call re-quantizes",
                      SPEED)
    params = _linear_params(config)
    traffic = _gib_of(params * REQUANTIZE_BYTES)
    return Remedy("no weight caching", setting, why,
                  f"speed: up to {_count(params)} quantized weights are re-quantized on every "
                  "microbatch instead of once per step (no cached weight or transpose): "
                  f"{_gib_text(traffic)} more memory traffic per microbatch",
                  f"costs {_gib_text(traffic)} more traffic per microbatch: re-quantizes up to "
                  f"{_count(params)} weights", PRICED, traffic)


def _unfused(config: ModelConfig | None, why: str, adds: str) -> Remedy:
    setting = ("gradient_accumulation_fusion", False)
    if config is None:
        return Remedy("no fused wgrad accumulation", setting, why,
                      f"speed and memory: every weight gradient goes through autograd's .grad "
                      f"{adds} (one extra gradient buffer and copy per weight)",
                      "costs speed and memory", SPEED)
    params = _linear_params(config)
    traffic = _gib_of(params * UNFUSED_BYTES)
    return Remedy("no fused wgrad accumulation", setting, why,
                  f"speed and memory: every weight gradient goes through autograd's .grad "
                  f"{adds} (one extra bf16 gradient buffer per weight while it is added): "
                  f"{_gib_text(traffic)} more memory traffic per microbatch",
                  f"costs {_gib_text(traffic)} more traffic per microbatch and a bf16 "
                  "gradient buffer", PRICED, traffic)


def unfused_accumulation(config: ModelConfig | None = None) -> Remedy:
    return _unfused(config, "unfused weight-gradient accumulation",
                    "and a hook adds it to main_grad")


def unfused_accumulation_fsdp(config: ModelConfig | None = None) -> Remedy:
    return _unfused(config, "Megatron-FSDP then adds the autograd gradient, which sums every call",
                    "before Megatron-FSDP adds it")


def grads_sharded() -> Remedy:
    return Remedy("gradients reduced after every microbatch",
                  ("data_parallel_sharding_strategy", "optim_grads"),
                  "main_grad is reduced after every microbatch",
                  "speed: one gradient reduce-scatter per microbatch instead of one per step",
                  "costs speed: a reduce-scatter per microbatch", SPEED)


def fix_line(config: ModelConfig, remedies: Iterable[Remedy]) -> str:
    """The remedies in order, each as the input would write it (where it goes included), why
    it helps and what it costs here; those needing a code change last, marked so."""
    parts = []
    for remedy in cheapest_first(remedies, config):
        if remedy.setting is None:  # an upgrade: its why says which
            parts.append("needs a Megatron change: " + remedy.why
                         + (f" ({remedy.short})" if remedy.short else ""))
        elif needs_code_change(config, remedy):
            key, value = remedy.setting
            parts.append(f"needs a code change: no Megatron-LM flag sets {key}; set it to "
                         f"{python_value(value)} on the TransformerConfig in "
                         f"{CONFIG_FROM_FLAGS} ({remedy.why}; {remedy.short})")
        elif (second := also_needed(config, remedy)) is not None:
            parts.append(f"only together with {refused_with(config, remedy)} off (upstream "
                         "refuses deferred embedding wgrad without fused accumulation): "
                         f"{written(config, *remedy.setting)} and {second} "
                         f"({remedy.why}; {remedy.short})")
        else:
            parts.append(f"{written(config, *remedy.setting)} ({remedy.why}; {remedy.short})")
    return "; or ".join(parts)
