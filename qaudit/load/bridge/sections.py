"""The ConfigContainer sections besides `model` and `mixed_precision`: which keys can change a
verdict, and where Bridge puts them on the model.

- `ddp` (Megatron's DistributedDataParallelConfig) and `dist` (Bridge's DistributedInitConfig):
  Megatron-FSDP and its sharding strategy are modelled (qaudit/run/fsdp.py);
  FSDP2, overlapped reduction/gathering and buffer reuse are named (QA090).
- `comm_overlap` (CommOverlapConfig): its `setup()` writes delay_wgrad_compute,
  overlap_moe_expert_parallel_comm, defer_embedding_wgrad_compute and tp_comm_overlap onto the
  model (False when the section leaves them null; tp_comm_overlap only with TP >= 2 and
  sequence parallelism), and its non-null overlap_* values over the DDP ones (with the
  distributed optimizer). Bridge v0.6.0 `training/comm_overlap.py`.
- Everything else (SKIPPED_SECTIONS: dataset, logger, tokenizer, scheduler, checkpoint, rng,
  train, profiling, validation, env_vars...) cannot change which TE modules run, how often,
  or how their gradients land: deliberately not read. Any other top-level key is refused.
"""

from __future__ import annotations

from typing import Any

from qaudit.load.yamlio import YamlMap

# ConfigContainer sections deliberately not read: none can change which TE modules run, how
# often, or how their gradients land (docs/bridge.md lists them; a test holds the list against
# this set and qaudit/load/bridge SECTIONS). `distill`/`kd_config` (a distillation teacher) are
# a second model: only the student is audited, as on the launch-script route.
SKIPPED_SECTIONS = frozenset({
    "train", "validation", "optimizer_config_override_provider", "scheduler", "dataset",
    "data", "logger", "tokenizer", "checkpoint", "rng", "profiling", "rerun_state_machine",
    "straggler", "nvrx_straggler", "ft", "inprocess_restart", "env_vars", "tensor_inspect",
    "distill", "kd_config",
})
# Sections read: the model, what Bridge copies onto it (mixed_precision, comm_overlap), the
# DDP/dist settings, the optimizer's settings shown to change nothing (QA091) and peft (named).
READ_SECTIONS = frozenset({"model", "mixed_precision", "comm_overlap", "ddp", "dist",
                           "optimizer", "peft"})

# DDP / dist keys named in QA090 when on: (section, key) -> why. The overlap switches are
# read and shown to change nothing (qaudit/load/unmodelled.py NO_EFFECT, QA091).
NAMED_DDP = {
    "reuse_grad_buf_for_mxfp8_param_ag": (
        "the MXFP8 parameter all-gather reuses the gradient buffer between steps; not modelled"),
    "keep_fp8_transpose_cache": "FSDP's FP8 transpose cache is not modelled",
    "delay_wgrad_compute": ("DDP's delayed weight-gradient hooks are not modelled (the model's "
                            "delay_wgrad_compute is)"),
}
# Whole sections whose presence changes the modules or their gradients.
NAMED_SECTIONS = {
    "peft": ("PEFT adapters (LoRA...) add linears and freeze the base weights; not modelled: "
             "the base model is audited as if fully trained"),
}
NAMED_DIST = {
    "use_torch_fsdp2": (
        "FSDP2: TE keeps no quantized weight cache (no workspace key), so the flag never "
        "reuses a stale weight, while its weight-gradient decision still follows the flag; "
        "audited without FSDP2"),
}
# comm_overlap.setup(): model fields it sets (None in the section means False).
COMM_OVERLAP_MODEL_FIELDS = ("delay_wgrad_compute", "overlap_moe_expert_parallel_comm",
                             "defer_embedding_wgrad_compute")
COMM_OVERLAP_DDP_FIELDS = ("overlap_grad_reduce", "overlap_param_gather")


def section(document: YamlMap, name: str) -> YamlMap | None:
    value = document.get(name)
    return value if isinstance(value, YamlMap) else None


def is_on(value: Any) -> bool:
    return bool(value) and not isinstance(value, (dict, list)) or (
        isinstance(value, (dict, list)) and bool(value))
