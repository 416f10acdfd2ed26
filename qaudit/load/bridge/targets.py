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
