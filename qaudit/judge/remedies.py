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
written (docs/usage.md, "Remedies and their prices"), not a measurement. A cost paid once per
optimizer step counts in full, so it is an upper bound on its per-microbatch share. Ties keep
the order the remedies were offered in.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from qaudit.load.config import ModelConfig
from qaudit.load.sources.megatron_flags import modelled_flags
from qaudit.plan.sizes import model_params, mtp_depth_params

# bf16 weight + fp32 main_grad + fp32 master weight + two fp32 Adam moments.
TRAINING_BYTES_PER_PARAM = 2 + 4 + 4 + 8
# Re-quantizing one weight element: read bf16 (2), write the quantized copy and its
# transpose (1 + 1).
REQUANTIZE_BYTES = 2 + 1 + 1
# Unfused accumulation: the wgrad GEMM writes a bf16 .grad (2) that the hook reads back (2)
# before adding it to main_grad, which the fused GEMM does in place.
UNFUSED_BYTES = 2 + 2
# Where Megatron-LM builds the TransformerConfig from its flags: a field with no flag is set
# there (or in the model provider of the entry point).
CONFIG_FROM_FLAGS = ("core_transformer_config_from_args (megatron/training/argument_utils.py) "
                     "or your entry point's model provider")

# Cost ranks, cheapest first. PRICED remedies sort among themselves by `price`.
FREE, UPGRADE, PRICED, SPEED, PRECISION = range(5)
# Kept for callers that name the old ranks.
MEMORY = PARAMETERS = PRICED


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
        and _flag_for(*remedy.setting) is None


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
                         f"{_python_value(value)} on the TransformerConfig in "
                         f"{CONFIG_FROM_FLAGS} ({remedy.why}; {remedy.short})")
        else:
            parts.append(f"{written(config, *remedy.setting)} ({remedy.why}; {remedy.short})")
    return "; or ".join(parts)


# --- the input's own syntax and place --------------------------------------------------------

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


def _python_value(value: Any) -> str:
    return repr(value)


# ConfigContainer sections holding a field other than `model` (qaudit/load/bridge/container.py).
_BRIDGE_SECTION = {"data_parallel_sharding_strategy": "ddp"}


@lru_cache(maxsize=32)
def _lines(path: str) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text(encoding="utf-8", errors="replace").splitlines())
    except OSError:
        return ()


def _under_model(config: ModelConfig) -> bool:
    """Whether a TransformerConfig YAML nests its fields under `model:` (the loader's only
    nesting): the first field's line is indented, or is the `model:` line itself (flow style)."""
    source = config.source
    if source is None or not source.mapping.key_lines:
        return False
    lines = _lines(str(source.path))
    first = min(source.mapping.key_lines.values())
    if not 0 < first <= len(lines):
        return False
    text = lines[first - 1]
    return text[:1].isspace() or text.lstrip().startswith("model:")


def _flag_for(key: str, value: Any) -> tuple[str, str] | None:
    """("pass", flag) for a switch storing `value`, ("pass", flag + value) for a valued flag,
    ("drop", flag) where only the opposite switch exists, None where no flag sets `key`."""
    switches = {}
    for flag, spec in modelled_flags().items():
        if spec.field != key:
            continue
        if spec.convert is None:
            switches.setdefault(spec.value, flag)
        else:
            return "value", flag
    if value in switches:
        return "pass", switches[value]
    if switches:
        return "drop", next(iter(switches.values()))
    return None


def _word_of(config: ModelConfig, flag: str):
    """The argv word that passes `flag`, where the file's line holds it literally."""
    source = config.source
    lines = _lines(str(source.path))
    for word in source.argv or ():
        text = getattr(word, "text", "")
        line = getattr(word, "line", None)
        if (text == flag or text.startswith(flag + "=")) and line and 0 < line <= len(lines) \
                and flag in lines[line - 1]:
            return word
    return None


def _anchor(config: ModelConfig):
    """The first flag of the command that the file's own line holds: a new flag goes before
    it, where the shell and argparse take it as one more argument."""
    source = config.source
    lines = _lines(str(source.path))
    for word in source.argv or ():
        text = getattr(word, "text", "")
        line = getattr(word, "line", None)
        if text.startswith("--") and "=" not in text and line and 0 < line <= len(lines) \
                and text in lines[line - 1].split():
            return word
    return None


def _model_args(config: ModelConfig) -> bool:
    return config.source is not None and config.source.path.suffix in (".yaml", ".yml")


def _flag(config: ModelConfig, key: str, value: Any) -> str:
    """The launch-script or MODEL_ARGS edit that sets `key` to `value`, and where."""
    how = _flag_for(key, value)
    if how is None:
        return (f"no Megatron-LM flag sets {key}: set {key}={_python_value(value)} on the "
                f"TransformerConfig in {CONFIG_FROM_FLAGS}")
    kind, flag = how
    present = _word_of(config, flag)
    if _model_args(config):
        if kind == "drop":
            where = f" at line {present.line}" if present else ""
            return f"remove {flag} from MODEL_ARGS{where}"
        entry = f"{flag}: {_yaml_value(value) if kind == 'value' else 'true'}"
        if present is not None:
            return f"set {entry} in MODEL_ARGS at line {present.line}"
        return f"add {entry} to MODEL_ARGS"
    if kind == "drop":
        where = f" at line {present.line}" if present else ""
        return f"remove {flag} from the launch command{where}"
    words = f"{flag} {value}" if kind == "value" else flag
    if kind == "value" and present is not None:
        return f"change {flag}'s value to {value} at line {present.line}"
    anchor = _anchor(config)
    if anchor is None:
        return f"add {words} to the launch command"
    return f"add {words} before {anchor.text} at line {anchor.line}"


def _override(config: ModelConfig, key: str, value: Any) -> str:
    """A Bridge `a.b=c` argument. Hydra refuses to set a key the file lacks without a prefix
    (a trimmed dump may lack one); `++` sets or adds, so it works either way."""
    file, line = config.where(key)
    present = line is not None or file != config.file
    prefix = "" if present else "++"
    return f"{prefix}{_BRIDGE_SECTION.get(key, 'model')}.{key}={_yaml_value(value)}"


def written(config: ModelConfig, key: str, value: Any) -> str:
    """`key` set to `value`, as the user would write it in this config's input and where."""
    kind = route(config)
    if kind == "bridge":
        return _override(config, key, value)
    if kind == "flags":
        return _flag(config, key, value)
    place = " under model:" if _under_model(config) else ""
    return f"set {key}: {_yaml_value(value)}{place}"


def snippet(config: ModelConfig, key: str, value: Any) -> str:
    """What to paste for `--suggest`: a YAML key (under `model:` where the file nests), a
    launch-script or MODEL_ARGS edit, or a Bridge override file section and the equivalent
    `model.x=y` argument."""
    kind = route(config)
    if kind == "bridge":
        section = _BRIDGE_SECTION.get(key, "model")
        return (f"{section}:\n  {key}: {_yaml_value(value)}\n"
                f"# or the override argument: {_override(config, key, value)}")
    if kind == "flags":
        prefix = "# needs a code change: " if _flag_for(key, value) is None else "# "
        return prefix + _flag(config, key, value)
    if _under_model(config):
        return f"model:\n  {key}: {_yaml_value(value)}"
    return f"{key}: {_yaml_value(value)}"
