"""Generators of hostile and careless inputs, one family per class of issue 14, shared by
tests/test_hostile_round2.py and scripts/fuzz (which draws them with a seeded random.Random).

Each generator writes its files into an empty folder and returns a `Case`: the qaudit argv to
run there, the exit codes allowed, files that must come out unchanged, and what else to check.
`run_case` runs it through the console entry point in this process and returns the problems
found (an empty list when every rule holds):

- exit code in `allowed` (never 3, never a traceback); exit 2 is one `error: FILE...` line;
- `unchanged` files keep their bytes, mode and kind (a symlink stays a symlink);
- no temporary file is left and nothing appears besides the `outputs` named;
- no output line of any format but `github` starts, after whitespace, with `::`;
- the run ends (a hang guard of at least `HANG_SECONDS`, never a measure of speed).

Families: `cwd` (1: modules planted next to the config, run in a subprocess), `shell` (2:
launch scripts whose values double, copy, fork and recurse), `user_errors` (3: huge literals,
deep nesting, long or NUL paths), `report_types` (4: reports and baselines with wrong types),
`outputs` (5: outputs that are inputs, links, FIFOs, devices, modes), `commands` (6: names that
would start workflow commands), `upstream` (7: cross-field assertions on three input routes),
`smaller` (8: long list expressions, FIFO and symlink-loop baselines, job summary FIFO, run
cost).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import mutations

REPO = Path(__file__).resolve().parent.parent
LAUNCH = "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4\n"
BASE = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
SMALL_RUN = ("--steps", "1", "--microbatches", "1")


@dataclass
class Case:
    family: str
    argv: list[str]
    allowed: tuple[int, ...] = (0, 1, 2)
    unchanged: list[str] = field(default_factory=list)  # names in the folder
    outputs: list[str] = field(default_factory=list)  # names the run may create or replace
    words: tuple[str, ...] = ()  # each must appear in stderr when the exit is 2
    seconds: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    subprocess: bool = False  # run `python -m qaudit` in a child process (family cwd)
    note: str = ""
    # Round three (tests/hostile_inputs3.py):
    sys_path: list[str] = field(default_factory=list)  # prepended to sys.path for the run
    forbidden: tuple[str, ...] = ()  # must not appear on stdout
    printable: bool = False  # every character printed is printable (or a newline)
    memory_mib: int | None = None  # RLIMIT_AS of the child process (subprocess cases)
    # Round four: several configs (a directory), where an exit 2 is one `error:` line per
    # refused file on stderr beside the summary on stdout.
    several: bool = False
    # Round five: directories counted as the interpreter's site-packages for the run (an
    # installed megatron-core; qaudit/plan/upstream/site_dirs.py), in-process cases only.
    installed: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.family}: {self.note} argv={self.argv[:8]}"


# --- 1. code from the working directory ----------------------------------------------------------

PLANTABLE = ("yaml", "typer", "click", "tabulate", "numpy", "json", "typing_extensions",
             "sympy", "rich", "shellingham", "filelock", "jinja2", "fsspec", "networkx")


def gen_cwd(r: random.Random, folder: Path) -> Case:
    names = r.sample(PLANTABLE, r.randrange(1, 5))
    for name in names:
        (folder / f"{name}.py").write_text(f"open('RAN-{name}', 'w').write('x')\n")
    if r.random() < 0.5:
        (folder / "transformer_engine").mkdir()
        (folder / "transformer_engine" / "__init__.py").write_text(
            "open('RAN-te', 'w').write('x')\n")
    (folder / "cfg.yaml").write_text(BASE)
    return Case("cwd", ["check", "cfg.yaml", *SMALL_RUN], allowed=(0,), subprocess=True,
                unchanged=["cfg.yaml"], seconds=120, note=f"planted {names}")


# --- 2. unbounded shell evaluation ---------------------------------------------------------------

def _doubled(r: random.Random, name: str = "A") -> str:
    seed = r.choice(["x", "ab", "a b ", "--flag v ", "é"])
    return f"{name}='{seed}'\n" + f"{name}=${name}${name}\n" * r.randrange(10, 21)


def _items(r: random.Random, count: int) -> str:
    return " ".join(str(i) for i in range(count))


SHELL_SHAPES: dict[str, Callable[[random.Random], str]] = {
    "copies": lambda r: _doubled(r) + "".join(f"B{i}=$A\n" for i in range(r.randrange(2, 80))),
    "array": lambda r: _doubled(r) + "ARR=(" + " ".join(['"$A"'] * r.randrange(2, 100)) + ")\n",
    "loop_copy": lambda r: _doubled(r) + f"for i in {_items(r, r.randrange(10, 1000))}; do "
                                         "B=$A; C=$B$B; done\n",
    "append_loop": lambda r: _doubled(r) + f"for i in {_items(r, r.randrange(10, 1000))}; do "
                                           "B+=$A; ARGS+=(\"$A\"); done\n",
    "forks": lambda r: "".join(f"V{i}=v{i}\n" for i in range(r.randrange(10, 5000))) +
    f"for i in {_items(r, r.randrange(10, 1000))}; do if [ -f /x ]; then W=$i; fi; done\n",
    "fork_keep": lambda r: _doubled(r) + "case $UNKNOWN in " + " ".join(
        f"{i}) X{i}=$A$A;;" for i in range(r.randrange(2, 300))) + " esac\n",
    "cond_array": lambda r: _doubled(r) + f"for i in {_items(r, r.randrange(10, 1000))}; do "
                                          "if [ -f /x ]; then ARGS+=(\"$A\"); fi; done\n",
    "arith": lambda r: "a0=1\n" + "".join(f"a{i}='a{i - 1}+a{i - 1}'\n"
                                          for i in range(1, r.randrange(5, 60))) + "N=$((a4))\n"
    .replace("a4", f"a{r.randrange(1, 5)}") + "M=$((a" + str(r.randrange(20, 60)) + "))\n",
    "case_glob": lambda r: _doubled(r) + "case $A in " + " ".join(
        f"{'*a' * r.randrange(1, 12)}*c{i}) X=1;;" for i in range(r.randrange(1, 300))) + " esac\n",
    "test_glob": lambda r: _doubled(r) + "".join(
        f"[[ $A == {'*?' * r.randrange(1, 20)}c ]] && X=1\n" for _ in range(r.randrange(1, 300))),
    "functions": lambda r: _doubled(r) + "f0() { X=$1; }\n" + "".join(
        f"f{i}() {{ f{i - 1} \"$1\" \"$1\"; f{i - 1} \"$1\"; }}\n" for i in range(1, 16)) +
    "f15 \"$A\"\n",
    "launches": lambda r: _doubled(r) + "".join(
        "torchrun pretrain_gpt.py --num-layers 2 $A\n" for _ in range(r.randrange(2, 400))),
    "notes": lambda r: f"for i in {_items(r, 1000)}; do for j in {_items(r, 150)}; do "
                       "source x.sh; eval y; done; done\n",
    "steps": lambda r: f"for i in {_items(r, 1000)}; do for j in {_items(r, 1000)}; do "
                       "X=y; done; done\n",
    "words": lambda r: _doubled(r) + "".join("echo $A $A\n" for _ in range(r.randrange(1, 50))),
    "tokens": lambda r: "echo a b c\n" * r.randrange(20_000, 40_000),
    "literal": lambda r: "A='" + "x" * r.randrange(100_000, 1_000_000) + "'\nB=$A\nC=$A$A\n",
    "deep_arith": lambda r: "N=$(( " + "(" * r.randrange(100, 3000) + "1" + ")" * 3000 + " ))\n",
    "long_arith": lambda r: "N=$(( " + "+".join(["1"] * r.randrange(1000, 200_000)) + " ))\n",
}


def shell_script(r: random.Random) -> tuple[str, str]:
    """A launch script of one to three shapes; (shape names, text)."""
    shapes = r.sample(sorted(SHELL_SHAPES), r.choice((1, 1, 2, 3)))
    body = "".join(SHELL_SHAPES[shape](r) for shape in shapes)
    return "+".join(shapes), "#!/bin/bash\n" + body + LAUNCH


def gen_shell(r: random.Random, folder: Path) -> Case:
    shapes, text = shell_script(r)
    (folder / "train.sh").write_text(text[: (1 << 20) - 1])
    return Case("shell", ["check", "train.sh", *SMALL_RUN], unchanged=["train.sh"],
                seconds=30, note=shapes)


# --- 3. user errors that were exit 3 -------------------------------------------------------------

def _deep_json(r: random.Random) -> str:
    depth = r.choice([100, 1000, 5000, 100_000])
    return r.choice(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth,
                     '{"schema": "qaudit/1", "steps": ' + "[" * depth + "]" * depth + "}"])


def _huge_int_json(r: random.Random, schema: str) -> str:
    digits = "9" * r.choice([101, 4301, 5000, 50_000])
    return r.choice([f'{{"schema": "{schema}", "steps": {digits}}}', f"[{digits}]",
                     f'{{"schema": "{schema}", "findings": [], "x": -{digits}}}'])


def _bad_path(r: random.Random, folder: Path) -> str:
    return r.choice([str(folder / ("p" * r.choice([256, 1000, 5000]))),
                     str(folder / "a\x00b.json"), "x" * 5000 + "/y.json",
                     str(folder / "nodir" / "r.json"), str(folder / "newdir") + "/"])


def gen_user_errors(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE)
    kind = r.choice(["arith", "freq_deep", "freq_digits", "baseline_json", "diff_json",
                     "output_path", "baseline_path", "write_baseline_path", "diff_path"])
    argv = ["check", "cfg.yaml", *SMALL_RUN]
    if kind == "arith":
        literal = r.choice(["1" * 5000, "0x" + "f" * 200, "9" * 101, "0" + "7" * 300])
        (folder / "train.sh").write_text(f"#!/bin/bash\nN=$(( {literal} ))\nM=$((N+1))\n{LAUNCH}")
        argv[1] = "train.sh"
    elif kind.startswith("freq"):
        depth = r.choice([60, 1000, 5000])
        value = "(" * depth + "[1]" + ")" * depth if kind == "freq_deep" else \
            "[" + ",".join(["1" * r.choice([10, 5000])] * 2) + "]"
        (folder / "train.sh").write_text(
            f"#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
            f"--num-attention-heads 4 --num-experts 2 --moe-layer-freq '{value}'\n")
        argv[1] = "train.sh"
    elif kind == "baseline_json":
        (folder / "b.json").write_text(r.choice([_deep_json(r),
                                                 _huge_int_json(r, "qaudit-baseline/1")]))
        argv += ["--baseline", "b.json"]
    elif kind == "diff_json":
        (folder / "r.json").write_text(r.choice([_deep_json(r), _huge_int_json(r, "qaudit/1")]))
        argv = ["diff", "r.json", "cfg.yaml", *SMALL_RUN]
    elif kind == "diff_path":
        argv = ["diff", _bad_path(r, folder).replace(".json", "") + ".json", "cfg.yaml",
                *SMALL_RUN]
    else:
        option = {"output_path": None, "baseline_path": "--baseline",
                  "write_baseline_path": "--write-baseline"}[kind]
        path = _bad_path(r, folder)
        argv += [option, path] if option else ["-o", f"{r.choice(['json', 'md', 'svg'])}={path}"]
    return Case("user_errors", argv, allowed=(2,), unchanged=["cfg.yaml"], seconds=30,
                note=kind)


# --- 4. reports and baselines read back with wrong types -----------------------------------------

_REPORT_CACHE: dict[str, str] = {}


def good_report() -> str:
    """The JSON report of the small config (audited once per process)."""
    if "report" not in _REPORT_CACHE:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "cfg.yaml"
            path.write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\nmtp_num_layers: 2\n"
                            "mtp_use_repeated_layer: true\n")
            code, out, _ = mutations.run_cli(["check", str(path), *SMALL_RUN, "-f", "json"])
            assert code == 1, out
        _REPORT_CACHE["report"] = out
        data = json.loads(out)
        from qaudit.judge.baseline import baseline_entries
        from qaudit.render.load import report_from_dict

        findings = report_from_dict(data).findings
        _REPORT_CACHE["baseline"] = json.dumps(
            {"schema": "qaudit-baseline/1", "config": "cfg.yaml", "recipe": None,
             "findings": baseline_entries(findings)}, indent=2)
    return _REPORT_CACHE["report"]


def good_baseline() -> str:
    good_report()
    return _REPORT_CACHE["baseline"]


WRONG_VALUES = [None, "critical", "", {"a": 1}, [], [1], 0, -1, 1.5, True, "2", 10**30,
                "QA001", {"rule": "QA001"}, float("nan")]


def corrupt_json(text: str, r: random.Random) -> str:
    """A value somewhere replaced by one of another type, or a key dropped or renamed."""
    tree = json.loads(text)
    slots = mutations._slots(tree)
    for _ in range(r.choice((1, 1, 2, 3))):
        if not slots:
            break
        container, key = r.choice(slots)
        kind = r.randrange(4)
        if kind == 0 and isinstance(container, dict):
            del container[key]
        elif kind == 1 and isinstance(container, dict):
            mutations._rename(container, key, mutations.typo(str(key), r))
        else:
            container[key] = copy.deepcopy(r.choice(WRONG_VALUES))
        slots = mutations._slots(tree)
    return json.dumps(tree)


def gen_report_types(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE)
    if r.random() < 0.5:
        (folder / "r.json").write_text(corrupt_json(good_report(), r))
        argv = ["diff", *r.sample(["r.json", "cfg.yaml"], 2), *SMALL_RUN]
        if r.random() < 0.3:
            (folder / "s.json").write_text(corrupt_json(good_report(), r))
            argv = ["diff", "r.json", "s.json"]
    else:
        (folder / "b.json").write_text(corrupt_json(good_baseline(), r))
        argv = ["check", "cfg.yaml", *SMALL_RUN, "--baseline", "b.json"]
    argv += r.choice([[], ["-f", "json"], ["-f", "markdown"]])
    return Case("report_types", argv, unchanged=["cfg.yaml"], seconds=60)


# --- 5. outputs that destroy data ----------------------------------------------------------------

RECIPE = """\
configs:
  hp:
    transformer_engine_config_type: TEQuantizationParams
    training_recipe: {}
matchers:
  proj: {type: glob, pattern: "*linear_proj", config: hp, enabled: true}
"""


def gen_outputs(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n")
    (folder / "r.yaml").write_text(RECIPE)
    (folder / "old.json").write_text("{}\n")
    os.chmod(folder / "old.json", r.choice([0o644, 0o640, 0o600, 0o664]))
    os.symlink("old.json", folder / "link.json")
    os.symlink("cfg.yaml", folder / "cfg-link.yaml")
    os.symlink("missing-target.json", folder / "dangling.json")
    os.link(folder / "r.yaml", folder / "r-hard.yaml")
    with contextlib.suppress(OSError):
        os.mkfifo(folder / "fifo")
    os.mkdir(folder / "sub")
    argv = ["check", "cfg.yaml", "--recipe", "r.yaml", *SMALL_RUN]
    targets = ["cfg.yaml", "r.yaml", "cfg-link.yaml", "r-hard.yaml", "old.json", "link.json",
               "dangling.json", "new.json", "sub/new.md", "sub", "sub/", "newdir/", "fifo",
               "/dev/null", "b.json", "nodir/x.json", "."]
    outputs = []
    for _ in range(r.choice((1, 1, 2, 3))):
        target = r.choice(targets)
        if r.random() < 0.25:
            argv += ["--write-baseline", target]
        else:
            argv += ["-o", f"{r.choice(['json', 'markdown', 'table', 'sarif', 'svg'])}={target}"]
        outputs.append(target)
    if r.random() < 0.2:
        (folder / "b.json").write_text(good_baseline())
        argv += ["--baseline", "b.json"]
    writable = {"old.json", "link.json", "dangling.json", "new.json", "sub/new.md", "b.json",
                "missing-target.json", "old.json"}
    return Case("outputs", argv, unchanged=["cfg.yaml", "r.yaml", "cfg-link.yaml",
                                            "r-hard.yaml", "fifo"],
                outputs=sorted(writable), seconds=60, note=f"outputs {outputs}")


# --- 6. workflow-command injection ---------------------------------------------------------------

COMMAND_TEXTS = ["::error::pwned", "::stop-commands::token", "  ::warning file=x::y",
                 "\n::error::x", "\r::error::x", "##[error]legacy", "::add-mask::s",
                 "\u00a0::error::nbsp", "\t::group::g", "::"]


def hostile_name(r: random.Random) -> str:
    filler = "w" * r.choice([0, 10, 40, 70, 90, 150])
    parts = [filler, r.choice(COMMAND_TEXTS), " " * r.randrange(3), r.choice(COMMAND_TEXTS)]
    r.shuffle(parts)
    return " ".join(parts) if r.random() < 0.5 else "".join(parts)


def gen_commands(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n")
    config_name, matcher, unused = hostile_name(r), hostile_name(r), hostile_name(r)
    recipe = {
        "configs": {config_name: {"transformer_engine_config_type": "TEQuantizationParams",
                                  "training_recipe": {}}},
        "matchers": {
            matcher: {"type": "glob", "pattern": r.choice(["*linear_proj", "nothing"]),
                      "config": config_name, "enabled": r.random() < 0.7},
            unused: {"type": "glob", "pattern": "*fc1", "config": config_name},
        },
    }
    (folder / "r.yaml").write_text(json.dumps(recipe))
    fmt = r.choice(["table", "markdown", "json", "sarif", "github"])
    argv = ["check", "cfg.yaml", "--recipe", "r.yaml", *SMALL_RUN, "-f", fmt]
    outputs = []
    for name in r.sample(["table", "markdown", "json", "sarif", "github", "svg"], 2):
        argv += ["-o", f"{name}=out.{name}"]
        outputs.append(f"out.{name}")
    if r.random() < 0.3:
        argv.append("--expand")
    return Case("commands", argv, unchanged=["cfg.yaml", "r.yaml"], outputs=outputs,
                seconds=60, note=f"format {fmt}")


# --- 7. model checks upstream makes --------------------------------------------------------------

# (YAML fields, the flags saying the same, the words the refusal must hold)
UPSTREAM_REFUSALS = [
    ({"hidden_size": 100, "num_attention_heads": 8},
     "--hidden-size 100 --num-attention-heads 8", ("divisible", "num_attention_heads")),
    ({"num_moe_experts": 4, "moe_shared_expert_intermediate_size": 64},
     "--num-experts 4 --moe-shared-expert-intermediate-size 64", ("add_bias_linear",)),
    ({"num_moe_experts": 4, "moe_router_topk": 1, "add_bias_linear": False},
     "--num-experts 4 --moe-router-topk 1 --disable-bias-linear", ("pre-softmax",)),
    ({"num_moe_experts": 6, "moe_router_num_groups": 4, "moe_router_group_topk": 2,
      "add_bias_linear": False},
     "--num-experts 6 --moe-router-num-groups 4 --moe-router-group-topk 2 --disable-bias-linear",
     ("moe_router_num_groups",)),
    ({"tensor_model_parallel_size": 3}, "--tensor-model-parallel-size 3",
     ("tensor_model_parallel_size",)),
    ({"moe_ffn_hidden_size": 32}, "--moe-ffn-hidden-size 32", ("num_moe_experts",)),
    ({"num_moe_experts": 6, "expert_model_parallel_size": 4, "add_bias_linear": False},
     "--num-experts 6 --expert-model-parallel-size 4 --disable-bias-linear",
     ("expert_model_parallel_size",)),
    ({"recompute_granularity": "selective", "recompute_modules": ["moe_act"],
      "num_moe_experts": 4}, "--recompute-granularity selective --recompute-modules moe_act "
     "--num-experts 4", ("moe_grouped_gemm",)),
]


def write_three_ways(folder: Path, fields: dict, flags: str,
                     entry: str = "pretrain_gpt.py") -> list[str]:
    """The same model as TransformerConfig YAML, MODEL_ARGS YAML and a launch script of
    `entry` (an inference script's options are refused by pretrain_gpt.py's parser)."""
    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    merged = {**base, **fields}
    (folder / "model.yaml").write_text(json.dumps(merged))
    base_flags = "--num-layers 2 --hidden-size 64 --num-attention-heads 4"
    argv = f"{base_flags} {flags}".split()
    values: dict[str, object] = {}
    i = 0
    while i < len(argv):  # later flags win, as argparse
        flag = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values[flag] = argv[i + 1]
            i += 2
        else:
            values[flag] = True
            i += 1
    # An inference script's MODEL_ARGS file says so (its MODE), as upstream's do: the training
    # scripts' parser refuses the inference options.
    mode = {"MODE": "inference"} if "inference" in entry else {}
    (folder / "model_config.yaml").write_text(json.dumps({**mode, "MODEL_ARGS": values}))
    line = " ".join(f"{k} {v}" if v is not True else k for k, v in values.items())
    (folder / "train.sh").write_text(f"#!/bin/bash\ntorchrun {entry} {line}\n")
    return ["model.yaml", "model_config.yaml", "train.sh"]


def gen_upstream(r: random.Random, folder: Path) -> Case:
    fields, flags, words = r.choice(UPSTREAM_REFUSALS)
    files = write_three_ways(folder, fields, flags)
    return Case("upstream", ["check", r.choice(files), *SMALL_RUN], allowed=(2,),
                unchanged=files, words=words, seconds=60, note=flags)


# --- 8. smaller ones -----------------------------------------------------------------------------

def gen_smaller(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE)
    kind = r.choice(["freq_terms", "fifo_baseline", "loop_baseline", "summary_fifo", "cost"])
    argv = ["check", "cfg.yaml", *SMALL_RUN]
    env: dict[str, str] = {}
    allowed: tuple[int, ...] = (2,)
    words: tuple[str, ...] = ()
    if kind == "freq_terms":
        terms = r.choice([1000, 50_000, 100_000, 150_000])
        (folder / "train.sh").write_text(
            "#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 "
            "--num-attention-heads 4 --num-experts 4 --moe-layer-freq '"
            + "+".join(["[1]"] * terms) + "'\n")
        argv[1] = "train.sh"
    elif kind == "fifo_baseline":
        os.mkfifo(folder / "b.json")
        argv += ["--baseline", "b.json"]
        words = ("FIFO",)
    elif kind == "loop_baseline":
        os.symlink("b2.json", folder / "b.json")
        os.symlink("b.json", folder / "b2.json")
        argv += ["--baseline", "b.json"]
        words = ("loop",)
    elif kind == "summary_fifo":
        os.mkfifo(folder / "summary")
        env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(folder / "summary")}
        allowed = (0,)
    else:
        # 65 modules (within the fuzzing build limits): 100 x 64 microbatches under three
        # policies is estimated at about 12 minutes, over the limit.
        (folder / "cfg.yaml").write_text("num_layers: 16\nhidden_size: 64\nnum_attention_heads: 4\n")
        argv = ["check", "cfg.yaml", "--steps", "100", "--microbatches", "64",
                "--compare-policies"]
        words = ("--allow-long-audit",)
    return Case("smaller", argv, allowed=allowed, unchanged=["cfg.yaml"], env=env, words=words,
                seconds=60, note=kind)


FAMILIES: dict[str, Callable[[random.Random, Path], Case]] = {
    "cwd": gen_cwd, "shell": gen_shell, "user_errors": gen_user_errors,
    "report_types": gen_report_types, "outputs": gen_outputs, "commands": gen_commands,
    "upstream": gen_upstream, "smaller": gen_smaller,
}


# --- running and checking a case -----------------------------------------------------------------

def _snapshot(folder: Path, names: list[str]) -> dict[str, tuple]:
    found = {}
    for name in names:
        path = folder / name
        try:
            info = os.lstat(path)
        except OSError:
            found[name] = None
            continue
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else \
            (os.readlink(path) if stat.S_ISLNK(info.st_mode) else b"")
        found[name] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), content)
    return found


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# A deadline here only turns a hang into a failure; it never measures speed (that is
# scripts/bench's and scripts/fuzz's "slow:" list). It is far past any run's cost even on a
# machine loaded 10x, so no deadline is shorter.
HANG_SECONDS = 600.0


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise TimeoutError in this (main) thread after `seconds` (at least HANG_SECONDS)."""
    seconds = max(seconds, HANG_SECONDS)
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    seconds: float
    problems: list[str]


def run_case(case: Case, folder: Path) -> Result:
    """Run `case` with `folder` as the working directory; check the rules above."""
    before = _listing(folder)
    kept = _snapshot(folder, case.unchanged)
    start = time.perf_counter()
    if case.subprocess:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_ACTIONS")}
        env.update(case.env)

        def limit_memory():
            if case.memory_mib:
                import resource
                limit = case.memory_mib << 20
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        try:
            done = subprocess.run([sys.executable, "-m", "qaudit", *case.argv], cwd=folder,
                                  capture_output=True, text=True, errors="replace",
                                  timeout=max(case.seconds, HANG_SECONDS), env=env,
                                  preexec_fn=limit_memory)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired:
            code, out, err = -1, "", f"still running after {max(case.seconds, HANG_SECONDS):.0f} s"
    else:
        saved_env = {k: os.environ.get(k) for k in case.env}
        os.environ.update(case.env)
        saved_path = list(sys.path)
        sys.path[:0] = case.sys_path
        previous = os.getcwd()
        os.chdir(folder)
        from qaudit.plan.upstream import site_dirs

        saved_site_dirs = site_dirs.site_dirs
        if case.installed:
            extra = frozenset(os.path.realpath(p) for p in case.installed)
            site_dirs.site_dirs = lambda: saved_site_dirs() | extra
            sys.path[len(case.sys_path):len(case.sys_path)] = case.installed
        try:
            with _deadline(case.seconds):
                code, out, err = mutations.run_cli(case.argv)
        except TimeoutError as exc:
            code, out, err = -1, "", str(exc)
        finally:
            site_dirs.site_dirs = saved_site_dirs
            os.chdir(previous)
            sys.path[:] = saved_path
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    seconds = time.perf_counter() - start
    problems = check_result(case, folder, code, out, err, before, kept)
    return Result(code, out, err, seconds, problems)


def check_result(case: Case, folder: Path, code: int, out: str, err: str, before: set[str],
                 kept: dict[str, tuple]) -> list[str]:
    from qaudit.render.defuse import has_command_line

    problems = []
    if code == -1:
        problems.append(err)
    elif code not in case.allowed:
        problems.append(f"exit {code}, expected one of {case.allowed}")
    if "Traceback" in err or "internal error" in err:
        problems.append("traceback or internal error")
    if code == 2 and case.several:
        if not err or any(not line.startswith("error: ") for line in err.splitlines()):
            problems.append(f"exit 2 with a line that is no error line: {err[-500:]!r}")
    elif code == 2:
        lines = err.splitlines()
        if len(lines) != 1 or not lines[0].startswith("error: ") or out:
            problems.append(f"exit 2 is not one error line: {err[-500:]!r}")
        for word in case.words:
            if word not in err:
                problems.append(f"{word!r} not in the error line")
    for text in case.forbidden:
        if text in out:
            problems.append(f"{text!r} reached qaudit's stdout")
    if case.printable:
        shown = {c for c in out + err if not (c.isprintable() or c == "\n")}
        if shown:
            problems.append(f"unescaped characters printed: {sorted(shown)[:5]}")
    if list(folder.glob("RAN-*")):
        problems.append(f"code from the working directory ran: {sorted(p.name for p in folder.glob('RAN-*'))}")
    github = "-f" in case.argv and case.argv[case.argv.index("-f") + 1] == "github"
    if not github and has_command_line(out):
        problems.append("a stdout line starts a workflow command")
    for name in case.outputs:
        path = folder / name
        if path.is_file() and not name.endswith(".github") and has_command_line(
                path.read_text(errors="replace")):
            problems.append(f"{name}: a line starts a workflow command")
    now = _snapshot(folder, list(kept))
    for name, state in kept.items():
        if now[name] != state:
            problems.append(f"{name} changed")
    appeared = _listing(folder) - before - {"RAN-" + n for n in PLANTABLE}
    appeared -= set(case.outputs)
    stray = sorted(appeared)
    if stray:
        problems.append(f"files appeared: {stray[:5]}")
    return problems
