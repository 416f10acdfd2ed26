"""Hostile and careless inputs, round four (issue 38): one section per class.

3. override arguments through the bounded loader; 4. Bridge sections made only of node keys;
(the others follow). scripts/fuzz has a generator for each class (tests/hostile_inputs4.py).
Work is bounded by counting (parses, values, calls), never by time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hostile_inputs4 import bridge_document
from test_hostile_round2 import cli, one_error_line

REPO = Path(__file__).resolve().parent.parent
SMALL_RUN = ("--steps", "1", "--microbatches", "1")


def bridge_dump(tmp_path: Path, name: str = "dump.yaml", **sections) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(bridge_document(**sections), sort_keys=False))
    return str(path)


class ParseCounter:
    """Counts YAML documents parsed (every route goes through the bounded loader)."""

    def __init__(self, monkeypatch) -> None:
        from qaudit.load import yamlio

        self.count = 0
        original = yamlio._LineLoader.get_single_node

        def counted(loader):
            self.count += 1
            return original(loader)

        monkeypatch.setattr(yamlio._LineLoader, "get_single_node", counted)


# --- 3. override arguments: the file loader's bounds, exit 2 naming the argument --------------

def alias_ladder(levels: int, width: int = 10) -> str:
    """`[&a [1..w], &b [*a x w], ...]`: width**levels values from a few hundred bytes."""
    parts = ["&l0 [" + ", ".join(str(i) for i in range(width)) + "]"]
    for level in range(1, levels):
        parts.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "[" + ", ".join(parts) + "]"


# Bridge reads arguments with Hydra's override grammar, which has no YAML tags or aliases:
# `!` and `&` are characters its lexer has no token for, so Bridge refuses those arguments too.
BAD_ARGUMENTS = {
    "5,000-digit integer": ("model.num_layers=" + "1" * 5000, "digits"),
    "a YAML tag": ("model.num_layers=[!!timestamp 2001-13-45]", "no token for '!'"),
    "integer in a list": ("model.num_layers=[" + "9" * 200 + "]", "digits"),
    "key 5,000 deep": ("model." + ".".join(["a"] * 5000) + "=1", "levels deep"),
    "key 5,000 deep, added": ("++model." + ".".join(["a"] * 5000) + "=1", "levels deep"),
    "flow nesting": ("model.x=" + "[" * 5000, "nested more than 64"),
    "YAML aliases": ("model.x=" + alias_ladder(7), "no token for '&'"),
    "python tag": ("model.x=[!!python/object/apply:os.system [true]]", "no token for '!'"),
    "interpolation": ("model.x=${oc.env:HOME}", "interpolations"),
    "interpolation, quoted": ("model.x='${oc.env:HOME}'", "interpolations"),
    "grammar function": ("model.x=int(3)", "grammar functions"),
    "sweep": ("model.x=1,2", "sweep"),
    "mixed_precision a function": ("++mixed_precision={_target_: os.system}", "mixed_precision"),
}


@pytest.mark.parametrize("argument,word", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_a_bad_override_argument_is_exit_2_naming_it(argument, word, tmp_path):
    err = one_error_line(cli("check", bridge_dump(tmp_path), argument, *SMALL_RUN), word)
    assert "argument 2 (" in err


@pytest.mark.slow  # 1.5 million values parsed (CI runs it)
def test_many_large_arguments_share_one_budget(tmp_path):
    """Each argument under the cap on its own, together past it: refused at the one that
    crosses it, before the rest are applied."""
    from qaudit.errors import InputError
    from qaudit.load.bridge.overrides import Override, apply_overrides
    from qaudit.load.yamlio import MAX_EXPANDED_VALUES, load_yaml

    document = load_yaml(Path(bridge_dump(tmp_path)))
    values = 300_000
    arguments = [Override(text=f"++train.x{i}=[" + ",".join(["0"] * values) + "]", index=i + 2)
                 for i in range(5)]
    crossing = MAX_EXPANDED_VALUES // (values + 1) + 1  # the argument that takes the total past it
    with pytest.raises(InputError, match="more than 1000000 values") as caught:
        apply_overrides(document, "dump.yaml", arguments)
    assert caught.value.file.startswith(f"argument {crossing + 1} (")


def test_many_overrides_cost_linear_work(tmp_path, monkeypatch):
    """60,000 distinct arguments: the position of each is found in one pass over the command
    line (it was a list search per argument: 31 s)."""
    import qaudit.commands.targets as targets

    calls = 0
    original = targets.is_override

    def counted(arg):
        nonlocal calls
        calls += 1
        return original(arg)

    monkeypatch.setattr(targets, "is_override", counted)
    count = 60_000
    arguments = [f"++train.x{i}={i}" for i in range(count)]
    code, out, err = cli("check", bridge_dump(tmp_path), *arguments, *SMALL_RUN, "-f", "json")
    assert code in (0, 1), err
    assert calls <= 2 * (count + 1) + 10


def test_an_override_file_named_twice_is_parsed_once(tmp_path, monkeypatch):
    dump = bridge_dump(tmp_path)
    (tmp_path / "o.yaml").write_text("train:\n  train_iters: 5\n")
    (tmp_path / "p.yaml").write_text("train:\n  train_iters: 7\n")
    counter = ParseCounter(monkeypatch)
    from qaudit.commands.inputs import load_inputs
    from qaudit.load.bridge.overrides import Override

    overrides = [Override(path=str(tmp_path / name)) for name in ["o.yaml"] * 200 + ["p.yaml"]]
    load_inputs(dump, None, {}, overrides)
    parses_with_files = counter.count
    counter.count = 0
    load_inputs(dump, None, {}, [])
    assert parses_with_files - counter.count == 2  # o.yaml once, p.yaml once


def test_an_override_argument_still_reads_lists_and_mappings(tmp_path):
    from qaudit.load.bridge.override_grammar import parse_value

    value = parse_value("{a: [1, {b: 2}], c: null}")
    assert value == {"a": [1, {"b": 2}], "c": None}
    assert value.line is None and value.line_of("a") is None  # no line: not a file
    assert parse_value("12_000") == 12000
    assert parse_value("9" * 100) == int("9" * 100)


# --- 4. sections made only of node keys -------------------------------------------------------

NODE_ONLY_MODELS = {
    "target only": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider"},
    "a function": {"_target_": "x.Y", "_call_": False},
    "with args": {"_target_": "x.Y", "_args_": [1]},
    "partial": {"_target_": "x.Y", "_partial_": True},
    "enum member": {"_target_": "x.Y", "_call_": True, "_name_": "y"},
}


@pytest.mark.parametrize("model", NODE_ONLY_MODELS.values(), ids=NODE_ONLY_MODELS.keys())
def test_a_model_section_without_fields_is_exit_2(model, tmp_path):
    path = tmp_path / "n.yaml"
    path.write_text(yaml.safe_dump({"_target_": "megatron.bridge.training.config.ConfigContainer",
                                    "model": model, "mixed_precision": None}))
    # Issue 48: a target that is no model provider is refused as such, before its fields.
    words = ("key 'model'", "no fields") if model["_target_"].startswith("megatron.") \
        else ("key 'model._target_'", "names 'x.Y', not a model provider")
    one_error_line(cli("check", str(path), *SMALL_RUN), *words)


@pytest.mark.parametrize("node", [{"_target_": "x.Y"}, {"_target_": "x.Y", "_call_": True},
                                  {"_target_": "torch.bfloat16", "_call_": False}],
                         ids=["class", "called", "dtype"])
def test_a_mixed_precision_node_without_fields_is_exit_2(node, tmp_path):
    # Issue 48: none of them is Bridge's MixedPrecisionConfig, which is refused first.
    one_error_line(cli("check", bridge_dump(tmp_path, mixed_precision=node), *SMALL_RUN),
                   "key 'mixed_precision._target_'", f"names '{node['_target_']}', not Bridge's "
                   "MixedPrecisionConfig")


def test_a_bare_mixed_precision_config_is_its_defaults(tmp_path):
    node = {"_target_": "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"}
    code, _, err = cli("check", bridge_dump(tmp_path, mixed_precision=node), *SMALL_RUN)
    assert code in (0, 1), err


def test_a_node_only_model_through_an_override_file_is_exit_2(tmp_path):
    """A `_target_` in an override file's section replaces the section (no key-by-key merge)."""
    (tmp_path / "o.yaml").write_text("model:\n  _target_: x.Y\n  _call_: false\n")
    one_error_line(cli("check", bridge_dump(tmp_path), "--override", str(tmp_path / "o.yaml"),
                       *SMALL_RUN), "o.yaml:2", "key 'model._target_'", "names 'x.Y'")


# --- 5. the API's live objects: expansion counted by identity, the caller's errors named ------

class Plain:
    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)


def small_object(**extra) -> Plain:
    return Plain(num_layers=2, hidden_size=64, num_attention_heads=4, **extra)


def shared(levels: int) -> list:
    value: list = [1]
    for _ in range(levels):
        value = [value, value]
    return value


def test_a_list_shared_many_ways_is_counted_not_expanded(monkeypatch):
    """2^22 ways (89 s and 7.7 GB before): refused once the count passes the YAML route's
    cap, after reading each distinct list once."""
    from qaudit.errors import InputError
    from qaudit.load.bridge import live

    reads = 0
    original = live._Reader._read

    def counted(self, value, path, depth):
        nonlocal reads
        reads += 1
        return original(self, value, path, depth)

    monkeypatch.setattr(live._Reader, "_read", counted)
    with pytest.raises(InputError, match="more than 1000000 values"):
        live.document_of(small_object(extra=shared(22)))
    assert reads <= 2 * 22 + 5  # each distinct object once (the object, then one list a level)
    reads = 0
    document = live.document_of(small_object(extra=shared(10)))  # 2,047 values: read
    assert reads <= 2 * 10 + 5
    assert document["model"]["extra"][0] is document["model"]["extra"][1]


class RaisingDict(dict):
    def items(self):
        raise KeyError("items")


class RaisingList(list):
    def __iter__(self):
        raise TypeError("no iteration")


class RaisingGetattribute:
    def __init__(self) -> None:
        self.num_layers = 2

    def __getattribute__(self, name):
        if name == "__dict__":
            raise ValueError("no dict")
        return object.__getattribute__(self, name)


class RaisingStr:
    __slots__ = ()

    def __str__(self):
        raise OSError("no str")


def raising_dataclass():
    import dataclasses

    @dataclasses.dataclass
    class Config:
        num_layers: int = 2
        hidden_size: int = 64

    Config.hidden_size = property(lambda self: 1 / 0)
    return Config.__new__(Config)


RAISING = {
    "__getattribute__": (lambda: RaisingGetattribute(), None, "ValueError"),
    "items()": (lambda: RaisingDict(num_layers=2), None, "KeyError"),
    "__iter__": (lambda: small_object(lst=RaisingList([1])), "lst", "TypeError"),
    "__str__": (lambda: small_object(odd=RaisingStr()), "odd", "OSError"),
    "dataclass property": (raising_dataclass, "hidden_size", "ZeroDivisionError"),
    "nested": (lambda: small_object(inner=Plain(deeper={"x": RaisingList()})), "inner.deeper.x",
               "TypeError"),
}


@pytest.mark.parametrize("make,key,kind", RAISING.values(), ids=RAISING.keys())
def test_the_callers_exception_is_an_input_error_naming_the_attribute(make, key, kind):
    from qaudit import audit
    from qaudit.errors import InputError

    with pytest.raises(InputError) as caught:
        audit(make(), steps=1, microbatches=1)
    assert caught.value.key == key and kind in caught.value.message


def test_an_object_with_nothing_to_read_is_an_input_error_naming_the_key():
    from qaudit import audit
    from qaudit.errors import InputError

    with pytest.raises(InputError) as caught:
        audit(Plain(_private=1), steps=1, microbatches=1)
    assert caught.value.key == "model" and "no fields" in caught.value.message


# --- 7. --full-size widths whose product is no real tensor --------------------------------------

HUGE_WIDTHS = {"hidden_size": 1_000_000, "num_attention_heads": 1_000_000,
               "kv_channels": 1_000_000}


def huge_inputs(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "big.yaml").write_text("num_layers: 2\n" + "".join(
        f"{key}: {value}\n" for key, value in HUGE_WIDTHS.items()))
    (tmp_path / "big.sh").write_text("torchrun pretrain_gpt.py --num-layers 2 " + " ".join(
        f"--{key.replace('_', '-')} {value}" for key, value in HUGE_WIDTHS.items()) + "\n")
    dump = bridge_dump(tmp_path)
    return {"yaml": [str(tmp_path / "big.yaml")], "launch script": [str(tmp_path / "big.sh")],
            "bridge": [dump, *(f"++model.{key}={value}" for key, value in HUGE_WIDTHS.items())]}


@pytest.mark.parametrize("route", ["yaml", "launch script", "bridge"])
def test_full_size_widths_past_any_real_tensor_are_exit_2_naming_the_fields(route, tmp_path,
                                                                             monkeypatch):
    import qaudit.run.audit as run_audit

    built = []
    monkeypatch.setattr(run_audit, "build_model", lambda *a, **k: built.append(a))
    err = one_error_line(cli("check", *huge_inputs(tmp_path)[route], "--full-size", *SMALL_RUN),
                         "--full-size", "linear_qkv", "hidden_size 1000000", "kv_channels")
    assert "3e+18 elements" in err and not built


@pytest.mark.parametrize("config", sorted((REPO / "configs").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_bundled_config_is_within_the_tensor_bound(config):
    from qaudit.commands.inputs import load_inputs
    from qaudit.plan.full_size import MAX_TENSOR_ELEMENTS, largest_weights

    loaded, _ = load_inputs(str(config))
    biggest = max(elements for _, elements in largest_weights(loaded))
    assert 0 < biggest <= MAX_TENSOR_ELEMENTS / 30


# --- 6. directory mode: unreadable entries and directories, names in every format -------------

def test_unreadable_entries_are_named_and_the_rest_audited(tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "good.yaml").write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n")
    os_links = {"loop1.yaml": "loop2.yaml", "loop2.yaml": "loop1.yaml",
                "dangling.yaml": "nowhere.yaml", "self.yaml": "self.yaml"}
    for name, target in os_links.items():
        (folder / name).symlink_to(target)
    (folder / "sub.yaml").mkdir()  # a directory named like a config: not one
    code, out, err = cli("check", str(folder), *SMALL_RUN)
    assert code == 2 and "Traceback" not in err and "internal error" not in err, err
    assert f"exit 0  {folder}/good.yaml" in out
    for name in os_links:
        assert f"exit 2  {folder}/{name}: cannot open file" in out or \
            f"exit 2  {folder}/{name}: file not found" in out, out
    assert "sub.yaml" not in out
    assert "Too many levels of symbolic links" in err and "not found" not in err.replace(
        "dangling.yaml: file not found", "")


def test_an_unreadable_directory_is_exit_2(tmp_path, monkeypatch):
    import qaudit.commands.targets as targets

    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "a.yaml").write_text("num_layers: 2\n")

    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(targets.os, "scandir", refused)  # root reads any directory
    one_error_line(cli("check", str(folder), *SMALL_RUN), str(folder),
                   "cannot read the directory: Permission denied")


HOSTILE_NAMES = ["a\n::error::PWNED.yaml", "b\r::warning::PWNED.yaml", "c\n  ::error::PWNED.yaml",
                 "d ##[error]PWNED.yaml", "e\u2028::error::PWNED.yaml", "f\x1b[31m::PWNED.yaml"]


@pytest.mark.parametrize("fmt", ["github", "table", "markdown", "json", "sarif"])
def test_file_names_never_start_a_line_of_qaudits_own(fmt, tmp_path):
    from qaudit.render.defuse import has_command_line

    folder = tmp_path / "configs"
    folder.mkdir()
    for name in HOSTILE_NAMES:
        (folder / name).write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n")
    (folder / "z-bad.yaml").write_text("num_layers: [\n")
    code, out, err = cli("check", str(folder), *SMALL_RUN, "-f", fmt)
    assert code == 2 and "Traceback" not in err, err
    for line in (out + err).splitlines():
        if fmt == "github" and line.startswith(("::notice file=", "::warning file=",
                                                "::error file=")):
            continue  # qaudit's own annotations, their file property escaped (%0A, %3A)
        assert not has_command_line(line), line
    for name in HOSTILE_NAMES[:3]:  # each name's summary stays on its line
        shown = name.replace("\n", "\\n").replace("\r", "\\r")
        if fmt in ("github", "table"):
            assert shown in out, (shown, out[-2000:])


# --- 2. reading an upstream Megatron's behaviour: memoized, within a node budget --------------

def count_walks(monkeypatch) -> dict:
    from qaudit.plan.upstream import detect

    counted = {"nodes": 0}
    original = detect._Functions.walk

    def walk(self, node):
        for found in original(self, node):
            counted["nodes"] += 1
            yield found

    monkeypatch.setattr(detect._Functions, "walk", walk)
    return counted


@pytest.mark.parametrize("fan_out", [24, 30])
def test_helpers_called_many_ways_deep_are_read_once_each(fan_out, tmp_path, monkeypatch):
    """fan_out**4 paths through the helpers (59 s at 24 before): each helper is walked once
    per (names, depth), so the nodes visited grow with the file, not the paths."""
    from hostile_inputs4 import exponential_megatron
    from qaudit.plan.upstream.target import resolve_megatron

    tree = exponential_megatron(tmp_path / "m", fan_out)
    counted = count_walks(monkeypatch)
    target = resolve_megatron(str(tree))
    assert target.behaviour.passing == "config"
    source_nodes = sum(1 for path in tree.rglob("*.py") for _ in ast_walk(path))
    assert counted["nodes"] <= 20 * source_nodes


def ast_walk(path: Path):
    import ast

    return ast.walk(ast.parse(path.read_text()))


def test_past_the_node_budget_is_could_not_read_and_a_note(tmp_path, monkeypatch):
    from hostile_inputs4 import exponential_megatron
    from qaudit.errors import InputError
    from qaudit.plan.upstream import detect
    from qaudit.plan.upstream.target import resolve_megatron

    tree = exponential_megatron(tmp_path / "m", 30)
    monkeypatch.setattr(detect, "MAX_READ_NODES", 2_000)
    counted = count_walks(monkeypatch)
    with pytest.raises(InputError, match="cannot read its behaviour .*more than 2000 syntax"):
        resolve_megatron(str(tree))
    assert counted["nodes"] <= 2_001
    target = resolve_megatron("auto", search_path=[str(tree)])
    assert target.source == "assumed" and "more than 2000 syntax-tree nodes" in target.note


def test_the_real_megatron_reads_well_within_the_budget(monkeypatch):
    import os

    from qaudit.plan.upstream import detect

    where = os.environ.get("QAUDIT_TEST_MEGATRON_CORE")
    if not where:
        pytest.skip("QAUDIT_TEST_MEGATRON_CORE not set (scripts/fetch-megatron DIR)")
    counted = count_walks(monkeypatch)
    detect.read_behaviour(detect.megatron_at(Path(where)))
    assert 1_000 < counted["nodes"] <= detect.MAX_READ_NODES / 20


@pytest.mark.parametrize("option", ["--megatron", "--te"])
@pytest.mark.parametrize("spec", ["~nosuchuser/x", "~nosuchuser"])
def test_a_home_that_cannot_be_found_is_exit_2(option, spec):
    one_error_line(cli("check", str(REPO / "configs" / "gpt-small-bf16.yaml"), option, spec,
                       *SMALL_RUN), option, "cannot expand '~'")


# --- 9. launch scripts: `[[` nesting refused before tree-sitter parses; --help under --cross-check

NESTED_TESTS = {
    "[[ ( nested 50,000 deep": "[[ ( " * 50_000 + "a" + " ) ]]" * 50_000,
    "if [[ ( nested": "if [[ ( " * 20_000 + "a" + " ) ]]; then :; fi" * 20_000,
    "[[ [[ nested": "[[ " * 20_000 + "a" + " ]]" * 20_000,
    "[[ a && ( nested": "[[ a && ( " * 20_000 + "b" + " ) ]]" * 20_000,
    "unclosed [[ ( lines": "[[ ( a\n" * 50_000,
    "cat <( [[ ( nested": "cat <( [[ ( " * 20_000 + "a" + " ) ]] )" * 20_000,
    "through quoted $( ), a level a line": "[[ ( \"$(\n" * 20_000 + "a" + " )\" ) ]]" * 20_000,
}


@pytest.mark.parametrize("text", NESTED_TESTS.values(), ids=NESTED_TESTS.keys())
def test_nested_tests_are_refused_before_tree_sitter_parses(text, tmp_path, monkeypatch):
    from qaudit.load.sources import shell_tree

    parsed = []

    class Counting:
        def parse(self, source):
            parsed.append(len(source))
            return real.parse(source)

    real = shell_tree._PARSER
    monkeypatch.setattr(shell_tree, "_PARSER", Counting())
    script = tmp_path / "nested.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 2\n" + text + "\n")
    one_error_line(cli("check", str(script), *SMALL_RUN), "nested.sh", "`[[` tests open at once")
    assert parsed == []


def test_real_scripts_nest_no_test(tmp_path):
    """The corpus and bundled scripts open at most one `[[` at a time."""
    from qaudit.load.sources.shell_tree import MAX_TEST_NESTING, _TEST_BRACKET

    scripts = [*Path("/work/shared/corpus").rglob("*.sh"), *(REPO / "configs").rglob("*.sh"),
               *(REPO / "tests").rglob("*.sh")]
    deepest = 0
    for script in scripts:
        depth = 0
        for bracket in _TEST_BRACKET.finditer(script.read_bytes()):
            depth = depth + 1 if bracket.group(1) else max(0, depth - 1) if bracket.group(2) \
                else depth
            deepest = max(deepest, depth)
    assert deepest <= 1 < MAX_TEST_NESTING
    nested = ("if [[ -f x ]] && [[ ( $A == b ) ]]; then echo '[[ [[ [[' \" [[ ( \"; fi\n"
              "# usage: [[ [[ [[\n") * 200
    (tmp_path / "ok.sh").write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                                    "--num-attention-heads 4\n" + nested)
    code, _, err = cli("check", str(tmp_path / "ok.sh"), *SMALL_RUN)
    assert code in (0, 1), err


@pytest.mark.parametrize("word", ["--help", "-h"])
def test_help_is_upstreams_refusal_before_its_parser_runs(word):
    from qaudit.crosscheck.upstream_config import ArgumentsRejected, _parse

    class Untouched:
        def parse_args(self, **_):
            raise AssertionError("upstream's parser ran")

    with pytest.raises(ArgumentsRejected, match=f"{word} prints Megatron's help"):
        _parse(Untouched(), ["--num-layers", "2", word])
    with pytest.raises(AssertionError, match="parser ran"):  # a value after `--` is no option
        _parse(Untouched(), ["--num-layers", "2", "--", word])


@pytest.mark.slow
def test_help_in_a_launch_script_under_cross_check_is_qa030(megatron, tmp_path):
    script = tmp_path / "help.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 4 --help\n")
    code, out, err = cli("check", str(script), "--cross-check", *SMALL_RUN, "-f", "json")
    assert code == 1, err
    assert any(f["rule"] == "QA030" and "--help" in f["message"]
               for f in json.loads(out)["findings"])


# --- 10. expansions sized before they are built: the hybrid MTP pattern composition -----------

def hybrid_dump(tmp_path: Path, mtp_pattern: str, depths: int) -> str:
    from test_bridge import ConfigContainer, serialized

    document = serialized(ConfigContainer())
    document["model"].update(mtp_hybrid_override_pattern=mtp_pattern, mtp_num_layers=depths,
                             mtp_use_repeated_layer=False)
    path = tmp_path / "hybrid.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def _refused_with_peak(argv: list[str], *words: str) -> tuple[str, int]:
    """One exit-2 line holding `words`, and the peak of what Python allocated meanwhile."""
    import tracemalloc

    tracemalloc.start()
    try:
        err = one_error_line(cli(*argv), *words)
        return err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("length,depths", [(200_000, 1000), (1_000, 1024), (2_100, 1)])
def test_an_mtp_pattern_composition_past_the_layers_is_refused_unbuilt(length, depths, tmp_path,
                                                                        monkeypatch):
    """The composed pattern's length is computed, not built: a 200 KB pattern x 1,000 depths
    (200 MB once built; 900 KB peaked at 1.85 GB) is refused naming the key, and nothing near
    that size is allocated on the way (counted with tracemalloc)."""
    path = hybrid_dump(tmp_path, "*E" * (length // 2), depths)
    err, peak = _refused_with_peak(["check", path, *SMALL_RUN], "mtp_hybrid_override_pattern",
                                   "would be")
    assert f"{depths} x {length // 2 * 2} characters" in err
    assert peak < 100 * 2**20


def test_a_real_mtp_pattern_still_composes(tmp_path):
    code, _, err = cli("check", hybrid_dump(tmp_path, "*E", 2), *SMALL_RUN)
    assert code in (0, 1), err


LEGACY_MTP = ("#!/bin/bash\ntorchrun pretrain_mamba.py --num-layers 4 --hidden-size 256 "
              "--num-attention-heads 4 --hybrid-override-pattern M*M- --mtp-num-layers {depths} "
              "--mtp-hybrid-override-pattern {mtp}\n")


@pytest.mark.parametrize("length,depths", [(40_000, 1000), (1_000, 1024), (4, 2**31)])
def test_a_launch_scripts_legacy_mtp_pattern_is_sized_before_it_is_composed(length, depths,
                                                                            tmp_path):
    """Megatron appends --mtp-hybrid-override-pattern once per depth: a 900 KB pattern x 1,024
    depths peaked at 1.8 GB before its exit 2 (2**31 depths could not be built). The length is
    computed first, and nothing near the composed size (40 MB here) is allocated (counted
    with tracemalloc)."""
    script = tmp_path / "train.sh"
    script.write_text(LEGACY_MTP.format(depths=depths, mtp="M" * length))
    err, peak = _refused_with_peak(["check", str(script), *SMALL_RUN],
                                   "--mtp-hybrid-override-pattern", "would be")
    assert f"{depths} x {length} characters" in err
    assert peak < 16 * 2**20


def test_a_launch_scripts_legacy_mtp_pattern_still_composes(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(LEGACY_MTP.format(depths=2, mtp="M-"))  # composed: M*M-/M-/M-
    code, out, err = cli("check", str(script), *SMALL_RUN, "-f", "json")
    assert code in (0, 1), err
    names = [module["name"] for module in json.loads(out)["modules"]]
    assert [n for n in names if n.startswith("mtp.") and n.endswith(".mlp.linear_fc1")] == [
        f"mtp.layers.{depth}.mtp_model_layer.layers.1.mlp.linear_fc1" for depth in (0, 1)]


@pytest.mark.parametrize("values", ["${P}" * 400, '["' + '", "'.join(["${P}"] * 400) + '"]'])
def test_model_args_placeholders_are_sized_before_they_are_filled(values, tmp_path):
    """Each `${P}` of a functional-test YAML copies ENV_VARS' P: 100,000 of them with a 500 KB
    P asked for 50 GB (MemoryError, exit 3). The substituted size (40 MB here) is counted
    first: exit 2 naming the flag, nothing near that size allocated (counted with
    tracemalloc)."""
    import tracemalloc

    path = tmp_path / "model_config.yaml"
    path.write_text(f"ENV_VARS:\n  P: {'M' * 100_000}\nMODEL_ARGS:\n  --num-layers: 2\n"
                    f"  --hidden-size: 64\n  --num-attention-heads: 4\n"
                    f"  --hybrid-override-pattern: {values}\n")
    tracemalloc.start()
    try:
        one_error_line(cli("check", str(path), *SMALL_RUN), "--hybrid-override-pattern",
                       "more than 2,097,152 characters")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20


def test_model_args_placeholders_within_the_budget_are_filled(tmp_path):
    path = tmp_path / "model_config.yaml"
    path.write_text("ENV_VARS:\n  L: 2\n  P: " + "M" * 1000 + "\nMODEL_ARGS:\n"
                    "  --num-layers: ${L}\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
                    "  --recompute-modules: [" + ", ".join(['"${P}"'] * 1000) + "]\n")
    code, _, err = cli("check", str(path), *SMALL_RUN)
    assert code == 2 and "unknown recompute module 'MMMM" in err  # filled: 1 MB of words read
