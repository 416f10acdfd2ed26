"""What Bridge refuses at start-up about a ConfigContainer's DDP, checkpoint and precision
sections (issue 48): upstream's words, at the setting's line. The model-field refusals every
route shares are qaudit/load/upstream_checks.py's; docs/upstream-checks.md lists both, with
the upstream file, line and release each was read from.

- Megatron-FSDP saving or loading a checkpoint in another format than `fsdp_dtensor`:
  `ConfigContainer._validate_and_apply_megatron_fsdp_configs` asserts it (Megatron-Bridge
  0.6.2's wheel, src/megatron/bridge/training/config.py:1097-1101; main 067f987 has the same
  at 1105-1109; the command line's validate_args asserts it whenever Megatron-FSDP is on).
- `reuse_grad_buf_for_mxfp8_param_ag` without `fp8_param_gather`:
  `DistributedDataParallelConfig.__post_init__` (megatron-core 0.19.2,
  core/distributed/distributed_data_parallel_config.py:253-254). Bridge's
  `MixedPrecisionConfig.setup` copies both fields onto the DDP config (0.6.2,
  training/mixed_precision.py `update_config_with_precision_overrides`), so the section's
  values decide; under Megatron-FSDP Bridge turns the reuse off first (0.6.2, config.py:1090-1094).
"""

from __future__ import annotations

from typing import Any

from qaudit.errors import InputError
from qaudit.load.yamlio import YamlMap

Where = tuple[str, "int | None"]

FSDP_CHECKPOINT = "Megatron-FSDP requires the fsdp_dtensor checkpointing format!"
REUSE_WITHOUT_GATHER = "Reuse grad buffer only when keeping params in MXFP8."


def _refuse(at: Where, key: str, words: str, where: str) -> None:
    raise InputError(f"upstream refuses this at start-up: \"{words}\" ({where})", file=at[0],
                     line=at[1], key=key)


def refuse_at_startup(document: YamlMap, mapping: YamlMap, where,
                      precision: tuple[dict[str, Any], dict[str, Where]] | None) -> None:
    """`mapping`: the model fields as flattened (Megatron-FSDP resolved from ddp/dist);
    `precision`: the mixed_precision section's finalized values and where each was set."""
    ddp = document.get("ddp") if isinstance(document.get("ddp"), YamlMap) else YamlMap()
    fsdp = mapping.get("use_megatron_fsdp") is True
    checkpoint = document.get("checkpoint")
    if fsdp and isinstance(checkpoint, YamlMap) and (
            checkpoint.get("save") is not None or checkpoint.get("load") is not None):
        ckpt_format = checkpoint.get("ckpt_format", "torch_dist")
        if ckpt_format != "fsdp_dtensor":
            at = where("checkpoint.ckpt_format", checkpoint, "ckpt_format") \
                if "ckpt_format" in checkpoint else where("checkpoint", document, "checkpoint")
            _refuse(at, "checkpoint.ckpt_format", FSDP_CHECKPOINT,
                    "Megatron-Bridge ConfigContainer validation, training/config.py:1099 in "
                    "0.6.2, with Megatron-FSDP and a checkpoint to save or load")
    if fsdp:
        return  # Bridge deactivates the buffer reuse under Megatron-FSDP
    reuse_name, gather_name = "reuse_grad_buf_for_mxfp8_param_ag", "fp8_param_gather"
    if precision is not None:
        values, at_of = precision
        reuse, gather = values.get(reuse_name), values.get(gather_name)
        at = at_of.get(gather_name) if reuse and not gather else None
        key = f"mixed_precision.{gather_name}"
    else:
        reuse, gather = ddp.get(reuse_name), ddp.get(gather_name)
        at = where(f"ddp.{reuse_name}", ddp, reuse_name) if reuse and not gather else None
        key = f"ddp.{reuse_name}"
    if at is not None:
        _refuse(at, key, REUSE_WITHOUT_GATHER, "DistributedDataParallelConfig.__post_init__, "
                "core/distributed/distributed_data_parallel_config.py:254, megatron-core 0.19.2")
