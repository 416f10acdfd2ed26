"""Generators of hostile inputs for the classes of issue 38 (round four), one per class, for
`scripts/fuzz` (tests/test_hostile_round4.py tests each class directly):

- `overrides`: Bridge override arguments and files past the loader's bounds (alias ladders,
  huge integers, bad tagged values, deep keys and flow nesting, many arguments, one file
  named many times): exit 0-2, never 3;
- `nodes`: Bridge sections made only of `_target_`/`_call_`/`_args_`/`_partial_`/`_name_`
  (model, mixed_precision), by file or override: exit 2 naming the key;
- `full_size`: widths each within their bound whose products pass any real tensor, on the
  three routes, with --full-size: exit 2 naming the fields;
- `directory`: a directory of configs with link loops, dangling links, directories named like
  configs, names holding newlines and workflow commands, in every format: exit 2 at most,
  no line of qaudit's own starting a command;
- `detection`: a Megatron tree (--megatron PATH or on the module path) whose helpers call each
  other N ways deep, or `~nosuchuser` paths: exit 0-2 within the time limit;
- `expansion`: Bridge hybrid dumps whose MTP pattern and depths multiply to a huge
  composition, launch scripts nesting `[[ (` deep (one line or a level a line), `--help` in a
  launch script (without --cross-check: tests/test_hostile_round4.py runs it with one): exit
  0-2, never 3.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import yaml

from hostile_inputs import BASE, SMALL_RUN, Case

CONTAINER = "megatron.bridge.training.config.ConfigContainer"


def bridge_document(**sections) -> dict:
    return {"_target_": CONTAINER,
            "model": {"_target_": "megatron.bridge.models.gpt_provider.GPTModelProvider",
                      "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                      "ffn_hidden_size": 128, "add_bias_linear": False,
                      "params_dtype": {"_call_": False, "_target_": "torch.bfloat16"}},
            "train": {"_target_": "megatron.bridge.training.config.TrainingConfig",
                      "train_iters": 10},
            "mixed_precision": None, **sections}


def write_dump(folder: Path, name: str = "dump.yaml", **sections) -> str:
    (folder / name).write_text(yaml.safe_dump(bridge_document(**sections), sort_keys=False))
    return name


def alias_ladder(levels: int, width: int = 10) -> str:
    """`[&l0 [0..w], &l1 [*l0 x w], ...]`: about width**levels values from a few hundred bytes."""
    parts = ["&l0 [" + ", ".join(str(i) for i in range(width)) + "]"]
    for level in range(1, levels):
        parts.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "[" + ", ".join(parts) + "]"


# --- overrides ----------------------------------------------------------------------------

def _override_argument(r: random.Random) -> str:
    key = r.choice(["model.num_layers", "model.x", "++train.x", "+train.new", "model.hidden_size"])
    shapes = [
        lambda: alias_ladder(r.randrange(2, 9), r.randrange(2, 12)),
        lambda: str(r.randrange(1, 10)) * r.choice([50, 99, 100, 101, 4300, 5000]),
        lambda: "[" + r.choice(["!!timestamp 2001-13-45", "!!bool maybe", "!!int '0x'",
                                "!!float abc", "!!map [1, 2]", "!!binary ###",
                                "!!python/object/apply:os.system [true]"]) + "]",
        lambda: "[" * r.choice([10, 63, 64, 65, 5000]) + "]" * r.choice([0, 10, 64]),
        lambda: "{" + ", ".join(f"k{i}: {i}" for i in range(r.randrange(1, 2000))) + "}",
        lambda: "[&a 1, " + ", ".join(["*a"] * r.choice([50, 99, 100, 101, 500])) + "]",
        lambda: r.choice(["${oc.env:HOME}", "1,2", "f(x)", "'quoted'", "null", "TRUE", "1e999",
                          "nan", "-0", "+12_000"]),
        # Hydra's grammar near its bounds: long lists and strings, escapes, quotes, deep
        # mappings, characters it has no token for.
        lambda: "[" + ",".join(["0"] * r.choice([1000, 100_000, 400_000])) + "]",
        lambda: r.choice(["a ", "\\,", "\\ ", "x:", "1.", "$%", "'q',"]) * r.choice([10, 50_000]),
        lambda: "{a: " * r.choice([10, 64, 65, 3000]) + "1" + "}" * r.choice([0, 10, 65]),
        lambda: "'" + "\\" * r.randrange(0, 9) + r.choice(["'", "x'", "\\'", ""]),
        lambda: "".join(r.choice("[]{}(),:='\"\\ #&!é$") for _ in range(r.randrange(1, 40))),
    ]
    value = r.choice(shapes)()
    if r.random() < 0.15:
        depth = r.choice([10, 63, 64, 65, 200, 5000])
        key = ("++" if r.random() < 0.5 else "") + "model." + ".".join(["a"] * depth)
    return f"{key}={value}"


def gen_overrides(r: random.Random, folder: Path) -> Case:
    dump = write_dump(folder)
    argv = ["check", dump, *SMALL_RUN]
    shape = r.choice(["arguments", "many", "files"])
    if shape == "arguments":
        argv += [_override_argument(r) for _ in range(r.randrange(1, 4))]
    elif shape == "many":
        count = r.choice([100, 1000, 20_000])
        argv += [f"++train.x{i}={i}" for i in range(count)]
        if r.random() < 0.5:
            argv += [f"++train.y{i}={alias_ladder(4)}" for i in range(r.randrange(5, 120))]
    else:
        (folder / "o.yaml").write_text(r.choice([
            "train:\n  train_iters: 5\n", "model:\n  num_layers: 3\n",
            f"model:\n  x: {alias_ladder(5)}\n", "ConfigContainer:\n  train:\n    train_iters: 2\n",
            "- 1\n", "model: {_target_: x.Y}\n"]))
        argv += ["--override", "o.yaml"] * r.choice([1, 2, 200])
    return Case("overrides", argv, allowed=(0, 1, 2), unchanged=[dump], seconds=60,
                note=f"{shape}: {' '.join(a[:40] for a in argv[6:9])}")


# --- nodes --------------------------------------------------------------------------------

NODE_KEYS = ["_call_", "_args_", "_partial_", "_name_"]


def _node(r: random.Random) -> dict:
    node: dict = {"_target_": r.choice(["x.Y", "os.system", "torch.bfloat16",
                                        "megatron.bridge.models.gpt_provider.GPTModelProvider",
                                        "megatron.bridge.training.mixed_precision."
                                        "MixedPrecisionConfig"])}
    for key in r.sample(NODE_KEYS, r.randrange(0, 3)):
        node[key] = {"_call_": r.choice([True, False]), "_args_": [1],
                     "_partial_": True, "_name_": "attn"}[key]
    return node


def gen_nodes(r: random.Random, folder: Path) -> Case:
    section = r.choice(["model", "mixed_precision"])
    node = _node(r)
    route = r.choice(["file", "override file", "argument"])
    argv = ["check"]
    if route == "file":
        argv.append(write_dump(folder, **{section: node}))
    else:
        argv.append(write_dump(folder))
        if route == "override file":
            (folder / "o.yaml").write_text(yaml.safe_dump({section: node}))
            argv += ["--override", "o.yaml"]
        else:
            inner = ", ".join(f"{k}: {v}" for k, v in node.items())
            argv.append(f"++{section}={{{inner}}}")
    # A model's node merges key by key through an argument; a bare MixedPrecisionConfig is its
    # defaults: both may audit. Every other shape is exit 2 naming the key.
    return Case("nodes", [*argv, *SMALL_RUN], allowed=(0, 1, 2), seconds=60,
                note=f"{section} via {route}: {node}")


# --- full_size ----------------------------------------------------------------------------

WIDTH_FIELDS = ["hidden_size", "num_attention_heads", "kv_channels", "ffn_hidden_size",
                "vocab_size", "num_query_groups"]


def gen_full_size(r: random.Random, folder: Path) -> Case:
    widths = {"hidden_size": r.choice([64, 4096, 65536, 1_000_000])}
    heads = r.choice([4, 1024, 1_000_000])
    widths["num_attention_heads"] = heads
    widths["kv_channels"] = r.choice([16, 128, 1_000_000])
    for field in r.sample(WIDTH_FIELDS[3:], r.randrange(0, 3)):
        widths[field] = r.choice([heads, 1_000_000, 262_144])
    if widths.get("num_query_groups", 0) > heads:
        widths["num_query_groups"] = heads
    route = r.choice(["yaml", "launch script", "bridge"])
    if route == "yaml":
        (folder / "big.yaml").write_text("num_layers: 2\n" + "".join(
            f"{key}: {value}\n" for key, value in widths.items()))
        target = ["big.yaml"]
    elif route == "launch script":
        (folder / "big.sh").write_text("torchrun pretrain_gpt.py --num-layers 2 " + " ".join(
            f"--{key.replace('_', '-')} {value}" for key, value in widths.items()) + "\n")
        target = ["big.sh"]
    else:
        target = [write_dump(folder), *(f"++model.{k}={v}" for k, v in widths.items())]
    return Case("full_size", ["check", *target, "--full-size", *SMALL_RUN], allowed=(0, 1, 2),
                seconds=120, note=f"{route}: {widths}")


# --- directory ----------------------------------------------------------------------------

HOSTILE_NAMES = ["a\n::error::PWNED.yaml", "b\r::warning::PWNED.yaml", "c\n  ::error::x.yaml",
                 "d ##[error]PWNED.yaml", "e\u2028::error::PWNED.yaml", "f\x1b[31m.yaml",
                 "g\u202e.sh", "h%0A::error::x.yaml"]


def gen_directory(r: random.Random, folder: Path) -> Case:
    configs = folder / "configs"
    configs.mkdir()
    (configs / "good.yaml").write_text(BASE)
    kinds = []
    for i in range(r.randrange(1, 5)):
        kind = r.choice(["loop", "self", "dangling", "dir", "name", "name", "bad", "fifo"])
        kinds.append(kind)
        if kind == "loop":
            os.symlink(f"l{i}b.yaml", configs / f"l{i}a.yaml")
            os.symlink(f"l{i}a.yaml", configs / f"l{i}b.yaml")
        elif kind == "self":
            os.symlink(f"s{i}.yaml", configs / f"s{i}.yaml")
        elif kind == "dangling":
            os.symlink("nowhere", configs / f"d{i}.yaml")
        elif kind == "dir":
            (configs / f"dir{i}.yaml").mkdir()
        elif kind == "name":
            (configs / (r.choice(HOSTILE_NAMES).replace(".", f"{i}.", 1))).write_text(BASE)
        elif kind == "bad":
            (configs / f"bad{i}.yaml").write_text("num_layers: [\n")
        else:
            os.mkfifo(configs / f"fifo{i}.yaml")
    fmt = r.choice(["table", "github", "markdown", "json", "sarif"])
    return Case("directory", ["check", "configs", *SMALL_RUN, "-f", fmt], allowed=(0, 1, 2),
                seconds=120, several=True, note=f"{kinds} -f {fmt}")


# --- detection ----------------------------------------------------------------------------

def exponential_megatron(root: Path, fan_out: int, depth: int = 4) -> Path:
    """A Megatron tree whose TE wrappers' forward passes `h0(self)`, each helper calling the
    next `fan_out` times with the module: fan_out**depth paths through the helpers."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_megatron_versions import write_megatron

    write_megatron(root)
    calls = lambda level, arg: " or ".join([f"h{level}({arg})"] * fan_out)  # noqa: E731
    helpers = "".join(f"def h{i}(m):\n    return {calls(i + 1, 'm')}\n\n" for i in range(depth))
    # The last helper never asks the module (so every path is explored); forward's test of
    # the config decides the rule ("config").
    helpers += f"def h{depth}(m):\n    return m.is_first_microbatch\n\n"
    wrappers = "".join(
        f"class {cls}:\n    def forward(self, x):\n"
        f"        return f(x, is_first_microbatch=self.config.fp8 and ({calls(0, 'self')}))\n\n"
        for cls in ("TELinear", "TELayerNormColumnParallelLinear", "TEGroupedLinear"))
    (root / "megatron/core/extensions/transformer_engine.py").write_text(
        helpers + "class TEQuantizationParams:\n    pass\n\n" + wrappers)
    return root


def gen_detection(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE)
    shape = r.choice(["path", "auto", "home"])
    if shape == "home":
        option = r.choice(["--megatron", "--te"])
        spec = r.choice(["~nosuchuser/x", "~nosuchuser", "~" + "u" * 300 + "/x"])
        return Case("detection", ["check", "cfg.yaml", option, spec, *SMALL_RUN],
                    allowed=(2,), seconds=60, note=f"{option} {spec}")
    fan_out = r.choice([2, 8, 24, 30, 60])
    tree = exponential_megatron(folder / "tree", fan_out, r.choice([3, 4, 6]))
    if shape == "path":
        return Case("detection", ["check", "cfg.yaml", "--megatron", str(tree), *SMALL_RUN],
                    allowed=(0, 1, 2), seconds=60, note=f"--megatron PATH, fan-out {fan_out}")
    return Case("detection", ["check", "cfg.yaml", *SMALL_RUN], allowed=(0, 1), seconds=60,
                sys_path=[str(tree)], note=f"auto, fan-out {fan_out}")


# --- expansion ----------------------------------------------------------------------------

def _hybrid_document(mtp_pattern: str, depths: int, repeated: bool) -> dict:
    model = {"_target_": "megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider",
             "hybrid_layer_pattern": "MEM*EMEME", "num_layers": 9, "hidden_size": 256,
             "ffn_hidden_size": 512, "num_attention_heads": 4, "num_query_groups": 2,
             "kv_channels": 64, "mamba_head_dim": 32, "mamba_num_groups": 8,
             "mamba_num_heads": 16, "num_moe_experts": 8, "moe_ffn_hidden_size": 128,
             "moe_grouped_gemm": True, "moe_router_topk": 2,
             "moe_shared_expert_intermediate_size": 256,
             "mtp_hybrid_override_pattern": mtp_pattern, "mtp_num_layers": depths,
             "mtp_use_repeated_layer": repeated, "is_hybrid_model": True}
    return {"_target_": CONTAINER, "model": model, "mixed_precision": "bf16_mixed"}


def gen_expansion(r: random.Random, folder: Path) -> Case:
    shape = r.choice(["mtp", "tests", "help"])
    if shape == "mtp":
        length = r.choice([2, 100, 1_000, 50_000, 400_000])
        depths = r.choice([0, 1, 2, 100, 1024, 1025, 2**31])
        (folder / "hybrid.yaml").write_text(yaml.safe_dump(_hybrid_document(
            "*E" * (length // 2), depths, r.random() < 0.5), sort_keys=False))
        return Case("expansion", ["check", "hybrid.yaml", *SMALL_RUN], allowed=(0, 1, 2),
                    seconds=120, note=f"mtp pattern {length} x {depths}")
    if shape == "tests":
        depth = r.choice([10, 49, 50, 51, 1_000, 20_000, 50_000])
        level = r.choice(["[[ ( ", "if [[ ( ", "[[ a && ( ", "[[ ", "cat <( [[ ( "])
        close = {"[[ ( ": " ) ]]", "if [[ ( ": " ) ]]; then :; fi", "[[ a && ( ": " ) ]]",
                 "[[ ": " ]]", "cat <( [[ ( ": " ) ]] )"}[level]
        tail = close * depth if r.random() < 0.7 else ""
        sep = "\n" if r.random() < 0.3 else ""
        (folder / "nested.sh").write_text("torchrun pretrain_gpt.py --num-layers 2 "
                                          "--hidden-size 64 --num-attention-heads 4\n"
                                          + (level + sep) * depth + "a" + tail + "\n")
        return Case("expansion", ["check", "nested.sh", *SMALL_RUN], allowed=(0, 1, 2),
                    seconds=120, note=f"{level!r} x {depth}")
    (folder / "help.sh").write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                                    f"--num-attention-heads 4 {r.choice(['--help', '-h'])}\n")
    return Case("expansion", ["check", "help.sh", *SMALL_RUN], allowed=(0, 1, 2), seconds=60,
                note="--help in a launch script")


FAMILIES4 = {"overrides": gen_overrides, "nodes": gen_nodes, "full_size": gen_full_size,
             "directory": gen_directory, "detection": gen_detection,
             "expansion": gen_expansion}


# --- the cross-check's result channel (qaudit/crosscheck/plain.py; scripts/fuzz-channel) -------

def _conforming(hint, r: random.Random, depth: int = 0):
    """A value of the annotated type, as the worker would send it (records of RESULT_KINDS)."""
    import dataclasses
    import types
    import typing

    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _conforming(r.choice(arguments), r, depth)
    if hint is type(None) or hint is None:
        return None
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: _conforming(hints[f.name], r, depth + 1)
                       for f in dataclasses.fields(hint) if f.init})
    if origin in (list, tuple, dict) and depth > 6:
        return origin()
    if origin is list:
        return [_conforming(arguments[0], r, depth + 1) for _ in range(r.randrange(3))]
    if origin is tuple:
        if len(arguments) == 2 and arguments[1] is Ellipsis:
            return tuple(_conforming(arguments[0], r, depth + 1) for _ in range(r.randrange(3)))
        return tuple(_conforming(a, r, depth + 1) for a in arguments)
    if origin is dict:
        return {_conforming(arguments[0], r, depth + 1): _conforming(arguments[1], r, depth + 1)
                for _ in range(r.randrange(3))}
    return {bool: lambda: r.random() < 0.5, int: lambda: r.randrange(-3, 1 << 20),
            float: lambda: r.choice([0.5, 1e300, float("nan"), float("inf")]),
            str: lambda: r.choice(["", "linear_fc1", "\u202e", "a\nb"])}.get(
                hint, lambda: None)()


def _mutate(tree, r: random.Random, kinds: list[str]):
    """One hostile change somewhere in an encoded tree (JSON values)."""
    if isinstance(tree, dict) and "record" in tree and r.random() < 0.5:
        fields = tree["fields"]
        change = r.randrange(6)
        if change == 0:
            tree["record"] = r.choice(["Finding", "os._exit", 5, None, kinds[0].lower()])
        elif change == 1 and fields:
            fields[r.choice(sorted(fields))] = r.choice(
                [None, "x", 1, 1.5, [], {"tuple": [1]}, {"map": []}, {"record": "x"}])
        elif change == 2:
            fields[r.choice(["__class__", "__reduce__", "zzz"])] = 1
        elif change == 3 and fields:
            fields.pop(r.choice(sorted(fields)))
        elif change == 4:
            tree["fields"] = r.choice([[], "x", None, {"map": []}])
        else:
            tree["extra"] = 1
        return tree
    children = (list(tree.values()) if isinstance(tree, dict) else
                tree if isinstance(tree, list) else [])
    if children and r.random() < 0.8:
        _mutate(r.choice(children), r, kinds)
        return tree
    if isinstance(tree, list):
        tree.append(r.choice([{"map": [[[1], 2]]}, {"map": [[{"tuple": [[1]]}, 2]]},
                              {"map": [1, 2]}, {"tuple": "x"}, {"record": None, "fields": {}},
                              {"other": 1}, {}]))
    return tree


def channel_payload(r: random.Random) -> bytes:
    """What a worker (or one planted in the user's Megatron) might send as its result: a
    well-formed outcome of qaudit's result kinds with one hostile change, or bytes of a
    hostile shape (not JSON, not ASCII, huge integers, deep nesting, wrong outcome kinds)."""
    import json

    from qaudit.crosscheck import RESULT_KINDS, UpstreamSide, plain

    shape = r.randrange(11)
    if shape == 10:  # round five: many small containers or elements, around the counted bounds
        many = r.choice([plain.MAX_CONTAINERS - 2, plain.MAX_CONTAINERS + 1,
                         plain.MAX_ELEMENTS // 2, plain.MAX_ELEMENTS + 1])
        item = r.choice([b"[]", b"{}", b"0", b'""', b'{"map": []}'])
        return b'["value", [' + b",".join([item] * many) + b"]]"
    if shape == 0:
        return r.choice([b"", b"\x80\x81", b"{", b"nan", b"[" * 100_000 + b"]" * 100_000,
                         b"1" * 5_000, b'"\\ud800"', b"[1e999999]", "é".encode()])
    if shape == 1:
        depth = r.choice([39, 40, 41, 42, 500])
        return (b'["value", ' + b"[" * depth + b"1" + b"]" * depth + b"]")
    if shape == 2:
        return json.dumps(r.choice([["raised", 5], ["qaudit", {"x": 1}], ["value"],
                                    ["other", 1], {"value": 1}, "value", None,
                                    ["qaudit", ["InputError", "m"]],
                                    ["qaudit", {"class": "InputError", "message": 5}],
                                    ["qaudit", {"class": "InputError", "message": "m",
                                                "line": "1", "file": ["x"], "key": None}],
                                    ["qaudit", {"class": "os._exit", "message": "m"}]])).encode()
    kinds = [kind.__name__ for kind in RESULT_KINDS]
    value = _conforming(r.choice([UpstreamSide, *RESULT_KINDS]), r)
    tree = json.loads(plain.encode(["value", value], RESULT_KINDS))
    if shape < 9:
        tree = _mutate(tree, r, kinds)
    return json.dumps(tree).encode()
