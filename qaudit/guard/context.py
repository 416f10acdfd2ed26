"""What the guard says about the run it watches: the live config (as the fields rules read),
the Megatron and Transformer Engine running, and whether that Megatron re-arms the flag
(read from its own code, as `--megatron PATH` reads a checkout: never imported again)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from qaudit.errors import InputError


def live_config(session: Any) -> Any:
    """The model's TransformerConfig (every Megatron model chunk holds it as `.config`)."""
    for module in session.observer.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "num_layers"):
            return config
    return None


def describe(session: Any) -> dict[str, Any]:
    from qaudit.guard.verdict import model_config

    live = live_config(session)
    config = model_config(live)
    described: dict[str, Any] = {"config": config, "te": _te_words(), "megatron": None,
                                 "rearms": None, "policy": None}
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


def _megatron_root() -> Path | None:
    core = sys.modules.get("megatron.core")
    origin = getattr(core, "__file__", None)
    return Path(origin).resolve().parent.parent.parent if origin else None


def _te_words() -> str:
    te = sys.modules.get("transformer_engine")
    if te is None:
        return "no Transformer Engine imported"
    version = getattr(te, "__version__", "?")
    from qaudit.runtime.te_cpu import booted

    if booted():
        return f"Transformer Engine {version} Python on CPU (kernels: qaudit CPU stand-in)"
    return f"Transformer Engine {version}"
