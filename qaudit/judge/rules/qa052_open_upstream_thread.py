"""QA052: the config uses a feature with an open upstream gradient-loss bug: no release (or
known commit) has a fix, so the audit names the thread and leaves the check to the guard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.rules._upstream_threads import (megatron_package, setting_on,
                                                  setting_value)

GUARD = ("run qaudit guard -- LAUNCH_COMMAND on the real job: it watches every main_grad "
         "write of the first step and stops before the optimizer when one is lost")
_GTP = ("tensor_parallel_num_weight_shards", "expert_tensor_parallel_num_weight_shards",
        "gtp_weight_remat_size", "expert_gtp_weight_remat_size")
Where = tuple[str | None, int | None]


@dataclass(frozen=True)
class Thread:
    name: str  # the thread, as upstream numbers it
    applies: Callable[[AuditFacts], Where | None]  # the setting that turns the feature on
    message: str
    fix: str
    check: str = GUARD  # how to check the run


def _tied_te_weight_delayed(facts: AuditFacts) -> Where | None:
    config = facts.config
    if not (config.delay_wgrad_compute and not config.gradient_accumulation_fusion
            and config.share_embeddings_and_output_weights):
        return None
    te = set(facts.te_modules)
    if not any(name.rsplit(".", 1)[-1] == "output_layer" and name in te for name in te):
        return None  # the tied output layer is Megatron's own linear: one TE user at most
    return config.where("delay_wgrad_compute")


def _gtp_with_mtp(facts: AuditFacts) -> Where | None:
    if not facts.config.mtp_num_layers:
        return None
    for name in _GTP:
        on, file, line = setting_on(facts.config, name)
        if on:
            return file, line
    return None


def _fsdp_v2(facts: AuditFacts) -> Where | None:
    """Megatron-FSDP v2 (`megatron_fsdp_version: 2`), which only Megatron-LM after the 0.19
    releases has (main as read: d98e8a64)."""
    config = facts.config
    key = megatron_package(facts.megatron)
    if not config.use_megatron_fsdp or (key is not None and key < (0, 20, 0)):
        return None
    value, file, line = setting_value(config, "megatron_fsdp_version")
    if str(value).strip() != "2":
        return None
    return file, line


def _fsdp_v2_delayed_wgrad(facts: AuditFacts) -> Where | None:
    return _fsdp_v2(facts) if facts.config.delay_wgrad_compute else None


def _fsdp_v2_hybrid(facts: AuditFacts) -> Where | None:
    value, _, _ = setting_value(facts.config, "num_distributed_optimizer_instances")
    try:
        hybrid = int(str(value)) > 1
    except ValueError:
        hybrid = False
    return _fsdp_v2(facts) if hybrid else None


def _bridge_mtp(facts: AuditFacts) -> Where | None:
    config = facts.config
    if not config.mtp_num_layers or config.source is None or config.source.origin != "bridge":
        return None
    return config.where("mtp_num_layers")


THREADS = (
    Thread("TE issue #3437 (PR #3552, open)", _tied_te_weight_delayed,
           "TE modules that share one weight do not add up its gradient with "
           "delay_wgrad_compute and fused accumulation off: each backward_dw writes the "
           "shared weight's gradient instead of adding to it",
           "gradient_accumulation_fusion: true, or delay_wgrad_compute: false, until a TE "
           "release has PR #3552"),
    Thread("Megatron-LM PR #7573 (open)", _gtp_with_mtp,
           "with distributed (GTP) weights and MTP, the output layer's first backward of an "
           "iteration overwrites the weight gradient the MTP heads add to",
           "no GTP weight sharding while MTP is on, until Megatron-LM has PR #7573"),
    Thread("Megatron-LM PR #6697 (merged after main as read, d98e8a64)",
           _fsdp_v2_delayed_wgrad,
           "Megatron-FSDP v2 here does not wait for TE's delayed weight gradients "
           "(backward_dw): it reduces the buckets before those gradients are written",
           "a Megatron-LM with PR #6697, or delay_wgrad_compute: false"),
    Thread("Megatron-LM PR #7186 (merged after main as read, d98e8a64)", _fsdp_v2_hybrid,
           "Megatron-FSDP v2 with hybrid data parallelism: no_sync is a no-op here, every "
           "backward finalizes the accumulation buffer and the next microbatch clears it, so "
           "only the last microbatch's gradient reaches the optimizer",
           "a Megatron-LM with PR #7186, or megatron_fsdp_version 1"),
    Thread("Megatron-Bridge issue #6103 (PR #6105, open)", _bridge_mtp,
           "Bridge's gpt_step does not hand loss_mask to the model, so Megatron computes the "
           "MTP loss, and its gradient, over every position: padding and, in answer-only "
           "SFT, the prompt",
           "a Bridge with PR #6105, or a forward step that passes loss_mask to the model",
           "read the forward step the run uses (Bridge's gpt_step._forward_step_common): "
           "loss_mask must be among the model's arguments; the guard does not see a loss"),
)


@rule("QA052", "warning", "the config uses a feature with an open upstream gradient bug")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """The config turns on a feature for which upstream has an open gradient-loss thread:
    a weight gradient overwritten, dropped or computed over the wrong tokens in code that no
    release qaudit knows (and no known Megatron-LM commit) has fixed, or fixed only after
    the Megatron the verdict is for. qaudit does not model these code paths, so it names the
    thread where the config uses the feature and leaves the check to the guard, which watches
    the real run's main_grad writes (for Bridge #6103, a loss rather than a write, to
    reading the forward step). The threads and what turns each on:

    - TE issue #3437 (PR #3552 open): TE modules sharing one weight, `delay_wgrad_compute`
      with `gradient_accumulation_fusion` off: the delayed wgrad writes the shared weight's
      gradient instead of adding. Where the tied output layer is a TE module.
    - Megatron-LM PR #7573 (open): distributed (GTP) weights with MTP: the output layer's
      first backward of an iteration overwrites.
    - Megatron-LM PR #6697: Megatron-FSDP v2 did not wait for TE's `backward_dw`
      (`delay_wgrad_compute`); merged after main as qaudit read it.
    - Megatron-LM PR #7186: Megatron-FSDP v2 with hybrid data parallelism
      (`num_distributed_optimizer_instances` > 1): `no_sync` a no-op, only the last
      microbatch's gradient reaches the optimizer; merged after main as read.
    - Megatron-Bridge issue #6103 (PR #6105 open): MTP in a Bridge dump: `gpt_step` does
      not pass `loss_mask`, so the MTP loss and gradient cover padding.

    Megatron-FSDP v2 (`megatron_fsdp_version: 2`) exists only in Megatron-LM after the 0.19
    releases, so those threads apply where the verdict is for main, a known commit or a
    checkout from then. Three threads of the same family have no setting in any release or
    known commit. Two are left to the guard (QA007, a write no modelled cause explains):
    Megatron-LM PR #6943 (open: the MoE router's FP32 weight gradient fused into
    `main_grad` through TE's `general_gemm`, which the guard wraps, into a buffer it
    watches) and issue #6942 with its open PR #7101 (Megatron-FSDP v2 writing TE's fused
    wgrad into its reduce-scatter buffers, which must keep TE's first-microbatch overwrite
    away from MTP and the output layer; main as read has v2 copy each gradient instead).
    The third, PR #6279 (dev branch: DSA's custom wgrad copies into `main_grad` with
    `main_grad.copy_()` when `is_first_microbatch` is True), writes outside every GEMM entry
    point the guard wraps: neither the audit nor the guard can check it today.

    Fix: per thread, the setting that avoids the path, or the upstream release that has the
    fix once there is one; check the run with `qaudit guard`.
    """
    if facts.observed:  # the guard judges the writes it saw, not the config's features
        return
    for thread in THREADS:
        where = thread.applies(facts)
        if where is None:
            continue
        file, line = where
        yield Hit(file=file or facts.config.file, line=line,
                  message=f"{thread.name}: {thread.message}; qaudit does not model this path",
                  fix=f"{thread.fix}; to check: {thread.check}")
