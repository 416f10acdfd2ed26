"""QA001: a module called several times per microbatch overwrites its own gradients."""

from __future__ import annotations

from typing import Iterable

from qaudit.load.config import ModelConfig
from qaudit.model.probe import CallRecord
from qaudit.judge import remedies
from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.run.fsdp import FsdpGrads


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def _cause(config: ModelConfig, module: str, fsdp_loss: bool,
           repeated: bool) -> tuple[str, str | None, int | None]:
    """The config key that makes this module lose gradients (run more than once, or
    Megatron-FSDP), and the file and line that set it (a Bridge override file's, when one
    did)."""
    if fsdp_loss:
        keys = ("mtp_num_layers", "use_megatron_fsdp") if repeated else (
            "data_parallel_sharding_strategy", "use_megatron_fsdp")
    elif module.startswith("mtp.") and config.mtp_use_repeated_layer:
        keys = ("mtp_use_repeated_layer", "mtp_num_layers")
    elif module == "output_layer":
        keys = ("fp8_output_proj", "mtp_num_layers")
    else:
        keys = ("mtp_num_layers", "gradient_accumulation_fusion")
    for key in keys:
        file, line = config.where(key)
        if line is not None or file != config.file:
            return key, file, line
    return keys[0], config.file, None


def _fsdp_fix(config: ModelConfig, module: str, repeated: bool, drained: bool) -> str:
    """Megatron-FSDP overwrites on every backward: only unfused accumulation (Megatron-FSDP
    then adds autograd's gradient, which sums every call) or fewer writes per buffer help."""
    options = []
    if repeated and module.startswith("mtp.") and config.mtp_use_repeated_layer:
        options.append(remedies.one_layer_per_depth(config))
    if not repeated and not drained:
        options.append(remedies.grads_sharded())
    options.append(remedies.unfused_accumulation_fsdp(config))
    return remedies.fix_line(config, options)


def _fix(config: ModelConfig, module: str, policy: str, stale: bool, high_precision: bool,
         any_quantized: bool) -> str:
    """Every remedy that applies, cheapest on this config first (the pricing --suggest uses,
    qaudit/judge/remedies.py)."""
    options = []
    if module.startswith("mtp.") and config.mtp_use_repeated_layer:
        options.append(remedies.one_layer_per_depth(config))
    if module == "output_layer":
        options.append(remedies.own_output_layer())
    if stale:
        options.append(remedies.megatron_main())
    elif high_precision and policy != "module":
        options.append(remedies.module_policy(0))
    options.append(remedies.no_weight_cache(any_quantized, config))
    options.append(remedies.unfused_accumulation(config))
    return remedies.fix_line(config, options)


def _when(lossy: list[CallRecord], steps: int, observed: bool = False) -> str:
    lossy_steps = sorted({r.step for r in lossy})
    microbatches = sorted({r.microbatch for r in lossy})
    mbs = ", ".join(str(m) for m in microbatches)
    if observed:  # the guard: what the watched steps showed, no claim about later ones
        return (f"on microbatch {mbs} of watched step(s) "
                f"{', '.join(str(s + 1) for s in lossy_steps)} of {steps}")
    if lossy_steps == [0] and steps > 1:
        return (f"on microbatch {mbs} of the first step only: the flag is never re-armed in this "
                "config, so the loss repeats on the first step after every start or resume")
    if len(lossy_steps) == steps:
        return f"on microbatch {mbs} of every step"
    return f"on microbatch {mbs} of step(s) {', '.join(str(s) for s in lossy_steps)}"


@rule("QA001", "error", "repeated module overwrites its own main_grad")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """A module runs more than once per microbatch with fused wgrad accumulation, and the
    backward of one call overwrites `main_grad` (beta 0) after other calls of the same
    microbatch had already written their gradient into it. Their contribution is lost
    silently: the optimizer sees only the overwriting call's gradient.

    TE decides per call: `is_first_microbatch=True` at a grad-enabled forward means
    "overwrite" in backward; Megatron passes True to the first call after re-arming. With a
    repeated MTP layer the first depth gets True and, since depth 2 consumes depth 1, its
    backward runs last. Under Megatron-FSDP every backward overwrites: TE's through the
    `overwrite_main_grad` it sets (any strategy but `no_shard`), Megatron's own linears (the
    output layer, which MTP calls once per depth) through `__fsdp_param__` (every strategy).
    With `no_shard` or `optim` the buffer is reduced only after the last microbatch, so a
    module run once per microbatch loses the earlier microbatches too (qaudit/run/fsdp.py).

    Fixes: change the run so the module runs once per microbatch (no repeated MTP layer,
    Megatron's own output layer); use a Megatron that passes None to it, where one exists (PR
    #6965 for BF16 configs, PR #7353 for high-precision modules); pass None
    (`disable_parameter_transpose_cache`) or turn fused accumulation off. Those the input can
    say come first, cheapest on this config first, priced as --suggest prices them, in the
    input's own syntax and place; those needing a code change follow, marked so.
    """
    steps = max((r.step for records in facts.records.values() for r in records), default=0) + 1
    rows = {row.name: row for row in facts.rows}
    any_quantized = any(row.precision not in ("bf16", "-") for row in facts.rows)
    for module, records in facts.records.items():
        lossy = [r for r in records if r.lossy]
        if not lossy:
            continue
        row = rows[module]
        first = lossy[0]
        same_mb = [r for r in records if r.grad and (r.step, r.microbatch) == (first.step, first.microbatch)]
        config = facts.config
        fsdp = FsdpGrads.of(config.use_megatron_fsdp, config.data_parallel_sharding_strategy)
        repeated = row.calls_per_microbatch > 1
        # The attribute alone is not enough: TE 2.9-2.14's LayerNormLinear and GroupedLinear
        # ignore it under FP8/FP4 (qaudit/plan/upstream/te.py), and then the flag decides.
        # Megatron's own linears overwrite a Megatron-FSDP parameter's buffer whatever it has.
        own_linear = module not in facts.te_modules and fsdp.fsdp_params
        fsdp_loss = row.accumulation == "overwrite-always" and (
            own_linear or facts.overwrite_main_grad.get(module, False))
        if not fsdp_loss and first.flag is not True:
            continue  # neither cause explains this overwrite: QA007's, observed in a run
        if fsdp_loss:
            writer = ("Megatron's own linear writes its wgrad GEMM's output into the "
                      "Megatron-FSDP parameter's main_grad (out=main_grad, no accumulate)"
                      if own_linear
                      else "its weight has overwrite_main_grad (set by Megatron-FSDP)")
            if fsdp.drained_each_backward:
                why = (f"{writer}, so every backward overwrites main_grad and only the last of "
                       f"the {len(same_mb)} backwards of a microbatch survives")
            else:
                why = (f"{writer}, so every backward overwrites main_grad, and "
                       f"data_parallel_sharding_strategy {config.data_parallel_sharding_strategy}"
                       " reduces it only after the step's last microbatch: only the step's "
                       "last backward survives")
        else:
            why = (f"call {first.call} gets is_first_microbatch={first.flag}, so its backward "
                   f"(the {_ordinal(first.backward_seq)} of {len(same_mb)}) overwrites main_grad "
                   "and discards what the other calls accumulated")
        key, file, line = _cause(config, module, fsdp_loss, repeated)
        stale = row.tracked == "stale"
        message = (f"{module}: called {row.calls_per_microbatch}x per microbatch; {why}; "
                   f"gradient lost {_when(lossy, steps, facts.observed)} ({key})")
        fix = (_fsdp_fix(config, module, repeated, fsdp.drained_each_backward) if fsdp_loss
               else _fix(config, module, facts.policy.name, stale, row.precision == "bf16",
                         any_quantized))
        yield Hit(module=module, message=message, file=file, line=line, fix=fix)
