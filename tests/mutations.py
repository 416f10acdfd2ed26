"""Hostile inputs: mutations of the bundled configs and recipes, and the checks every run must pass.

Shared by tests/test_hostile.py (hypothesis draws the plans) and scripts/fuzz (a seeded
`random.Random` draws them), so that a crash found by a long campaign replays in the tests.
Test tooling, kept out of the `qaudit` package on purpose.

A `Plan` names a base config, a base recipe (or none), how the recipe is given (`--recipe` or
the config's `quant_recipe`) and a list of mutations, each `(op, target, seed)`. `build_case`
turns a plan into file contents, deterministically. Mutations work at three levels:

- on the parsed tree: drop, add, rename and retype keys, corrupt scalars, nulls, swapped values,
  subtrees grafted from another document;
- on the YAML text: tags (Python object tags among them), anchors and aliases (bombs, cycles,
  merge keys), spliced or truncated documents, numbers PyYAML cannot or should not convert,
  deep nesting, very long strings, corrupted characters and lines;
- on the bytes: encodings, BOMs, NUL, invalid UTF-8, line endings.

Base configs are shrunk (at most 4 layers and 8 experts, the MoE pattern kept) so that the ones
that still load are audited in well under a second; the DeepSeek-V3 shapes take ~20 s unshrunk.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

REPO = Path(__file__).resolve().parent.parent
CONFIG_FILES = sorted((REPO / "configs").glob("*.yaml"))
RECIPE_FILES = sorted((REPO / "configs" / "recipes").glob("*.yaml"))

# A module that must never be imported: the custom recipes below name it as their factory.
# `install_marker_module` puts a real one on sys.path; importing it leaves a file behind.
MARKER_MODULE = "qaudit_fuzz_marker"
MARKER_SOURCE = """\
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("imported")


def factory(role=None):
    Path(__file__).with_name("CALLED").write_text(str(role))
"""
# What a Python-tag payload would create if YAML ever executed it ({dir} is the case folder).
PWNED = "PWNED"

# Recipes beyond the two bundled ones, so that every recipe field gets mutated.
EXTRA_RECIPES = {
    "mixed": """\
configs:
  mx:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp8_quantization_recipe: mxfp8
      fp8_format: hybrid
      override_nonquantized_autocast: true
    evaluation_recipe: {}
  fp4:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp4_quantization_recipe: nvfp4
      override_quantized_autocast: true
      override_nonquantized_autocast: true
      tp_only_amax_red: false
  hp:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe: {}
matchers:
  fc1: {type: glob, pattern: "*linear_fc1", config: mx, enabled: true}
  experts: {type: glob, pattern: "*.experts.*", config: fp4, enabled: true}
  parked: {type: glob, pattern: "*", config: hp, enabled: false}
  draft: {type: glob, pattern: "*linear_proj", config: hp}
  output: {type: glob, pattern: "output_layer", config: hp, enabled: true}
""",
    "custom": f"""\
configs:
  shell:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp8_quantization_recipe: custom
      custom_recipe_factory: os.system
      override_nonquantized_autocast: true
  marker:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe:
      fp4_quantization_recipe: custom
      custom_recipe_factory: {MARKER_MODULE}.factory
      override_nonquantized_autocast: true
matchers:
  attention: {{type: glob, pattern: "*.self_attention.*", config: shell, enabled: true}}
  mlp: {{type: glob, pattern: "*.mlp.*", config: marker, enabled: true}}
""",
}


def _base_recipes() -> list[tuple[str, str]]:
    return [(p.name, p.read_text()) for p in RECIPE_FILES] + \
           [(f"{name}.yaml", text) for name, text in EXTRA_RECIPES.items()]


BASE_RECIPES = _base_recipes()
_RECIPE_TREES = [yaml.safe_load(text) for _, text in BASE_RECIPES]

MAX_LAYERS, MAX_EXPERTS = 4, 8
# The build-size guard's limits while fuzzing (qaudit.load.config.MAX_BUILT_*): a mutated count
# within the real limits could take minutes to audit; over these, exit 2 as for a huge model.
FUZZ_MAX_LAYERS, FUZZ_MAX_EXPERTS = 16, 128


def shrink(tree: Any) -> Any:
    """At most MAX_LAYERS layers and MAX_EXPERTS experts; the MoE layer pattern's ends kept."""
    fields = tree.get("model", tree) if isinstance(tree, dict) else None
    if not isinstance(fields, dict):
        return tree
    layers = fields.get("num_layers")
    if isinstance(layers, int) and layers > MAX_LAYERS:
        fields["num_layers"] = MAX_LAYERS
        freq = fields.get("moe_layer_freq")
        if isinstance(freq, list):
            fields["moe_layer_freq"] = freq[:MAX_LAYERS - 1] + freq[-1:]
    experts = fields.get("num_moe_experts")
    if isinstance(experts, int) and experts > MAX_EXPERTS:
        fields["num_moe_experts"] = MAX_EXPERTS
        topk = fields.get("moe_router_topk")
        if isinstance(topk, int) and topk > MAX_EXPERTS:
            fields["moe_router_topk"] = MAX_EXPERTS
    return tree


def _base_configs() -> list[tuple[str, Any]]:
    return [(p.name, shrink(yaml.safe_load(p.read_text()))) for p in CONFIG_FILES]


BASE_CONFIGS = _base_configs()


# --- value pools ---------------------------------------------------------------------------

SMALL_INTS = [0, 1, 2, 3, 4, 8, 16, -1, -4]
HUGE_INTS = [100_000, 999_999, 1_000_000, 1_000_001, 2**31, 2**63, -(2**63), 10**30, 10**300]
FLOATS = [0.0, 0.5, -1.5, 4.0, 1e308, float("inf"), float("-inf"), float("nan"), 1e-320]
WORDS = ["e4m3", "hybrid", "e5m2", "tensorwise", "delayed", "mxfp8", "blockwise", "nvfp4",
         "e2m1", "custom", "glob", "regex", "TEQuantizationParams", "*", "mtp.*", "**", "[",
         "*.self_attention.*", "recipes/attention-bf16.yaml", "os.system", "full", "selective",
         "uniform", "block", "optim_grads", "core_attn", "none", "null", "~", "true", "yes",
         "NO", "0x10", "1e3", "", " ", "\t", "E4M3", "e4m3 ", "\u202e\u0645", "caf\u00e9",
         "\U0001f600", "a\nb", "\x1b[31mred\x1b[0m", "../../../../etc/passwd", "/dev/zero",
         "/dev/stdin", "\\\\server\\share", "$(touch PWNED)", "`touch PWNED`", "{{7*7}}", "%s%n"]


def _field_names() -> list[str]:
    from qaudit.load.config import MODELLED_FIELDS

    return sorted(MODELLED_FIELDS)


KEY_POOL = _field_names() + [
    "model", "configs", "matchers", "type", "pattern", "config", "enabled",
    "transformer_engine_config_type", "training_recipe", "evaluation_recipe",
    "fp8_quantization_recipe", "fp4_quantization_recipe", "custom_recipe_factory", "fp8_format",
    "override_quantized_autocast", "override_nonquantized_autocast", "tp_only_amax_red",
    "fp8_param", "fp4_param", "seq_length", "tensor_model_parallel_size", "bf16",
    "num_layer", "Num_Layers", "fp8 ", "", "<<", "__class__", "__proto__", "\u00e9t\u00e9",
    "k" * 300, "a\nb", "\x1b[2J",
]


def random_scalar(r: random.Random) -> Any:
    kind = r.randrange(7)
    if kind == 0:
        return None
    if kind == 1:
        return r.choice([True, False])
    if kind == 2:
        return r.choice(SMALL_INTS)
    if kind == 3:
        return r.choice(HUGE_INTS)
    if kind == 4:
        return r.choice(FLOATS)
    if kind == 5:
        return r.choice(WORDS)
    return "x" * r.choice([1, 64, 5000, 100_000])


def random_value(r: random.Random, depth: int = 0) -> Any:
    kind = r.randrange(10)
    if depth < 3 and kind == 0:
        return [random_value(r, depth + 1) for _ in range(r.randrange(4))]
    if depth < 3 and kind == 1:
        return {r.choice(KEY_POOL): random_value(r, depth + 1) for _ in range(r.randrange(4))}
    if kind == 2:
        return r.choice([[], {}, [0, 1], [1] * 3, {"a": 1}])
    return random_scalar(r)


def typo(word: str, r: random.Random) -> str:
    if not word:
        return "x"
    i = r.randrange(len(word))
    kind = r.randrange(6)
    if kind == 0:
        return word[:i] + word[i + 1:]
    if kind == 1:
        return word[:i] + r.choice("abcxyz_-. ") + word[i:]
    if kind == 2 and len(word) > 1:
        j = min(i + 1, len(word) - 1)
        chars = list(word)
        chars[i], chars[j] = chars[j], chars[i]
        return "".join(chars)
    if kind == 3:
        return word.upper()
    if kind == 4:
        return word.replace("_", "-")
    return " " + word


# --- tree mutations ---------------------------------------------------------------------------

def _slots(tree: Any) -> list[tuple[Any, Any]]:
    """Every (container, key-or-index) in the tree, depth first."""
    found: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in list(node):
                found.append((node, key))
                walk(node[key])
        elif isinstance(node, list):
            for index in range(len(node)):
                found.append((node, index))
                walk(node[index])

    walk(tree)
    return found


def _mappings(tree: Any) -> list[dict]:
    found = [tree] if isinstance(tree, dict) else []
    return found + [c[k] for c, k in _slots(tree) if isinstance(c[k], dict)]


def _rename(mapping: dict, old: Any, new: Any) -> None:
    items = [(new if k == old else k, v) for k, v in mapping.items()]
    mapping.clear()
    mapping.update(items)


def t_drop(tree: Any, r: random.Random, other: Any) -> Any:
    slots = _slots(tree)
    if not slots:
        return None
    container, key = r.choice(slots)
    del container[key]
    return tree


def t_add(tree: Any, r: random.Random, other: Any) -> Any:
    mappings = _mappings(tree)
    if not mappings:
        return {r.choice(KEY_POOL): random_value(r)}
    target = r.choice(mappings)
    key = r.choice(KEY_POOL + [r.choice(SMALL_INTS), True, None, 1.5])
    target[key] = random_value(r)
    return tree


def t_rename(tree: Any, r: random.Random, other: Any) -> Any:
    slots = [(c, k) for c, k in _slots(tree) if isinstance(c, dict)]
    if not slots:
        return tree
    container, key = r.choice(slots)
    new = typo(str(key), r) if r.random() < 0.6 else r.choice(KEY_POOL)
    if new not in container:
        _rename(container, key, new)
    return tree


def t_retype(tree: Any, r: random.Random, other: Any) -> Any:
    slots = _slots(tree)
    if not slots:
        return random_value(r)
    container, key = r.choice(slots)
    old = container[key]
    for _ in range(5):
        new = random_value(r)
        if type(new) is not type(old):
            break
    container[key] = new
    return tree


def _corrupt_scalar(value: Any, r: random.Random) -> Any:
    if isinstance(value, bool):
        return r.choice([not value, "true" if value else "false", int(value), None, "yes"])
    if isinstance(value, int):
        return r.choice([value + 1, value - 1, -value, 0, value * 1000, str(value), float(value)]
                        + HUGE_INTS)
    if isinstance(value, str):
        return r.choice([typo(value, r), value.upper(), value + " ", "", value * 1000,
                         value + "\x00", value + "\n" + value, value.encode("unicode_escape").decode()])
    return random_scalar(r)


def t_corrupt(tree: Any, r: random.Random, other: Any) -> Any:
    slots = [(c, k) for c, k in _slots(tree) if not isinstance(c[k], (dict, list))]
    if not slots:
        return tree
    container, key = r.choice(slots)
    container[key] = _corrupt_scalar(container[key], r)
    return tree


def t_null(tree: Any, r: random.Random, other: Any) -> Any:
    slots = _slots(tree)
    if not slots or r.random() < 0.1:
        return r.choice([None, {}, [], ""])
    container, key = r.choice(slots)
    container[key] = r.choice([None, None, {}, [], ""])
    return tree


def t_swap(tree: Any, r: random.Random, other: Any) -> Any:
    slots = _slots(tree)
    if len(slots) < 2:
        return tree
    (c1, k1), (c2, k2) = r.sample(slots, 2)
    try:
        c1[k1], c2[k2] = c2[k2], c1[k1]
    except (KeyError, IndexError):
        pass
    return tree  # a swap between a node and its ancestor leaves a detached cycle: harmless


def t_graft(tree: Any, r: random.Random, other: Any) -> Any:
    """Put a subtree of another document (a recipe into a config, or the reverse) somewhere."""
    donors = [c[k] for c, k in _slots(other)] + [other]
    piece = copy.deepcopy(r.choice(donors))
    mappings = _mappings(tree)
    if not mappings:
        return piece
    r.choice(mappings)[r.choice(KEY_POOL)] = piece
    return tree


TREE_OPS: dict[str, Callable[[Any, random.Random, Any], Any]] = {
    "drop": t_drop, "add": t_add, "rename": t_rename, "retype": t_retype,
    "corrupt": t_corrupt, "null": t_null, "swap": t_swap, "graft": t_graft,
}


# --- text mutations ---------------------------------------------------------------------------

TAGS = [
    "!!python/object/apply:os.system ['touch {dir}/PWNED']",
    "!!python/object/apply:subprocess.check_output [['touch', '{dir}/PWNED']]",
    "!!python/object/new:os.system ['touch {dir}/PWNED']",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!python/tuple [1, 2]",
    "!<tag:yaml.org,2002:python/object/apply:os.system> ['touch {dir}/PWNED']",
    "!!binary aGVsbG8=",
    "!!binary '!!!not base64'",
    "!!set {{a, b}}",
    "!!omap [{{a: 1}}, {{b: 2}}]",
    "!!pairs [{{a: 1}}, {{a: 2}}]",
    "!!timestamp 2001-12-14t21:59:43.10-05:00",
    "!!timestamp 2001-13-45",
    "!!float 4",
    "!!float nonsense",
    "!!int '4'",
    "!!int 'four'",
    "!!bool yes",
    "!!bool maybe",
    "!!str 4",
    "!!null ''",
    "!!map {{}}",
    "!!seq []",
    "!!map [1, 2]",
    "!custom value",
    "!e4m3 e4m3",
    "!!merge x",
    "!!value x",
]
DIRECTIVES = [
    "%YAML 1.1\n---\n",
    "%YAML 1.2\n---\n",
    "%YAML 2.0\n---\n",
    "%TAG !py! tag:yaml.org,2002:python/object/apply:\n---\n",
    "%TAG ! tag:yaml.org,2002:python/\n---\n",
    "%FOO bar\n---\n",
]
NUMBERS = [
    "1" * 5000,                      # over Python's int-string conversion limit
    "-" + "9" * 4400,
    ":".join(["59"] * 3000),         # YAML 1.1 base 60: an integer far past that limit
    "190:20:30",
    "0x" + "f" * 4000,
    "0b" + "1" * 20000,
    "0o777",
    "0x10",
    "1_000_000",
    "1_0_0_0_0_0_0_0",
    "+12",
    "007",
    "1e999",
    "-1e999",
    "9" * 400 + ".5",
    "1.0e+3",
    ".inf",
    "-.Inf",
    ".NaN",
    "1e3",
    "0.",
    "1000001",
    "100000",
    "2147483648",
    "~",
]


def _value_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines)
            if ":" in line and not line.lstrip().startswith("#") and not line.rstrip().endswith(":")]


def _set_value(line: str, value: str) -> str:
    head = line.split(":", 1)[0]
    return f"{head}: {value}"


def x_tag(text: str, r: random.Random, ctx: dict) -> str:
    lines = text.splitlines()
    tag = r.choice(TAGS).format(dir=ctx.get("dir", "."))
    candidates = _value_lines(lines)
    if not candidates or r.random() < 0.15:
        return text + f"\n{r.choice(KEY_POOL[:5])}: {tag}\n"
    i = r.choice(candidates)
    lines[i] = _set_value(lines[i], tag)
    return "\n".join(lines) + "\n"


def x_directive(text: str, r: random.Random, ctx: dict) -> str:
    directive = r.choice(DIRECTIVES)
    text = directive + text
    if "%TAG" in directive and r.random() < 0.7:
        lines = text.splitlines()
        candidates = [i for i in _value_lines(lines) if not lines[i].startswith("%")]
        if candidates:
            i = r.choice(candidates)
            tag = "!py!os.system" if "!py!" in directive else "!object/apply:os.system"
            lines[i] = _set_value(lines[i], f"{tag} ['touch {ctx.get('dir', '.')}/PWNED']")
            text = "\n".join(lines) + "\n"
    return text


def billion_laughs(levels: int, width: int, key: str = "bomb") -> str:
    out = [f"{key}:", "  l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    out += [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(out) + "\n"


def x_alias(text: str, r: random.Random, ctx: dict) -> str:
    lines = text.splitlines()
    candidates = _value_lines(lines)
    kind = r.randrange(7)
    if kind == 0 or len(candidates) < 2:
        # A bomb under a new top-level key, or aimed at a field.
        levels, width = r.choice([(3, 10), (9, 9), (6, 16), (11, 10), (2, 2)])
        bomb = billion_laughs(levels, width)
        if candidates and r.random() < 0.5:
            i = r.choice(candidates)
            lines[i] = _set_value(lines[i], f"*l{levels - 1}")
        return bomb + "\n".join(lines) + "\n"
    a, b = sorted(r.sample(candidates, 2))
    if kind == 1:   # plain anchor and alias
        head, value = lines[a].split(":", 1)
        lines[a] = f"{head}: &anc {value.strip()}"
        lines[b] = _set_value(lines[b], "*anc")
    elif kind == 2:  # alias to an anchor that does not exist
        lines[b] = _set_value(lines[b], "*nowhere")
    elif kind == 3:  # alias used before its anchor
        head, value = lines[b].split(":", 1)
        lines[b] = f"{head}: &late {value.strip()}"
        lines[a] = _set_value(lines[a], "*late")
    elif kind == 4:  # a recursive structure
        lines[a] = _set_value(lines[a], "&loop [1, *loop]")
    elif kind == 5:  # merge keys
        indent = lines[a][: len(lines[a]) - len(lines[a].lstrip())]
        lines.insert(a, f"{indent}<<: " + r.choice(["*anc", "{num_layers: 2}", "[1, 2]", "3",
                                                     "[{a: 1}, *anc]"]))
        lines.insert(0, "anchors: &anc {num_layers: 2, hidden_size: 8}")
    else:  # the same anchor name twice
        for i, name in ((a, "dup"), (b, "dup")):
            head, value = lines[i].split(":", 1)
            lines[i] = f"{head}: &{name} {value.strip()}"
        lines.append("again: *dup")
    return "\n".join(lines) + "\n"


def x_splice(text: str, r: random.Random, ctx: dict) -> str:
    other = ctx.get("other_text", "")
    kind = r.randrange(6)
    if kind == 0:
        return text + "---\n" + other
    if kind == 1:
        return text + "...\n" + r.choice(["", "---\n", "garbage: 1\n"])
    if kind == 2:
        return text[: r.randrange(len(text) + 1)]
    if kind == 3:
        lines, donor = text.splitlines(), other.splitlines()
        if donor:
            start = r.randrange(len(donor))
            lines[r.randrange(len(lines) + 1):0] = donor[start:start + r.randrange(1, 6)]
        return "\n".join(lines) + "\n"
    if kind == 4:
        return "---\n" + text + "---\n" + text
    return other + text


def x_number(text: str, r: random.Random, ctx: dict) -> str:
    lines = text.splitlines()
    candidates = _value_lines(lines)
    if not candidates:
        return text + f"\nnum_layers: {r.choice(NUMBERS)}\n"
    i = r.choice(candidates)
    lines[i] = _set_value(lines[i], r.choice(NUMBERS))
    return "\n".join(lines) + "\n"


def _deep(r: random.Random) -> str:
    depth = r.choice([20, 100, 300, 1000, 5000, 30000])
    kind = r.randrange(3)
    if kind == 0:
        return "[" * depth + "]" * depth
    if kind == 1:
        return "{a: " * depth + "1" + "}" * depth
    return "[" * depth + "{" + "}" + "]" * depth


def x_deep(text: str, r: random.Random, ctx: dict) -> str:
    lines = text.splitlines()
    candidates = _value_lines(lines)
    if r.random() < 0.3 or not candidates:
        depth = r.choice([50, 200, 600])
        block = "\n".join("  " * i + f"k{i}:" for i in range(depth)) + " 1\n"
        return text + "\n" + block if r.random() < 0.5 else \
            text + "\n" + "\n".join("  " * i + "-" for i in range(depth)) + " 1\n"
    i = r.choice(candidates)
    lines[i] = _set_value(lines[i], _deep(r))
    return "\n".join(lines) + "\n"


def x_long(text: str, r: random.Random, ctx: dict) -> str:
    lines = text.splitlines()
    size = r.choice([1000, 100_000, 1_000_000])
    filler = r.choice(["a", "*", "ab_", "\u00e9", " x"]) * (size // 2)
    candidates = _value_lines(lines)
    if not candidates:
        return text + f"\n{filler}: 1\n"
    i = r.choice(candidates)
    if r.random() < 0.5:
        lines[i] = _set_value(lines[i], repr(filler))
    else:
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i] = indent + filler + ": 1"
    return "\n".join(lines) + "\n"


SPECIAL_CHARS = [":", "-", "[", "]", "{", "}", "\"", "'", "\t", "#", "&", "*", "!", "|", ">",
                 "%", "@", "`", ",", "?", "\\", "\u2028", "\u0085", "\ufeff", "\x07", "\x1b",
                 "\U0001f600", "\ud800", " ", "\n", "\r"]


def x_chars(text: str, r: random.Random, ctx: dict) -> str:
    chars = list(text)
    for _ in range(r.randrange(1, 6)):
        i = r.randrange(len(chars) + 1)
        kind = r.randrange(3)
        if kind == 0 and i < len(chars):
            del chars[i]
        elif kind == 1 and i < len(chars):
            chars[i] = r.choice(SPECIAL_CHARS)
        else:
            chars.insert(i, r.choice(SPECIAL_CHARS))
    return "".join(chars)


def x_lines(text: str, r: random.Random, ctx: dict) -> str:
    lines = text.splitlines() or [""]
    i, j = r.randrange(len(lines)), r.randrange(len(lines))
    kind = r.randrange(5)
    if kind == 0:
        lines.insert(j, lines[i])
    elif kind == 1:
        del lines[i]
    elif kind == 2:
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == 3:
        lines[i] = r.choice(["  ", "    ", "\t", " "]) + lines[i]
    else:
        lines[i] = lines[i].lstrip()
    return "\n".join(lines) + "\n"


TEXT_OPS: dict[str, Callable[[str, random.Random, dict], str]] = {
    "tag": x_tag, "directive": x_directive, "alias": x_alias, "splice": x_splice,
    "number": x_number, "deep": x_deep, "long": x_long, "chars": x_chars, "lines": x_lines,
}


# --- byte mutations ---------------------------------------------------------------------------

def b_encoding(data: bytes, r: random.Random, ctx: dict) -> bytes:
    kind = r.randrange(7)
    if kind == 0:
        return b"\xef\xbb\xbf" + data                       # UTF-8 BOM
    if kind == 1:
        return data.decode("utf-8", "replace").encode("utf-16")
    if kind == 2:
        return data.replace(b"\n", b"\r\n")
    if kind == 3:
        return data.replace(b"\n", b"\r")
    if kind == 4:
        i = r.randrange(len(data) + 1)
        return data[:i] + r.choice([b"\xff", b"\xc3", b"\xe9", b"\xed\xa0\x80", b"\x00"]) + data[i:]
    if kind == 5:
        return data.decode("utf-8", "replace").encode("latin-1", "replace")
    return data[: len(data) // 2]


BYTE_OPS: dict[str, Callable[[bytes, random.Random, dict], bytes]] = {"encoding": b_encoding}

OPS = list(TREE_OPS) + list(TEXT_OPS) + list(BYTE_OPS)
_STAGE = {**{name: 0 for name in TREE_OPS}, **{name: 1 for name in TEXT_OPS},
          **{name: 2 for name in BYTE_OPS}}


# --- plans and cases ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    config: int                         # index into BASE_CONFIGS
    recipe: int                         # index into BASE_RECIPES, -1 for none
    via: str                            # "option" (--recipe) or "config" (quant_recipe)
    ops: tuple[tuple[str, str, int], ...]   # (op, "config" | "recipe", seed)
    args: tuple[str, ...] = ()          # extra CLI options

    def describe(self) -> str:
        recipe = BASE_RECIPES[self.recipe][0] if self.recipe >= 0 else "-"
        return (f"config={BASE_CONFIGS[self.config][0]} recipe={recipe} via={self.via} "
                f"ops={list(self.ops)} args={list(self.args)}")


EXTRA_ARGS = [(), (), (), ("--format", "json"), ("--policy", "module"), ("--policy", "legacy"),
              ("--eval",), ("--format", "markdown")]


def random_plan(r: random.Random) -> Plan:
    ops = tuple((r.choice(OPS), r.choice(("config", "config", "recipe")), r.getrandbits(32))
                for _ in range(r.choice((1, 1, 2, 2, 3, 4))))
    return Plan(r.randrange(len(BASE_CONFIGS)), r.randrange(-1, len(BASE_RECIPES)),
                r.choice(("option", "config")), ops, r.choice(EXTRA_ARGS))


@dataclass
class Case:
    plan: Plan
    config: bytes
    recipe: bytes | None


RECIPE_NAME = "recipes/r.yaml"


def _fields_of(tree: Any) -> dict | None:
    if isinstance(tree, dict):
        inner = tree.get("model")
        return inner if isinstance(inner, dict) else tree
    return None


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _dump(tree: Any) -> str:
    try:
        return yaml.dump(tree, Dumper=_DUMPER, sort_keys=False, allow_unicode=True,
                         default_flow_style=None, width=200)
    except (yaml.YAMLError, RecursionError, ValueError):
        return "broken: [\n"


def build_case(plan: Plan, directory: Path | str = ".") -> Case:
    """The file contents a plan describes (deterministic; `directory` only fills in tags)."""
    name, config_tree = BASE_CONFIGS[plan.config]
    config_tree = copy.deepcopy(config_tree)
    recipe_tree = copy.deepcopy(_RECIPE_TREES[plan.recipe]) if plan.recipe >= 0 else None
    fields = _fields_of(config_tree)
    if fields is not None:
        fields.pop("quant_recipe", None)
        if recipe_tree is not None and plan.via == "config":
            fields["quant_recipe"] = RECIPE_NAME
    trees = {"config": config_tree, "recipe": recipe_tree}
    texts: dict[str, Any] = {}
    ops = sorted(plan.ops, key=lambda op: _STAGE[op[0]])  # tree, then text, then bytes
    for op, target, seed in ops:
        if target == "recipe" and recipe_tree is None:
            target = "config"
        other = "recipe" if target == "config" and recipe_tree is not None else "config"
        r = random.Random(seed)
        stage = _STAGE[op]
        if stage == 0:
            trees[target] = TREE_OPS[op](trees[target], r, trees[other])
            continue
        for key in ("config", "recipe"):
            if key not in texts and (key == "config" or recipe_tree is not None):
                texts[key] = _dump(trees[key])
        ctx = {"dir": str(directory), "other_text": texts[other] if isinstance(texts[other], str)
               else texts[other].decode("utf-8", "replace")}
        if stage == 1:
            current = texts[target]
            if isinstance(current, bytes):
                current = current.decode("utf-8", "replace")
            texts[target] = TEXT_OPS[op](current, r, ctx)
        else:
            current = texts[target]
            data = current if isinstance(current, bytes) else current.encode("utf-8", "surrogatepass")
            texts[target] = BYTE_OPS[op](data, r, ctx)

    def finish(key: str) -> bytes | None:
        if key == "recipe" and recipe_tree is None:
            return None
        value = texts.get(key)
        if value is None:
            value = _dump(trees[key])
        return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")

    return Case(plan, finish("config"), finish("recipe"))


# --- running a case ---------------------------------------------------------------------------

def install_marker_module(directory: Path) -> Path:
    """Put MARKER_MODULE on sys.path; importing it writes `directory/IMPORTED`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{MARKER_MODULE}.py").write_text(MARKER_SOURCE)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    return directory


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`qaudit ARGV` in this process, through the console entry point: (exit code, out, err)."""
    from qaudit.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["qaudit", *argv]
    code: Any = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = saved
    if code is None:
        code = 0
    elif not isinstance(code, int):
        err.write(f"{code}\n")
        code = 1
    return code, out.getvalue(), err.getvalue()


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float
    problems: list[str] = field(default_factory=list)


def _files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def run_case(case: Case, directory: Path, marker_dir: Path | None = None) -> Outcome:
    """Write the case under `directory` (empty), run the CLI from an empty cwd, check it."""
    config = directory / "cfg.yaml"
    config.write_bytes(case.config)
    argv = ["check", str(config), "--steps", "1", "--microbatches", "1", *case.plan.args]
    names = [str(config)]
    if case.recipe is not None:
        recipe = directory / RECIPE_NAME
        recipe.parent.mkdir(parents=True, exist_ok=True)
        recipe.write_bytes(case.recipe)
        names.append(os.path.normpath(str(recipe)))
        if case.plan.via == "option":
            argv += ["--recipe", str(recipe)]
    cwd = directory / "cwd"
    cwd.mkdir()
    before = _files_under(directory)
    start = time.perf_counter()
    with _working_directory(cwd):
        code, out, err = run_cli(argv)
    outcome = Outcome(code, out, err, time.perf_counter() - start)
    outcome.problems = check_outcome(outcome, names)
    after = _files_under(directory)
    if after != before:
        outcome.problems.append(f"files appeared: {sorted(after - before)[:5]}")
    if MARKER_MODULE in sys.modules:
        outcome.problems.append(f"{MARKER_MODULE} was imported")
        del sys.modules[MARKER_MODULE]
    if marker_dir is not None and (marker_dir / "IMPORTED").exists():
        outcome.problems.append(f"{MARKER_MODULE} was imported (marker file)")
        (marker_dir / "IMPORTED").unlink()
    return outcome


def _names_a_file(line: str, files: list[str]) -> bool:
    """`error: FILE[:LINE]: ...` where FILE is one of ours or another existing file (a
    mutated quant_recipe may point anywhere)."""
    if not line.startswith("error: "):
        return False
    rest = line[len("error: "):]
    if any(rest.startswith(name + ":") for name in files):
        return True
    ends = [i for i, char in enumerate(rest) if char == ":"]
    return any(os.path.isfile(rest[:i]) for i in ends[:20])


def check_outcome(outcome: Outcome, files: list[str]) -> list[str]:
    """What must hold for any input: exit 0/1/2, no traceback, exit 2 = one line naming a file."""
    problems = []
    if outcome.code not in (0, 1, 2):
        problems.append(f"exit code {outcome.code}")
    if "Traceback" in outcome.stderr or "internal error" in outcome.stderr:
        problems.append("traceback or internal error on stderr")
    if "\x1b" in outcome.stdout or "\x1b" in outcome.stderr:
        problems.append("terminal escape sequence from the input reached the output")
    if outcome.code == 2:
        lines = outcome.stderr.splitlines()
        if len(lines) != 1 or not outcome.stderr.endswith("\n"):
            problems.append(f"exit 2 with {len(lines)} stderr lines")
        elif not _names_a_file(lines[0], files):
            problems.append("exit 2 message does not start with a file name")
        elif len(lines[0]) > 2000:
            problems.append(f"exit 2 message is {len(lines[0])} characters long")
        if outcome.stdout:
            problems.append("exit 2 with output on stdout")
    elif outcome.code in (0, 1) and not outcome.stdout:
        problems.append(f"exit {outcome.code} without a report on stdout")
    return problems
