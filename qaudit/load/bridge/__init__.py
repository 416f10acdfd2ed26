"""Megatron-Bridge ConfigContainer YAML: what `run_recipe.py --dry-run`,
`logger.save_config_filepath` and every Bridge checkpoint's `run_config.yaml` hold
(docs/bridge.md). One reader: the file (plus override files and `a.b=c` arguments, merged as
Bridge merges them) becomes the same ModelConfig and QuantRecipe the other readers produce.
Nothing the file names is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from qaudit.errors import InputError
from qaudit.load.bridge.container import Flat, container_kind, flatten
from qaudit.load.bridge.mixed_precision import RecipeTable
from qaudit.load.bridge.overrides import Override, apply_overrides
from qaudit.load.bridge.quant_recipe import recipe_from_node
from qaudit.load.bridge.hydra_values import as_upstream_runs
from qaudit.load.bridge.targets import refuse_foreign_targets, refuse_unknown_fields
from qaudit.load.config import ConfigSource, ModelConfig, SourceNote, config_from_mapping
from qaudit.load.recipe import QuantRecipe
from qaudit.load.yamlio import YamlMap, load_yaml

ASSUMED_MEGATRON = "bridge-v0.6.0"


def is_bridge_file(path: Path, display: str) -> bool:
    """A YAML whose top-level `_target_` names a ConfigContainer."""
    if path.suffix not in (".yaml", ".yml"):
        return False
    try:
        document = load_yaml(path, display)
    except InputError:
        return False  # the other readers say what is wrong with it
    return container_kind(document) is not None


# ConfigContainer sections (Bridge v0.6.0 and earlier): a file made of these is an override.
SECTIONS = frozenset({
    "model", "train", "validation", "optimizer", "scheduler", "dataset", "data", "logger",
    "tokenizer", "checkpoint", "dist", "ddp", "mixed_precision", "comm_overlap", "rng",
    "profiling", "peft", "ft", "straggler", "nvrx_straggler", "rerun_state_machine",
    "inprocess_restart", "tensor_inspect", "env_vars", "optimizer_config_override_provider",
    "distill", "kd_config",
})


def refuse_unknown_sections(document: YamlMap, display: str,
                            origins: dict[str, tuple[str, int | None]]) -> None:
    """A top-level key that is no ConfigContainer field: Bridge's ConfigContainer would not
    take it, and nothing here reads it (a model field there would silently leave the audit).
    Keys an override adds are Bridge's business (_apply_overrides skips them with a warning)."""
    from qaudit.load.config import ACCEPTED_FIELDS, MODELLED_FIELDS
    from qaudit.load.yamlio import did_you_mean

    for key in document:
        if key == "_target_" or key in SECTIONS or key in origins:
            continue
        line = document.line_of(key)
        if key in MODELLED_FIELDS | ACCEPTED_FIELDS:
            raise InputError("a model field at the top level, where nothing reads it: it "
                             "belongs under `model:`", file=display, line=line, key=str(key))
        close = did_you_mean(key, SECTIONS) if isinstance(key, str) else ""
        raise InputError(f"not a ConfigContainer section{close}; the sections are "
                         f"{', '.join(sorted(SECTIONS))}", file=display, line=line, key=str(key))


def refuse_override_file(path: Path, display: str) -> None:
    """A partial ConfigContainer (a Bridge override YAML) given as the config: exit 2 with
    what to do instead. A file with `model:` only stays a TransformerConfig YAML."""
    if path.suffix not in (".yaml", ".yml"):
        return
    try:
        document = load_yaml(path, display)
    except InputError:
        return
    if not isinstance(document, YamlMap) or not document or "_target_" in document:
        return
    inner = document
    if isinstance(document.get("ConfigContainer"), YamlMap) \
            and set(document) <= {"ConfigContainer", "perf_matrix"}:
        inner = document["ConfigContainer"]
    keys = [key for key in inner if isinstance(key, str)]
    known = [key for key in keys if key in SECTIONS]
    # Sections only; or a model section beside other sections (and the launcher's own keys,
    # e.g. cluster_config). A file with `model:` alone stays a TransformerConfig YAML.
    if not known or (set(keys) - SECTIONS and not ("model" in known and len(known) > 1)) \
            or (set(keys) == {"model"} and inner is document):
        return
    keys = known
    how = ("pass it as --override on the ConfigContainer YAML of the recipe it changes "
           "(run_recipe.py --dry-run writes one): qaudit check ConfigContainer.yaml --override "
           f"{display}")
    if "model" not in inner:
        raise InputError(f"a Megatron-Bridge override file with no 'model' section (it sets "
                         f"{', '.join(keys)} only): not a model config, nothing to audit on its "
                         f"own; {how}", file=display, line=inner.line_of(keys[0]), key=keys[0])
    raise InputError(f"a Megatron-Bridge override file (a partial ConfigContainer: "
                     f"{', '.join(keys)}), not a whole config: the model it changes is its "
                     f"recipe's; {how}", file=display, line=inner.line_of("model"), key="model")


def load_bridge(path: Path, display: str, overrides: Sequence[Override | str] = (),
                recipe_table: Callable[[], RecipeTable] | None = None
                ) -> tuple[ModelConfig, QuantRecipe | None]:
    """`overrides`: override files (`Override(path=...)`) and `key=value` arguments (strings
    or `Override(text=..., index=...)`), applied as Bridge applies them. `recipe_table`: the
    named-recipe table, asked for only when `mixed_precision` names a recipe."""
    document = load_yaml(path, display)
    if not isinstance(document, YamlMap) or container_kind(document) is None:
        raise InputError("not a Megatron-Bridge ConfigContainer YAML (no top-level _target_ "
                         "naming a ConfigContainer)", file=display, line=1, key="_target_")
    refuse_unknown_sections(document, display, {})
    origins, explicit, remarks = _overridden(document, display, overrides)
    refuse_foreign_targets(document, display, origins)
    refuse_unknown_fields(document, display, origins)
    remarks += as_upstream_runs(document, display, origins)
    flat = flatten(document, display, origins, explicit, recipe_table)
    flat.info.explanations.extend(remarks)
    return _config(flat, path, display)


def load_object(obj: object, overrides: Sequence[Override | str] = ()
                ) -> tuple[ModelConfig, QuantRecipe | None]:
    """A live config object (qaudit/load/bridge/live.py), read as its dump would be."""
    from qaudit.load.bridge.live import document_of, label_of

    display = label_of(obj)
    document = document_of(obj)
    if container_kind_of_object(document) == "qaudit":  # a mapping or provider we wrapped
        refuse_unknown_sections(document, display, {})
    origins, explicit, remarks = _overridden(document, display, overrides)
    refuse_foreign_targets(document, display, origins, overridden_only=True)
    remarks += as_upstream_runs(document, display, origins)
    flat = flatten(document, display, origins, explicit)
    flat.info.explanations.extend(remarks)
    if container_kind_of_object(document) == "qaudit":
        flat.info.container = "object"
    return _config(flat, Path(display), display)


def _overridden(document: YamlMap, display: str, overrides: Sequence[Override | str]
                ) -> tuple[dict[str, tuple[str, int | None]], set[str], list[str]]:
    """apply_overrides, then what Bridge's runtime_config_update makes of a mixed_precision
    mapping the overrides put where the config held a recipe name or null."""
    before = document.get("mixed_precision")
    origins, explicit, remarks = apply_overrides(document, display, overrides)
    _refuse_mapping_over_recipe_name(before, document.get("mixed_precision"), origins)
    return origins, explicit, remarks


def _refuse_mapping_over_recipe_name(before: object, after: object,
                                     origins: dict[str, tuple[str, int | None]]) -> None:
    """OmegaConf's merge and Hydra's `+`/`++` put a mapping in place of a recipe name (or
    null); Bridge's _apply_overrides then stores it on the ConfigContainer as a plain dict
    (only a `_target_` mapping is instantiated), and runtime_config_update calls finalize()
    on it. Refused at the override that brought the mapping in."""
    if isinstance(before, YamlMap) or not isinstance(after, YamlMap) or "_target_" in after:
        return
    key = next((k for k in origins if k == "mixed_precision"
                or k.startswith("mixed_precision.")), "mixed_precision")
    file, line = origins.get(key, (None, None))
    what = "null" if before is None else f"the recipe name {before!r}"
    raise InputError(
        f"a mapping set over mixed_precision, which is {what} in the config: Bridge would fail "
        "at start-up (the mapping replaces the name, _apply_overrides stores it as a plain "
        "dict, and runtime_config_update's mixed_precision.finalize() raises AttributeError: "
        "'dict' object has no attribute 'finalize'); name another recipe "
        "(mixed_precision: NAME), or write the whole section with _target_: "
        "megatron.bridge.training.mixed_precision.MixedPrecisionConfig",
        file=file, line=line, key=key)


def container_kind_of_object(document: YamlMap) -> str:
    return "qaudit" if document.get("_target_") == "qaudit.api.ConfigContainer" else "bridge"


def _config(flat: Flat, path: Path, display: str) -> tuple[ModelConfig, QuantRecipe | None]:
    info = flat.info
    source = ConfigSource(display, path, flat.mapping, origin="bridge",
                          assumed_megatron=ASSUMED_MEGATRON, provider=info.provider.name,
                          bridge_version=info.version, origins=dict(flat.origins),
                          alternatives=dict(info.alternatives))
    for message, (file, line), key in flat.notes:
        source.notes.append(SourceNote(message, line, key, None if file == display else file))
    for message, (file, line), key in flat.no_effect:
        source.notes.append(SourceNote(message, line, key, None if file == display else file,
                                       no_effect=True))
    try:
        config = config_from_mapping(flat.mapping, source)
    except InputError as exc:
        raise _located(exc, source) from None
    source.header_notes = _header(flat)
    recipe = None
    if flat.recipe_node is not None:
        file, line = flat.recipe_where
        recipe = recipe_from_node(flat.recipe_node, file, line)
    return config, recipe


def locate_error(exc: InputError, source: ConfigSource | None) -> InputError:
    """A later stage's error about a field of a Bridge config: at the override that set it."""
    if source is None or source.origin != "bridge":
        return exc
    return _located(exc, source)


def _located(exc: InputError, source: ConfigSource) -> InputError:
    """An error about a field an override set points at the override."""
    if exc.key in source.origins and exc.file == source.file:
        file, line = source.origins[exc.key]
        return InputError(exc.message, file=file, line=line, key=f"model.{exc.key}")
    if exc.key and exc.file == source.file and exc.key in source.mapping:
        message = exc.message
        if source.mapping.get(exc.key) == 0 and message.endswith("got 0"):
            # vanilla_gpt-style recipes ship zeros for the sizes that overrides fill in.
            message += (f"; the recipe leaves it to an override: add model.{exc.key}=N "
                        "(or --override FILE)")
        return InputError(message, file=exc.file, line=exc.line, key=f"model.{exc.key}")
    return exc


def _header(flat: Flat) -> list[str]:
    info = flat.info
    what = "Python config object" if info.container == "object" else f"Bridge {info.container}"
    if info.provider.name:
        what += f", {info.provider.name}"
    if info.version:
        what += f", Megatron-Bridge {info.version}"
    return [what] + info.explanations


