"""What the guard says about the run it watches: the live config (as the fields rules read),
the Megatron and Transformer Engine running, and whether that Megatron re-arms the flag
(read from its own code, as `--megatron PATH` reads a checkout: never imported again)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import torch

from qaudit.errors import InputError
from qaudit.load.config import ModelConfig, fill_derived_defaults


def live_config(session: Any) -> Any:
    """The model's TransformerConfig (every Megatron model chunk holds it as `.config`)."""
    for module in session.observer.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "num_layers"):
            return config
    return None


def describe(session: Any) -> dict[str, Any]:
    live = live_config(session)
    config = model_config(live)
    te = sys.modules.get("transformer_engine")
    described: dict[str, Any] = {"config": config, "te": _te_words(), "megatron": None,
                                 "rearms": None, "policy": None, "launch": launch_kind(),
                                 "te_version": str(getattr(te, "__version__", "") or "")
                                 if te is not None else None}
    root = _megatron_root()
    if root is None:
        return described
    from qaudit.plan.upstream.target import resolve_megatron

    try:
        target = resolve_megatron(str(root))
    except InputError as exc:
        session.notes.append(f"the running Megatron's code could not be read: {exc}")
        return described
    # The code read is the one running: installed, not named by an option.
    described["megatron"] = dataclasses.replace(target, source="installed").to_dict()
    policy = target.behaviour.tracking_policy()
    described["rearms"] = policy.rearms(config)
    described["policy"] = policy
    return described


def launch_kind() -> str | None:
    """How the user set this run up, for the fix line's syntax: `bridge` (Megatron-Bridge's
    training loop ran), `flags` (Megatron-LM's own argument parser did), else None."""
    if "megatron.bridge" in sys.modules:
        return "bridge"
    if "megatron.training.arguments" in sys.modules:
        return "flags"
    return None


def _megatron_root() -> Path | None:
    core = sys.modules.get("megatron.core")
    origin = getattr(core, "__file__", None)
    return Path(origin).resolve().parent.parent.parent if origin else None


def _te_words() -> str:
    te = sys.modules.get("transformer_engine")
    if te is None:
        return "no Transformer Engine imported"
    version = getattr(te, "__version__", "?")
    from qaudit.runtime.standin.te_python import booted

    if booted():
        return f"Transformer Engine {version} Python on CPU (kernels: qaudit CPU stand-in)"
    return f"Transformer Engine {version}"


def model_config(live: Any) -> ModelConfig:
    """The live TransformerConfig's plain fields that rules read, over qaudit's defaults:
    attributes are read, nothing is called or imported."""
    known = {spec.name: spec for spec in dataclasses.fields(ModelConfig) if spec.init}
    values: dict[str, Any] = {}
    for name in (*_REQUIRED, *_READ_BY_RULES):
        value = getattr(live, name, None)
        value = getattr(value, "value", value)  # Megatron's enums (Fp8Recipe, ...)
        if name in known and isinstance(value, (bool, int, str)):
            values[name] = value
    for name in _REQUIRED:
        values.setdefault(name, 1)
    try:
        config = ModelConfig(**values)
    except (TypeError, ValueError):
        config = ModelConfig(**{name: values[name] for name in _REQUIRED})
    try:
        fill_derived_defaults(config)  # widths the live config left unset, as it derives them
    except InputError:
        pass  # a contradiction the running Megatron accepted: its widths stay as read
    return config


_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads")
_READ_BY_RULES = ("mtp_num_layers", "mtp_use_repeated_layer", "use_megatron_fsdp",
                  "data_parallel_sharding_strategy", "fp8_output_proj",
                  "gradient_accumulation_fusion", "disable_parameter_transpose_cache", "fp8",
                  "fp4", "use_kitchen",
                  # Widths: the fix line prices its remedies at the run's own sizes.
                  "ffn_hidden_size", "num_query_groups", "kv_channels", "gated_linear_unit",
                  "num_moe_experts", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                  "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                  "qk_pos_emb_head_dim", "v_head_dim")


def rank() -> int:
    """This process's rank in the job (0 before torch.distributed is set up)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0") or 0)
