"""Helpers for the rules about gradient-loss bugs upstream shipped (QA050 onwards): which
Megatron package the verdict is for, and whether the input turns on a setting qaudit reads
but does not model (those reach the audit as the input's own words, not as config fields)."""

from __future__ import annotations

import re
from typing import Any

from qaudit.judge.unmodelled_advice import setting_name
from qaudit.load.config import ModelConfig
from qaudit.plan.upstream.commits import MAIN_READ_AT, known_commit
from qaudit.plan.upstream.releases import MAIN


def megatron_package(target: Any) -> tuple[int, int, int] | None:
    """The megatron-core package version (major, minor, patch) of the Megatron the verdict is
    for: a release's number, a known commit's package_info.py, main as read (MAIN_READ_AT),
    a checkout's or install's own number; None when unknown."""
    if target is None:
        return None
    if target.version == MAIN:
        text = known_commit(MAIN_READ_AT).package_version
    else:
        known = known_commit(getattr(target, "commit", None))
        text = known.package_version if known is not None else str(target.version)
    match = re.match(r"^(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?", text)
    if not match:
        return None
    return tuple(int(part) for part in match.groups(default="0"))  # type: ignore[return-value]


def megatron_in(target: Any, first: tuple[int, int], fixed: tuple[int, int]) -> bool:
    """Whether the Megatron is a package in [first, fixed); an unknown one counts as in."""
    key = megatron_package(target)
    return key is None or first <= key < fixed


def setting_on(config: ModelConfig, name: str) -> tuple[bool, str | None, int | None]:
    """Whether the input turns `name` on, and the file and line that do: a config field's
    value, or, for a setting the loaders only note (a launch flag, a Bridge key), its note."""
    value = getattr(config, name, None)
    if value:
        file, line = config.where(name)
        return True, file or config.file, line
    source = config.source
    if source is None:
        return False, None, None
    if name in source.mapping and source.mapping.get(name) not in (None, False, 0, "", []):
        file, line = config.where(name)
        return True, file or config.file, line
    for note in source.notes:
        if setting_name(note.key) == name and not note.no_effect:
            return True, note.file or config.file, note.line
    return False, None, None


def setting_value(config: ModelConfig, name: str) -> tuple[Any, str | None, int | None]:
    """A setting's value as the input gives it, for settings the loaders neither model nor
    note (`megatron_fsdp_version`): the YAML or Bridge key, else the launch flag's value in
    the argv read (`--megatron-fsdp-version 2`, or `--megatron-fsdp-version=2`); None if unset."""
    source = config.source
    if source is None:
        return None, None, None
    if name in source.mapping:
        file, line = config.where(name)
        return source.mapping.get(name), file or config.file, line
    flag = "--" + name.replace("_", "-")
    words = list(source.argv or [])
    for index, word in enumerate(words):
        text = getattr(word, "text", str(word))
        if text.startswith(flag + "="):
            return text[len(flag) + 1:], config.file, getattr(word, "line", None)
        if text == flag and index + 1 < len(words):
            after = words[index + 1]
            return getattr(after, "text", str(after)), config.file, getattr(word, "line", None)
    return None, None, None
