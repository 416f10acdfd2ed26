"""What `qaudit check` was asked to audit: config paths (a directory stands for its configs)
and trailing Hydra-style overrides (`model.mtp_num_layers=2`, `+x=1`, `~y`), which only a
Megatron-Bridge config takes."""

from __future__ import annotations

import os
from pathlib import Path

from qaudit.errors import InputError

# What a directory's configs are: model config YAMLs, MODEL_ARGS YAMLs and launch scripts,
# directly inside it (a recipes/ folder next to them is not a set of configs).
CONFIG_SUFFIXES = (".yaml", ".yml", ".sh")


def is_override(arg: str) -> bool:
    """`key=value` that is not an existing path, or `+key=value` / `~key` (Hydra's add and
    delete)."""
    if arg.startswith(("+", "~")):
        return True
    return "=" in arg and not os.path.lexists(arg)


def split_targets(args: list[str]) -> tuple[list[str], list[str]]:
    """(paths, overrides), each in the order given."""
    paths: list[str] = []
    overrides: list[str] = []
    for arg in args:
        (overrides if is_override(arg) else paths).append(arg)
    return paths, overrides


def directory_configs(path: str) -> list[str]:
    """The configs directly inside a directory, sorted by name; exit 2 when there are none or
    the directory cannot be read. An entry whose kind cannot be told (a symbolic link that
    loops or points nowhere, one qaudit may not stat) is kept: loading it names it with the
    reason, and the other files are audited."""
    try:
        with os.scandir(path) as entries:
            found = sorted(entry.name for entry in entries
                           if entry.name.endswith(CONFIG_SUFFIXES)
                           and not entry.name.startswith(".") and _may_be_file(entry))
    except OSError as exc:
        raise InputError(f"cannot read the directory: {exc.strerror or exc}", file=path) from None
    if not found:
        raise InputError(f"is a directory with no configs ({', '.join(CONFIG_SUFFIXES)} files) "
                         "in it", file=path)
    return [str(Path(path) / name) for name in found]


def _may_be_file(entry: os.DirEntry) -> bool:
    """A regular file, or a link whose target cannot be stat'ed (a directory is no config)."""
    try:
        return entry.is_file() or (entry.is_symlink() and not os.path.exists(entry.path))
    except OSError:  # a link loop (ELOOP), no permission to stat
        return True


def expand_targets(paths: list[str]) -> tuple[list[str], bool]:
    """Every config to audit, and whether there are several (or a directory was given):
    each file as given (a missing one is reported when it is loaded), each directory as its
    configs."""
    files: list[str] = []
    several = len(paths) > 1
    for path in paths:
        if os.path.isdir(path):
            files.extend(directory_configs(path))
            several = True
        else:
            files.append(path)
    return files, several
