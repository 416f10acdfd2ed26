"""Megatron functional-test `model_config.yaml` files: `MODEL_ARGS` (+ `ENV_VARS`) -> argv.

Follows how upstream's `tests/functional_tests/shell_test_utils/_run_training.sh` builds the
command line: `true` passes the bare flag, a list passes its items as separate values, any
other value is passed as one word, and `$VAR` / `${VAR}` placeholders are substituted
(upstream: envsubst). Differences, on purpose: `false` leaves a switch off (upstream would
pass the word "false", which Megatron rejects), and placeholders are filled from `--set`
first, then from the file's `ENV_VARS`; others stay unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from qaudit.load.config import SourceNote
from qaudit.errors import InputError
from qaudit.load.sources.argv import HOLE
from qaudit.load.sources.tokens import External, Word
from qaudit.load.yamlio import parse_file, read_text, value_loader

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_BRACKETED = re.compile(r"^\[[^\]]+\]$")
# Merge keys can refer to each other; bound the expansion ("billion laughs").
MAX_MERGE_DEPTH = 10
MAX_ENTRIES = 20_000
# Characters of all MODEL_ARGS words once placeholders are filled: twice what a file under the
# 1 MiB cap holds by itself. Each `${P}` copies P, so 100,000 of them with a 500 KB P would
# ask for 50 GB; the sum is counted before any word is built.
MAX_SUBSTITUTED = 2 * 1024 * 1024


@dataclass
class Entry:
    key: str
    value: Any
    line: int


def read_model_args_file(path: Path, file: str) -> dict[str, list[Entry]] | None:
    """Top-level sections of a functional-test YAML as ordered entries, or None when the file
    is not such a file (no top-level MODEL_ARGS, or not YAML at all).

    Read from PyYAML's node graph (the run's one parse of the file, qaudit/load/run_files.py;
    nothing constructed beyond scalars and flat lists) because upstream's files repeat keys
    inside MODEL_ARGS (e.g. --ffn-hidden-size twice) and its runner passes both, so argparse
    keeps the last: a plain YAML mapping would either refuse the file or silently keep one.
    """
    if "MODEL_ARGS" not in read_text(path, file):
        return None  # cheap way out for plain TransformerConfig files
    try:
        root = parse_file(path, file)
    except InputError:
        return None  # the plain YAML route reports it, with its line
    if not isinstance(root, yaml.MappingNode):
        return None
    sections: dict[str, list[Entry]] = {}
    top: dict[str, Entry] = {}
    for key_node, value_node in root.value:
        if isinstance(key_node, yaml.ScalarNode):
            top[key_node.value] = Entry(key_node.value, value_node, key_node.start_mark.line + 1)
    if "MODEL_ARGS" not in top:
        return None
    for name, entry in top.items():
        sections[name] = [entry]
    sections["MODEL_ARGS"] = _entries(top["MODEL_ARGS"], file)
    if "ENV_VARS" in top:
        # Only scalar values can fill a placeholder; anything else there is not our business.
        sections["ENV_VARS"] = _entries(top["ENV_VARS"], file, strict=False)
    return sections


def _entries(section: Entry, file: str, strict: bool = True) -> list[Entry]:
    node = section.value
    if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
        return []
    if not isinstance(node, yaml.MappingNode):
        if not strict:
            return []
        raise InputError(f"expected a mapping of --flag: value under {section.key}", file=file,
                         line=section.line, key=section.key)
    return _mapping_entries(node, file, depth=0, budget=[MAX_ENTRIES], strict=strict)


def _mapping_entries(node: yaml.MappingNode, file: str, depth: int, budget: list[int],
                     strict: bool = True) -> list[Entry]:
    """Entries in order, YAML merge keys (`<<: *BASE_MODEL_ARGS`) expanded in place as
    upstream's `yq explode` does; keys written explicitly win over merged ones."""
    if depth > MAX_MERGE_DEPTH:
        raise InputError("YAML merge keys nested too deeply", file=file,
                         line=node.start_mark.line + 1)
    explicit = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.value != "<<"}
    entries: list[Entry] = []
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise InputError("keys must be plain scalars", file=file, line=line)
        if key_node.tag.endswith(":merge") or key_node.value == "<<":
            bases = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for base in bases:
                if not isinstance(base, yaml.MappingNode):
                    raise InputError("a YAML merge key needs a mapping", file=file, line=line)
                entries.extend(e for e in _mapping_entries(base, file, depth + 1, budget, strict)
                               if e.key not in explicit)
        elif strict or isinstance(value_node, yaml.ScalarNode):
            entries.append(Entry(key_node.value, _value(value_node, file, line), line))
        budget[0] -= 1  # shared by all merge levels: entries read in total
        if budget[0] < 0:
            raise InputError(f"more than {MAX_ENTRIES} entries after expanding YAML merge keys",
                             file=file, line=line)
    return entries


def _value(node: yaml.Node, file: str, line: int) -> Any:
    """A scalar, or a flat list of scalars, typed by the safe loader's rules."""
    constructor = value_loader(file)  # huge integers, bad timestamps: InputError at the line
    try:
        if isinstance(node, yaml.ScalarNode):
            return constructor.construct_object(node)
        if isinstance(node, yaml.SequenceNode) and all(isinstance(item, yaml.ScalarNode)
                                                       for item in node.value):
            return [constructor.construct_object(item) for item in node.value]
    except yaml.YAMLError as exc:
        raise InputError(f"invalid value: {exc}", file=file, line=line) from None
    finally:
        constructor.dispose()
    raise InputError("expected a value or a flat list of values", file=file, line=line)


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def test_mode(sections: dict[str, list[Entry]]) -> str | None:
    """The file's `MODE` (inference, rl, pretraining), None when it has none."""
    mode = sections.get("MODE", [])
    node = mode[0].value if mode else None
    return node.value if isinstance(node, yaml.ScalarNode) else None


def is_inference_test(sections: dict[str, list[Entry]]) -> bool:
    """`MODE: inference`: the runner starts one of upstream's inference scripts."""
    return test_mode(sections) == "inference"


def model_args_environment(sections: dict[str, list[Entry]]) -> dict[str, str]:
    """The file's ENV_VARS, as the runner exports them."""
    return {e.key: _scalar_text(e.value) for e in sections.get("ENV_VARS", [])}


def model_args_words(sections: dict[str, list[Entry]], file: str,
                     variables: Mapping[str, str]) -> tuple[list[Word], list[SourceNote]]:
    env_values = {e.key: _scalar_text(e.value) for e in sections.get("ENV_VARS", [])}
    lookup = {**env_values, **variables}  # --set wins

    words: list[Word] = []
    budget = [MAX_SUBSTITUTED]  # characters the substituted words may still take
    for entry in sections["MODEL_ARGS"]:
        value, line = entry.value, entry.line
        if value is False:
            continue
        words.append(Word(entry.key, line))
        if value is True or value is None or value == "":
            continue
        if isinstance(value, list):
            items = [_scalar_text(v) for v in value]
        elif isinstance(value, str) and _BRACKETED.match(value.strip()):
            # Upstream's runner strips the brackets and passes the items as separate words.
            items = value.strip()[1:-1].split()
        else:
            items = [_scalar_text(value)]
        words.extend(_substitute(item, line, lookup, budget, file, entry.key)
                     for item in items)
    notes = [SourceNote(f"{key} (the arguments of a later run of this test) is not audited; "
                        f"only MODEL_ARGS is", entries[0].line, key)
             for key, entries in sections.items() if key.startswith("MODEL_ARGS_")]
    return words, notes


def _substitute(text: str, line: int | None, lookup: Mapping[str, str], budget: list[int],
                file: str, key: str) -> Word:
    size = len(text) + sum(len(lookup.get(match.group(1) or match.group(2), HOLE)) - len(match[0])
                           for match in _PLACEHOLDER.finditer(text))
    budget[0] -= size
    if budget[0] < 0:
        raise InputError(f"with its placeholders filled from ENV_VARS and --set, MODEL_ARGS "
                         f"would hold more than {MAX_SUBSTITUTED:,} characters (this value "
                         f"alone {size:,}); real files hold a few thousand", file=file,
                         line=line, key=key)
    unknown: list[External] = []

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name in lookup:
            return lookup[name]
        unknown.append(External(name, line, "not in ENV_VARS and not given with --set"))
        return HOLE

    return Word(_PLACEHOLDER.sub(replace, text), line, tuple(dict.fromkeys(unknown)))
