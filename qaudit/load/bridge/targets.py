"""The class each ConfigContainer section the audit reads must name (issue 48).

Bridge instantiates every `_target_` of its YAML (hydra's `instantiate` on `to_yaml`'s
output): a section naming another class would run that class, whatever fields sit beside it.
qaudit reads the fields as the class Bridge's section holds and never imports anything, so a
`_target_` that is not that class (`mixed_precision: {_target_: os.system, ...}` in a file, or
`++mixed_precision={_target_: os.system}` as an argument) is refused at the line or argument
that wrote it, instead of being audited as if Bridge's class were there.

Matched by name only: the class's own name and a module under `megatron.` (Bridge, or the
megatron-core class a Bridge section holds, under any of the paths it is exported from).
"""

from __future__ import annotations

from qaudit.errors import InputError
from qaudit.load.bridge.nodes import short_name
from qaudit.load.yamlio import YamlMap, short_repr

Where = tuple[str, "int | None"]

# ConfigContainer field -> the class names Bridge 0.6.2's ConfigContainer declares there
# (training/config.py; ddp: megatron-core's DistributedDataParallelConfig or Bridge's own).
SECTION_CLASSES: dict[str, tuple[str, ...]] = {
    "mixed_precision": ("MixedPrecisionConfig",),
    "comm_overlap": ("CommOverlapConfig",),
    "ddp": ("DistributedDataParallelConfig",),
    "dist": ("DistributedInitConfig",),
    "optimizer": ("OptimizerConfig",),
}
_MODULE = "megatron."


def _expected(section: str, target: str) -> bool:
    if not target.startswith(_MODULE):
        return False
    name = short_name(target)
    if section == "model":  # a model provider, or a TransformerConfig-style dataclass
        return name.endswith(("Provider", "Config"))
    if section == "":  # the container itself
        return name.endswith("ConfigContainer")
    return name in SECTION_CLASSES[section]


def _describe(section: str) -> str:
    if section == "model":
        return "a model provider (a megatron.bridge ...ModelProvider)"
    if section == "":
        return "a ConfigContainer"
    return f"Bridge's {SECTION_CLASSES[section][0]}"


def refuse_foreign_targets(document: YamlMap, display: str, origins: dict[str, Where],
                           overridden_only: bool = False) -> None:
    """Each section's `_target_` (and the container's) must be the class Bridge holds there.
    `overridden_only`: check only what overrides wrote (a live object's classes are its own)."""
    for section in ("", "model", *SECTION_CLASSES):
        node = document if section == "" else document.get(section)
        if not isinstance(node, YamlMap) or "_target_" not in node:
            continue
        key = f"{section}._target_" if section else "_target_"
        written = origins.get(key) or origins.get(section)
        if overridden_only and written is None:
            continue
        target = node["_target_"]
        if isinstance(target, str) and _expected(section, target):
            continue
        file, line = written or (display, node.line_of("_target_"))
        what = short_repr(target) if isinstance(target, str) else f"{short_repr(target)} (not " \
            "a class path)"
        raise InputError(f"{section or 'the config'} names {what}, not {_describe(section)}: "
                         "Bridge would import and instantiate that target at start-up; qaudit "
                         "never imports what an input names, and does not audit a section as "
                         "a class it is not", file=file, line=line, key=key)


# The fields of the sections whose values the audit reads, besides the model: a key there
# that is no field would be ignored here, while Bridge's instantiate of the section's class
# fails on it (an unexpected keyword argument). MixedPrecisionConfig: Bridge 0.6.2's
# training/mixed_precision.py (qaudit/load/bridge/mixed_precision.py DEFAULTS holds each);
# CommOverlapConfig: training/comm_overlap.py (main 067f987; every corpus dump's keys agree).
COMM_OVERLAP_FIELDS = frozenset({
    "tp_comm_overlap", "tp_comm_overlap_cfg", "tp_comm_bootstrap_backend", "overlap_p2p_comm",
    "batch_p2p_comm", "overlap_grad_reduce", "overlap_param_gather",
    "overlap_param_gather_with_optimizer_step", "align_param_gather", "bucket_size",
    "defer_embedding_wgrad_compute", "wgrad_deferral_limit", "data_parallel_size",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
})


def refuse_unknown_fields(document: YamlMap, display: str, origins: dict[str, Where]) -> None:
    """A key of `mixed_precision` or `comm_overlap` (as a class node, written in a file) that
    is no field of the class: exit 2 at its line, with the nearest field. Keys an override
    adds are Bridge's business (_apply_overrides skips them with a warning)."""
    from qaudit.load.bridge.mixed_precision import DEFAULTS
    from qaudit.load.bridge.nodes import NODE_KEYS
    from qaudit.load.yamlio import did_you_mean

    for section, known in (("mixed_precision", frozenset(DEFAULTS)),
                           ("comm_overlap", COMM_OVERLAP_FIELDS)):
        node = document.get(section)
        if not isinstance(node, YamlMap):
            continue
        for key in node:
            if key in known or key in NODE_KEYS or f"{section}.{key}" in origins:
                continue
            hint = did_you_mean(key, known) if isinstance(key, str) else ""
            raise InputError(f"not a field of {_describe(section)}{hint}: Bridge's instantiate "
                             "of the section fails on it at start-up (an unexpected keyword "
                             "argument), and nothing here would read it", file=display,
                             line=node.line_of(key), key=f"{section}.{key}")
