"""Issue 48's mutation test: on every input route, each field the audit reads, misspelt by one
letter or moved one level up or down, is exit 2 (an InputError naming it) or changes nothing
the audit reads (the loaded ModelConfig's modelled fields and the recipe) - never a silent
change of verdict. A misspelling that lands on another real name is a different setting, not a
misspelling, and is skipped. Load-level only (no audit run): what is read decides the verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qaudit.commands.check import load_inputs
from qaudit.errors import InputError
from qaudit.load.config import ACCEPTED_FIELDS, MODELLED_FIELDS
from qaudit.load.sources.upstream_flags import UPSTREAM_FLAGS
from qaudit.load.upstream_checks import CHECKED_FIELDS

REPO = Path(__file__).resolve().parent.parent
FIELDS = MODELLED_FIELDS | ACCEPTED_FIELDS
READ = MODELLED_FIELDS | frozenset(CHECKED_FIELDS)


def misspellings(word: str, known) -> list[str]:
    """One-letter misspellings: the last letter dropped, two middle letters swapped, one
    doubled; those that are another real name are left out."""
    body = word.lstrip("-")
    prefix = word[:len(word) - len(body)]
    middle = len(body) // 2
    variants = {body[:-1], body[:middle - 1] + body[middle] + body[middle - 1] + body[middle + 1:],
                body[:middle] + body[middle] + body[middle:]}
    return sorted(prefix + v for v in variants if v and prefix + v != word
                  and prefix + v not in known)


def read_state(path: Path, arguments: tuple[str, ...] = ()) -> dict | None:
    """What the audit reads from the input, or None when it is refused (exit 2)."""
    try:
        config, recipe = load_inputs(str(path), None, None, arguments)
    except InputError:
        return None
    state = {name: getattr(config, name) for name in sorted(MODELLED_FIELDS)}
    state["recipe"] = None if recipe is None else (
        repr(recipe.configs), [(m.pattern, m.config) for m in recipe.matchers])
    return state


def assert_refused_or_unchanged(baseline: dict, state: dict | None, what: str) -> None:
    assert state is None or state == baseline, \
        f"{what}: silently changed " + str({k: (baseline[k], state[k]) for k in baseline
                                            if baseline[k] != state.get(k)})


def _write(path: Path, document) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# --- TransformerConfig YAML: nested under model:, and flat --------------------------------

@pytest.mark.parametrize("example", ["deepseek-v3-mtp-fp8", "nemotron-h-8b-fp8"])
def test_nested_yaml_keys_mutated(tmp_path, example):
    document = yaml.safe_load((REPO / "configs" / f"{example}.yaml").read_text())
    baseline = read_state(_write(tmp_path / "base.yaml", document))
    assert baseline is not None
    for key in list(document["model"]):
        for wrong in misspellings(key, FIELDS):
            model = {(wrong if k == key else k): v for k, v in document["model"].items()}
            state = read_state(_write(tmp_path / "m.yaml", {"model": model}))
            assert_refused_or_unchanged(baseline, state, f"model.{key} -> {wrong}")
        model = {k: v for k, v in document["model"].items() if k != key}
        up = read_state(_write(tmp_path / "m.yaml", {"model": model, key: document["model"][key]}))
        assert up is None, f"model.{key} moved to the top level was not refused"


@pytest.mark.parametrize("example", ["gpt-mtp-bf16", "gpt-small-bf16"])
def test_flat_yaml_keys_mutated(tmp_path, example):
    document = yaml.safe_load((REPO / "configs" / f"{example}.yaml").read_text())
    baseline = read_state(_write(tmp_path / "base.yaml", document))
    for key in list(document):
        for wrong in misspellings(key, FIELDS):
            state = read_state(_write(tmp_path / "m.yaml", {(wrong if k == key else k): v
                                                            for k, v in document.items()}))
            assert_refused_or_unchanged(baseline, state, f"{key} -> {wrong}")
        rest = {k: v for k, v in document.items() if k != key}
        down = read_state(_write(tmp_path / "m.yaml", {**rest, "model": {key: document[key]}}))
        assert down is None, f"{key} moved under model: beside flat fields was not refused"


# --- MODEL_ARGS and launch scripts: Megatron's flags ------------------------------------

FLAGS = {"--num-layers": 4, "--hidden-size": 256, "--num-attention-heads": 4,
         "--mtp-num-layers": 2, "--mtp-use-repeated-layer": True, "--fp8-format": "e4m3",
         "--fp8-recipe": "tensorwise", "--num-experts": 4, "--moe-router-topk": 2,
         "--swiglu": True, "--untie-embeddings-and-output-weights": True}


def _model_args(path: Path, flags: dict) -> Path:
    path.write_text(json.dumps({"ENV_VARS": {"A": 1}, "MODEL_ARGS": flags}))
    return path


def _script(path: Path, flags: dict) -> Path:
    words = " ".join(k if v is True else f"{k} {v}" for k, v in flags.items())
    path.write_text(f"#!/bin/bash\ntorchrun pretrain_gpt.py {words}\n")
    return path


@pytest.mark.parametrize("write, name", [(_model_args, "model_config.yaml"),
                                         (_script, "train.sh")], ids=["MODEL_ARGS", "script"])
def test_flags_mutated(tmp_path, write, name):
    baseline = read_state(write(tmp_path / name, FLAGS))
    assert baseline is not None and baseline["mtp_use_repeated_layer"] is True
    for flag in FLAGS:
        for wrong in misspellings(flag, UPSTREAM_FLAGS):
            state = read_state(write(tmp_path / name, {(wrong if k == flag else k): v
                                                       for k, v in FLAGS.items()}))
            assert_refused_or_unchanged(baseline, state, f"{flag} -> {wrong}")


# --- Bridge dumps: the model's fields, its sections, and override arguments ---------------

DUMP = REPO / "configs" / "bridge-super-nvfp4-mtp-bf16.yaml"


@pytest.mark.slow  # a campaign over every key read (CI runs it)
def test_dump_keys_mutated(tmp_path):
    document = yaml.safe_load(DUMP.read_text())
    baseline = read_state(_write(tmp_path / "base.yaml", document))
    assert baseline is not None
    for section, keys in (("model", [k for k in document["model"] if k in READ]),
                          ("mixed_precision", [k for k in document["mixed_precision"]
                                               if k != "_target_"])):
        for key in keys:
            node = document[section]
            for wrong in misspellings(key, FIELDS | set(node)):
                mutated = {**document, section: {(wrong if k == key else k): v
                                                 for k, v in node.items()}}
                state = read_state(_write(tmp_path / "m.yaml", mutated))
                assert_refused_or_unchanged(baseline, state, f"{section}.{key} -> {wrong}")
            rest = {k: v for k, v in node.items() if k != key}
            up = read_state(_write(tmp_path / "m.yaml", {**document, section: rest,
                                                          key: node[key]}))
            assert up is None, f"{section}.{key} moved to the top level was not refused"


@pytest.mark.slow  # a campaign over every key read (CI runs it)
def test_override_arguments_mutated():
    document = yaml.safe_load(DUMP.read_text())
    baseline = read_state(DUMP)
    for key in [k for k in document["model"] if k in READ]:
        value = document["model"][key]
        text = json.dumps(value) if not isinstance(value, str) else value
        for wrong in misspellings(key, FIELDS | set(document["model"])):
            state = read_state(DUMP, (f"model.{wrong}={text}",))
            assert_refused_or_unchanged(baseline, state, f"model.{key} -> model.{wrong}")
            # `+` adds a key the provider lacks: Bridge skips it with a warning, and so does
            # the audit (a QA090 note), so nothing read changes.
            state = read_state(DUMP, (f"+model.{wrong}={text}",))
            assert_refused_or_unchanged(baseline, state, f"+model.{wrong}")
