"""A setting written as the user would write it, in the input they gave and where in it: a key
under `model:` (or at the top level) of a TransformerConfig YAML, a Megatron-LM flag added or
removed at a line of a launch script or MODEL_ARGS file, a Bridge `model.x=y` override; or
None where the input has no way to say it (no Megatron-LM flag sets the field).

qaudit/judge/remedies.py prices the remedies; this module only writes them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from qaudit.load.config import ModelConfig
from qaudit.load.sources.megatron_flags import modelled_flags

# Where Megatron-LM builds the TransformerConfig from its flags: a field with no flag is set
# there (or in the model provider of the entry point).
CONFIG_FROM_FLAGS = ("core_transformer_config_from_args (megatron/training/argument_utils.py) "
                     "or your entry point's model provider")


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


def python_value(value: Any) -> str:
    return repr(value)


# ConfigContainer sections holding a field other than `model` (qaudit/load/bridge/container.py).
_BRIDGE_SECTION = {"data_parallel_sharding_strategy": "ddp"}


@lru_cache(maxsize=32)
def _read_lines(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    try:
        return tuple(Path(path).read_text(encoding="utf-8", errors="replace").splitlines())
    except OSError:
        return ()


def _lines(path: str) -> tuple[str, ...]:
    """The input's lines (one read per file version: a fix line is written per module)."""
    try:
        stat = Path(path).stat()
    except OSError:
        return ()
    return _read_lines(path, stat.st_mtime_ns, stat.st_size)


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


def flag_for(key: str, value: Any) -> tuple[str, str] | None:
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
    how = flag_for(key, value)
    if how is None:
        return (f"no Megatron-LM flag sets {key}: set {key}={python_value(value)} on the "
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


def switched_off(config: ModelConfig, key: str, flag: str) -> str:
    """`key` set false, as written in this input: on a launch script or MODEL_ARGS the
    store_true `flag` removed (where the file's line holds it), else as `written` says."""
    if route(config) != "flags":
        return written(config, key, False)
    present = _word_of(config, flag)
    where = f" at line {present.line}" if present else ""
    return f"remove {flag} from {'MODEL_ARGS' if _model_args(config) else 'the launch command'}" \
        f"{where}"


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
        prefix = "# needs a code change: " if flag_for(key, value) is None else "# "
        return prefix + _flag(config, key, value)
    if _under_model(config):
        return f"model:\n  {key}: {_yaml_value(value)}"
    return f"{key}: {_yaml_value(value)}"
