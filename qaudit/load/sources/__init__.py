"""Model configs from the files Megatron users already have.

- a bash launch script (`train.sh`): the flags it passes to Megatron (`launch_script`);
- a functional-test `model_config.yaml` with `MODEL_ARGS` (`model_args`).

Both become Megatron's argv (`tokens.Word`s), then flag occurrences (`argv`), then a `YamlMap`
of TransformerConfig fields with each field's source line plus notes for what the audit does
not model (`translate`, table in `megatron_flags`), and finally the same `ModelConfig` as a
TransformerConfig YAML gives (`qaudit.load.config.config_from_mapping`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

from qaudit.load.config import ConfigSource, ModelConfig, config_from_mapping
from qaudit.errors import InputError
from qaudit.load.sources.argv import split_argv
from qaudit.load.sources.entry import entry_of, model_args_entry
from qaudit.load.sources.launch_script import launch_script_words, looks_like_launch_script
from qaudit.load.sources.model_args import (is_inference_test, model_args_environment,
                                            model_args_words, read_model_args_file, test_mode)
from qaudit.load.sources.translate import translate
from qaudit.load.yamlio import read_text


def load_source_config(path: Path, display: str,
                       variables: Mapping[str, str] | None = None) -> ModelConfig | None:
    """The config of a launch script or MODEL_ARGS file; None for any other file (plain
    TransformerConfig YAML, which the caller loads as before)."""
    variables = dict(variables or {})
    environment: dict[str, str] = {}
    inference_test = False
    if not os.path.isfile(path):  # False, not OSError, for a name too long (read_text says why)
        return None
    # Read once per run (qaudit/load/run_files.py): every route below raises the same error
    # for a file that cannot be read as UTF-8 text.
    text = read_text(path, display)
    if looks_like_launch_script(path.suffix, text[:200].partition("\n")[0]):
        if "\x00" in text:
            raise InputError("binary data (NUL byte), expected a bash script", file=display)
        words, notes, script = launch_script_words(text, display, variables)
        entry = entry_of(script, display)
    elif path.suffix in (".yaml", ".yml") or not path.suffix:
        sections = read_model_args_file(path, display)
        if sections is None:
            return None  # not a MODEL_ARGS file: the plain TransformerConfig YAML route
        words, notes = model_args_words(sections, display, variables)
        environment = model_args_environment(sections)
        inference_test = is_inference_test(sections)
        # The functional-test recipe, not this file, names the entry script.
        entry = model_args_entry(display, test_mode(sections),
                                 {e.key for e in sections["MODEL_ARGS"]})
    else:
        return None
    result = translate(split_argv(words), display, entry)
    _resolve_recipe(result.mapping, path, display)
    source = ConfigSource(display, path, result.mapping, notes + result.notes, argv=list(words),
                          environment=environment, inference_test=inference_test)
    try:
        # Every flag was checked against the unmodelled table already (translate).
        return config_from_mapping(result.mapping, source, note_settings=False)
    except InputError as exc:
        # Name the flag the user wrote rather than the TransformerConfig field.
        raise InputError(exc.message, file=exc.file, line=exc.line,
                         key=result.flag_of.get(exc.key or "", exc.key)) from None


def _resolve_recipe(mapping, path: Path, display: str) -> None:
    """--te-precision-config-file is opened by Megatron relative to its working directory;
    qaudit tries the directory it runs in, then the file's own directory, and stores the
    path relative to the file (as `load_files` expects of `quant_recipe`)."""
    recipe = mapping.get("quant_recipe")
    if not isinstance(recipe, str):
        return
    candidates = [Path(recipe)] if os.path.isabs(recipe) else [Path.cwd() / recipe,
                                                                path.parent.resolve() / recipe]
    for candidate in candidates:
        if candidate.is_file():
            base = os.path.abspath(os.path.dirname(display) or ".")
            mapping["quant_recipe"] = os.path.relpath(os.path.abspath(candidate), base)
            return
    raise InputError(f"recipe file {recipe!r} not found (looked in the working directory, as "
                     f"Megatron does, and next to {display})", file=display,
                     line=mapping.key_lines.get("quant_recipe"), key="--te-precision-config-file")


_NAME = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*|[1-9][0-9]*)$")


def parse_assignments(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--set NAME=VALUE` options (NAME: a variable, or a script argument number)."""
    result = []
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or not _NAME.match(name):
            raise InputError(f"--set expects NAME=VALUE (NAME a variable name or a script "
                             f"argument number), got {item!r}")
        result.append((name, value))
    return tuple(result)
