"""QA001's remedies, priced on one config and written in the input's own syntax.

The fix line (rule QA001) and `--suggest` (which re-audits each remedy) share this pricing, so
the two never disagree on which remedy is cheapest. The price is what a training team weighs
on this config: nothing, an upgrade of Megatron, speed, precision, extra gradient traffic and
memory, or extra parameters (weights, gradients and Adam state). Remedies are listed cheapest
first; ties keep the order they were offered in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from qaudit.load.config import ModelConfig
from qaudit.load.sources.megatron_flags import modelled_flags
from qaudit.plan.sizes import mtp_depth_params

# bf16 weight + fp32 main_grad + fp32 master weight + two fp32 Adam moments.
TRAINING_BYTES_PER_PARAM = 2 + 4 + 4 + 8

# Cost ranks, cheapest first.
FREE, UPGRADE, SPEED, PRECISION, MEMORY, PARAMETERS = range(6)


@dataclass(frozen=True)
class Remedy:
    name: str  # what --suggest calls it
    setting: tuple[str, Any] | None  # the config field and value it sets; None: an upgrade
    why: str  # why it helps, for the fix line
    cost: str  # --suggest's cost line
    short: str  # the fix line's cost ("" for an upgrade that costs nothing else)
    rank: int  # FREE .. PARAMETERS


def cheapest_first(remedies: Iterable[Remedy]) -> list[Remedy]:
    return sorted(remedies, key=lambda remedy: remedy.rank)  # stable: ties keep their order


def _count(params: int) -> str:
    return f"{params / 1e9:.2f} B" if params >= 10**9 else f"{params / 1e6:.1f} M"


def _gib(params: int) -> str:
    return f"{params * TRAINING_BYTES_PER_PARAM / 2**30:.1f} GiB"


def one_layer_per_depth(config: ModelConfig) -> Remedy:
    extra = max(config.mtp_depths - 1, 0) * mtp_depth_params(config)
    if extra == 0:
        cost, short, rank = ("none here: a single MTP depth adds no layer", "no cost here",
                             FREE)
    else:
        cost, short, rank = (f"memory: +{_count(extra)} parameters ({_gib(extra)} of weights, "
                             "gradients and Adam state before sharding); the depths no longer "
                             "share weights", f"costs +{_count(extra)} parameters, {_gib(extra)}",
                             PARAMETERS)
    return Remedy("one MTP layer per depth", ("mtp_use_repeated_layer", False),
                  "one MTP layer per depth", cost, short, rank)


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


def no_weight_cache(any_quantized: bool) -> Remedy:
    if any_quantized:
        cost, short, rank = ("speed: every quantized weight is re-quantized on every microbatch "
                             "(no cached weight or transpose)", "costs speed: every call "
                             "re-quantizes", SPEED)
    else:
        cost, short, rank = ("none here: no module runs quantized, so nothing is cached",
                             "no cost here: nothing runs quantized", FREE)
    return Remedy("no weight caching", ("disable_parameter_transpose_cache", True),
                  "every call passes is_first_microbatch=None and accumulates", cost, short,
                  rank)


def unfused_accumulation() -> Remedy:
    return Remedy("no fused wgrad accumulation", ("gradient_accumulation_fusion", False),
                  "unfused weight-gradient accumulation",
                  "speed and memory: every weight gradient goes through autograd's .grad and a "
                  "hook adds it to main_grad (one extra gradient buffer and copy per weight)",
                  "costs speed and memory", MEMORY)


def unfused_accumulation_fsdp() -> Remedy:
    return Remedy("no fused wgrad accumulation", ("gradient_accumulation_fusion", False),
                  "Megatron-FSDP then adds the autograd gradient, which sums every call",
                  "speed and memory: every weight gradient goes through autograd's .grad before "
                  "Megatron-FSDP adds it (one extra gradient buffer and copy per weight)",
                  "costs speed and memory", MEMORY)


def grads_sharded() -> Remedy:
    return Remedy("gradients reduced after every microbatch",
                  ("data_parallel_sharding_strategy", "optim_grads"),
                  "main_grad is reduced after every microbatch",
                  "speed: one gradient reduce-scatter per microbatch instead of one per step",
                  "costs speed: a reduce-scatter per microbatch", SPEED)


def fix_line(config: ModelConfig, remedies: Iterable[Remedy]) -> str:
    """The remedies cheapest first, each as the input would write it, why it helps and what
    it costs here."""
    parts = []
    for remedy in cheapest_first(remedies):
        if remedy.setting is None:  # an upgrade: its why says which
            parts.append(remedy.why + (f" ({remedy.short})" if remedy.short else ""))
        else:
            parts.append(f"{written(config, *remedy.setting)} ({remedy.why}; {remedy.short})")
    return "; or ".join(parts)


# --- the input's own syntax -------------------------------------------------------------

def route(config: ModelConfig) -> str:
    """How the user wrote the config: `bridge` (a ConfigContainer and its overrides), `flags`
    (a launch script or MODEL_ARGS file: Megatron's argv) or `yaml` (a TransformerConfig YAML)."""
    source = config.source
    if source is not None and source.origin == "bridge":
        return "bridge"
    if source is not None and source.argv is not None:
        return "flags"
    return "yaml"


def _yaml_value(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


# ConfigContainer sections holding a field other than `model` (qaudit/load/bridge/container.py).
_BRIDGE_SECTION = {"data_parallel_sharding_strategy": "ddp"}


def _flag(key: str, value: Any) -> str:
    """The launch-script edit that sets `key` to `value`."""
    switches = {}
    for flag, spec in modelled_flags().items():
        if spec.field != key:
            continue
        if spec.convert is None:
            switches[spec.value] = flag
        else:
            return f"pass {flag} {value}"
    if value in switches:
        return f"pass {switches[value]}"
    if switches:
        return f"drop {next(iter(switches.values()))}"
    return (f"no Megatron-LM flag sets {key}: set {key}={value} on the TransformerConfig "
            "your entry point builds")


def _override(config: ModelConfig, key: str, value: Any) -> str:
    """A Bridge `a.b=c` argument. Hydra refuses to set a key the file lacks without a prefix
    (a trimmed dump may lack one); `++` sets or adds, so it works either way."""
    file, line = config.where(key)
    present = line is not None or file != config.file
    prefix = "" if present else "++"
    return f"{prefix}{_BRIDGE_SECTION.get(key, 'model')}.{key}={_yaml_value(value)}"


def written(config: ModelConfig, key: str, value: Any) -> str:
    """`key` set to `value`, as the user would write it in this config's input."""
    kind = route(config)
    if kind == "bridge":
        return _override(config, key, value)
    if kind == "flags":
        return _flag(key, value)
    return f"set {key}: {_yaml_value(value)}"


def snippet(config: ModelConfig, key: str, value: Any) -> str:
    """What to paste for `--suggest`: a YAML key, a launch-script edit, or a Bridge override
    file section and the equivalent `model.x=y` argument."""
    kind = route(config)
    if kind == "bridge":
        section = _BRIDGE_SECTION.get(key, "model")
        return (f"{section}:\n  {key}: {_yaml_value(value)}\n"
                f"# or the override argument: {_override(config, key, value)}")
    if kind == "flags":
        return f"# {_flag(key, value)}"
    return f"{key}: {_yaml_value(value)}"
