"""Hostile and careless inputs, round two (issue 14): one section per class.

1. code from the working directory; 2. unbounded shell evaluation; 3. exit 3 for user errors;
4. reports read without checking types; 5. outputs that destroy data; 6. workflow-command
injection; 7. model checks upstream makes; 8. smaller ones (list expressions, FIFOs, run cost).
scripts/fuzz has a generator for each class (tests/hostile_inputs.py).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import mutations as m

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BASE = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"


def cli(*args: str) -> tuple[int, str, str]:
    return m.run_cli([*args])


def one_error_line(result: tuple[int, str, str], *words: str) -> str:
    code, out, err = result
    assert "Traceback" not in err and "internal error" not in err, err
    assert (code, out) == (2, ""), (code, err)
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"
    return err


# --- 1. code from the working directory --------------------------------------------------------

# Modules qaudit (or torch, which it imports) would import, planted next to the config: each
# leaves a marker file when imported.
PLANTED = ("yaml", "typer", "tabulate", "numpy", "click", "json")


def plant_modules(folder: Path) -> None:
    for name in PLANTED:
        (folder / f"{name}.py").write_text(
            f"open({str(folder / ('RAN-' + name))!r}, 'w').write('imported')\n")
    package = folder / "transformer_engine"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"open({str(folder / 'RAN-transformer_engine')!r}, 'w').write('imported')\n")


def launchers() -> dict[str, list[str]]:
    return {
        "python -m": [sys.executable, "-m", "qaudit"],
        "console script": [str(BIN / "qaudit")],
    }


def run_in(folder: Path, argv: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_ACTIONS")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.mark.parametrize("launcher", sorted(launchers()))
def test_nothing_is_imported_from_the_working_directory(tmp_path, launcher):
    plant_modules(tmp_path)
    (tmp_path / "cfg.yaml").write_text(BASE)
    result = run_in(tmp_path, [*launchers()[launcher], "check", "cfg.yaml", "--steps", "1",
                               "--microbatches", "1", "--runtime", "auto"])
    ran = sorted(p.name for p in tmp_path.glob("RAN-*"))
    assert ran == [], f"{launcher} imported {ran} from the working directory\n{result.stderr}"
    assert result.returncode == 0, result.stderr
    assert "0 error(s)" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--no-python qaudit", "-m qaudit"])
def test_torchrun_never_imports_from_the_working_directory(tmp_path, how):
    # The README's torchrun line runs the console script (--no-python); `-m qaudit` is safe too.
    plant_modules(tmp_path)
    (tmp_path / "cfg.yaml").write_text(BASE)
    torchrun = str(BIN / "torchrun")
    result = run_in(tmp_path, [torchrun, "--standalone", "--nproc-per-node", "1", *how.split(),
                               "check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                               "--runtime", "reference"])
    ran = sorted(p.name for p in tmp_path.glob("RAN-*"))
    assert ran == [], f"torchrun {how} imported {ran}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0 error(s)" in result.stdout


def test_path_cleaning_keeps_other_entries(tmp_path, monkeypatch):
    from qaudit._safepath import drop_working_directory

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), ".", "/usr/lib/python3", str(REPO)])
    drop_working_directory()
    assert sys.path == ["/usr/lib/python3", str(REPO)]


# --- 2. unbounded shell evaluation -------------------------------------------------------------

import random  # noqa: E402
import time  # noqa: E402

import hostile_inputs as h  # noqa: E402
from work_counts import count_calls  # noqa: E402
from qaudit.errors import InputError  # noqa: E402
from qaudit.load.sources.argv import HOLE  # noqa: E402


def read_script(text: str, seconds: float = h.HANG_SECONDS):
    """The launch-script reader on `text`, failing the test (not hanging) past `seconds`."""
    from qaudit.load.sources.launch_script import launch_script_words

    with h._deadline(seconds):
        return launch_script_words(text, "train.sh", {})


BOMBS = {
    # The issue's cases: doubling plus copies or one array (1.1 GB, 23 s before), a loop that
    # copies a large value (hours with more items).
    "doubling-copies": "A=x\n" + "A=$A$A\n" * 19 + "".join(f"B{i}=$A\n" for i in range(40)),
    "doubling-array": "A=x\n" + "A=$A$A\n" * 19 + "ARR=(" + " ".join(['"$A"'] * 60) + ")\n",
    "loop-copy": "A=x\n" + "A=$A$A\n" * 19 + "for i in " + " ".join(map(str, range(1000)))
                 + "; do B=$A; done\n",
    # The same budgets, other ways to spend them.
    "arith-doubling": "a0=1\n" + "".join(f"a{i}='a{i - 1}+a{i - 1}'\n" for i in range(1, 45))
                      + "N=$((a44))\n",
    "fork-results": "A=x\n" + "A=$A$A\n" * 18 + "case $UNKNOWN in " + " ".join(
        f"{i}) X{i}=$A$A$A;;" for i in range(300)) + " esac\n",
    "conditional-array": "A=x\n" + "A=$A$A\n" * 16 + "for i in " + " ".join(
        map(str, range(1000))) + "; do if [ -f /x ]; then ARGS+=(\"$A\"); fi; done\n",
    "function-fanout": "A=x\n" + "A=$A$A\n" * 16 + "f0() { X=$1; }\n" + "".join(
        f"f{i}() {{ f{i - 1} \"$1\"; f{i - 1} \"$1\"; }}\n" for i in range(1, 16)) + "f15 \"$A\"\n",
    "glob-tests": "A=ab\n" + "A=$A$A\n" * 18 + "".join(
        "[[ $A == *a*a*a*a*a*a*a*c ]] && X=1\n" for _ in range(200)),
    "many-launches": "A=\"" + " ".join(["--y z"] * 20000) + "\"\n" + "".join(
        "torchrun pretrain_gpt.py $A\n" for _ in range(200)),
    "tiny-commands": "echo a b c\n" * 30_000,
}


def held_characters(interpreter) -> int:
    """Characters in the interpreter's variables, counted from the values themselves (not
    from its own bookkeeping)."""
    total = 0
    for value in interpreter.env.values():
        items = value if isinstance(value, list) and value and isinstance(value[0], list) \
            else [value]
        total += sum(len(item) for item in items if isinstance(item, (list, tuple, str)))
    return total


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_shell_budgets_end_in_exit_2_naming_file_and_line(name, monkeypatch):
    from qaudit.load.sources import shell_eval

    steps = count_calls(monkeypatch, shell_eval.Interpreter, "step")
    charged = []  # characters counted as copied before each charge (the last one is refused)
    original_spend = shell_eval.Interpreter.spend
    monkeypatch.setattr(shell_eval.Interpreter, "spend",
                        lambda self, n: (charged.append(self.work), original_spend(self, n)))
    with pytest.raises(InputError) as info:
        read_script("#!/bin/bash\n" + BOMBS[name] + h.LAUNCH)
    error = info.value
    assert error.file == "train.sh" and error.line, str(error)
    assert any(word in str(error) for word in ("characters", "words, operators")), str(error)
    # The work done before the refusal is bounded by the budgets, counted in commands
    # followed and characters copied or held (not in seconds).
    interpreter = steps.instances[-1] if steps.instances else None
    if interpreter is not None:
        assert steps.calls <= shell_eval.MAX_STEPS
        assert not charged or charged[-1] <= shell_eval.MAX_WORK
        assert held_characters(interpreter) <= shell_eval.MAX_HELD


def test_budget_errors_through_the_cli(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n" + BOMBS["doubling-copies"] + h.LAUNCH)
    one_error_line(cli("check", str(script)), f"{script}:", "hold more than 4,000,000")
    script.write_text("#!/bin/bash\n" + BOMBS["loop-copy"] + h.LAUNCH)
    one_error_line(cli("check", str(script)), f"{script}:22:", "copies more than 20,000,000")


def test_scripts_within_the_budgets_still_read(tmp_path):
    # A loop over a few hundred flags, a 500,000-character value copied a few times, a
    # function called in a loop: all well under the budgets.
    text = ("#!/bin/bash\nBIG=" + "x" * 500_000 + "\nCOPY=$BIG\nARGS=()\n"
            "add() { ARGS+=(\"$1\"); }\n"
            + "for i in " + " ".join(map(str, range(300))) + "; do add --flag-$i; done\n"
            + "if [ -f /x ]; then ARGS+=(--maybe); fi\n"
            + "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
              "\"${ARGS[@]}\"\n")
    words = read_script(text)[0]
    assert [w.text for w in words][:6] == ["--num-layers", "2", "--hidden-size", "64",
                                           "--num-attention-heads", "4"]
    assert len(words) == 6 + 300 + 1


# Counted work (commands followed, characters copied) and peak memory of one read; the
# seconds it takes are scripts/bench's (docs/security.md), not a test's.
MEASURE = """
import resource, sys
from qaudit.errors import InputError
from qaudit.load.sources import shell_eval
from qaudit.load.sources.launch_script import launch_script_words
seen, charged = [], [0]
original_run, original_spend = shell_eval.Interpreter.run, shell_eval.Interpreter.spend
def run(self, script):
    seen.append(self)
    return original_run(self, script)
def spend(self, characters):
    charged[0] = self.work  # before this charge: a refused one is never carried out
    return original_spend(self, characters)
shell_eval.Interpreter.run, shell_eval.Interpreter.spend = run, spend
text = open(sys.argv[1]).read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    launch_script_words(text, sys.argv[1], {})
    outcome = "read"
except InputError as exc:
    outcome = "exit 2"
print(seen[-1].steps if seen else 0, charged[0], (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                      - before) / 1024, outcome)
"""


def big_scripts() -> dict[str, str]:
    mib = 1 << 20
    return {
        **{name: BOMBS[name] for name in ("doubling-copies", "doubling-array", "fork-results",
                                          "function-fanout", "many-launches")},
        "1mib-literal": "A=" + "x" * (mib - 200) + "\nB=$A\nC=$A\n",
        "1mib-arithmetic": "N=$(( " + "+".join(["1"] * (mib // 2 - 100)) + " ))\n",
        # Tiny commands: 18 s and 232 MB, and 20 s and 370 MB, before the word limit.
        "1mib-commands": "echo hello world\n" * (mib // 17 - 100),
        "1mib-copies": "A=" + "y" * 1000 + "\n" + "B=$A\n" * (mib // 5 - 300),
        "1mib-words": "ARGS=\"" + " ".join(["--x"] * (mib // 4 - 100)) + "\"\necho $ARGS\n",
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(big_scripts()))
def test_any_script_under_1_mib_reads_within_the_budgets_and_under_200_mb(tmp_path, name):
    from qaudit.load.sources import shell_eval

    text = "#!/bin/bash\n" + big_scripts()[name] + h.LAUNCH
    assert len(text.encode()) < 1 << 20
    script = tmp_path / "train.sh"
    script.write_text(text)
    done = subprocess.run([sys.executable, "-c", MEASURE, str(script)], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr
    steps, work, megabytes, _ = done.stdout.split(maxsplit=3)
    assert int(steps) <= shell_eval.MAX_STEPS + 1, done.stdout
    assert int(work) <= shell_eval.MAX_WORK, done.stdout
    assert float(megabytes) < 200, done.stdout


def test_every_character_keeps_its_source_line():
    """Quoted, unquoted, multi-line and escaped literals and line continuations: each
    character of a value remembers the line it was written on (findings cite it)."""
    from qaudit.load.sources.shell_eval import Interpreter
    from qaudit.load.sources.shell_tree import Script

    text = "A=abc'd\ne'\"f\ng$X h\\\ni\"k\\ j\nB=\"${U:-x\ny}\"$'p\\nq'\n"
    env = Interpreter("f", {"X": "-"}).run(Script(text, "f")).env
    assert [(c, line) for c, line, _ in env["A"]] == [
        ("a", 1), ("b", 1), ("c", 1), ("d", 1), ("\n", 1), ("e", 2), ("f", 2), ("\n", 2),
        ("g", 3), ("-", 0), (" ", 3), ("h", 3), ("i", 4), ("k", 4), (" ", 4), ("j", 4)]
    assert [(c, line) for c, line, _ in env["B"]] == [("x", 5), ("\n", 5), ("y", 6),
                                                      ("p", 6), ("\n", 6), ("q", 6)]


@pytest.mark.parametrize("script, argv", [
    # tree-sitter-bash joins these lines into one command (`A` and `B` the environment of a
    # `while`, here, and the launch inside an `||` never taken); bash runs them one by one.
    ("true && A=2 B=3\nC=(--x)\nwhile false; do :; done\nL $A $B ${C[@]}\n", ["2", "3", "--x"]),
    ("A=2 B=3\nL $A $B\n", ["2", "3"]),
    ("[ 1 = 1 ] || A=1 B=2\nL $B\n", [HOLE]),  # never set: unknown
    # tree-sitter reads `$((...))` in a default as a command substitution of a subshell.
    ("A=${U:-$(( 2 + 3 ))}\nL $A\n", ["5"]),
    # ... splits `-2**2` in a test, and a word at a line continuation or after `"a"\\ `.
    ("[[ -2**2 == -2* ]] && A=7\nL $A\n", ["7"]),
    ("L ab\\\ncd \"x\"\\ y\n", ["abcd", "x y"]),
    # `$"..."` is one word; `"$@"` with no arguments is none.
    ("L $\"t u\" \"$@\"\n", ["t u"]),
])
def test_tree_sitter_misreadings_are_repaired(script, argv):
    words = read_script(script.replace("L ", "torchrun pretrain_gpt.py --num-layers 2 "))[0]
    assert [w.text for w in words][2:] == argv


@pytest.mark.parametrize("script, line, words", [
    ("A=1\nif true; then\n  echo (\nfi\n", 3, "near 'if'"),
    ("A=1\nB=\"unterminated\n", 3, "string never closed: expected '\"'"),
    ("X=$(( 1 + ))\nfor x in a; do\n", 2, "near '$(('"),
])
def test_scripts_tree_sitter_cannot_read_are_refused_with_file_and_line(tmp_path, script,
                                                                         line, words):
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/bash\n" + script)  # line 1; the script's lines start at 2
    one_error_line(cli("check", str(path)), f"{path}:{line}: cannot read the script", words)


# --- 3. exit 3 for user errors -------------------------------------------------------------------

@pytest.mark.parametrize("literal", ["1" * 5000, "0x" + "f" * 200, "0" + "7" * 150])
def test_arithmetic_literal_too_long_is_exit_2(tmp_path, literal):
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\nN=$(( {literal} ))\n{h.LAUNCH}")
    one_error_line(cli("check", str(script)), f"{script}:2: ", "digits")


@pytest.mark.parametrize("value, words", [
    ("(" * 5000 + "[1]" + ")" * 5000, ("nested more than 50",)),
    ("[" + "1" * 5000 + "]", ("digits",)),
    ("([0]*" + "9" * 5000 + ")", ("digits",)),
])
def test_layer_freq_that_crashed_is_exit_2(tmp_path, value, words):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      f"--num-attention-heads 4 --num-experts 2 --moe-layer-freq '{value}'\n")
    one_error_line(cli("check", str(script)), f"{script}:2: key '--moe-layer-freq'", *words)


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, ("nested too deeply",)),
    ('{"schema": "qaudit-baseline/1", "findings": [], "n": ' + "9" * 5000 + "}",
     ("more than 100 digits",)),
])
@pytest.mark.parametrize("where", ["baseline", "diff"])
def test_deep_or_huge_json_is_exit_2(tmp_path, text, words, where):
    config = tmp_path / "cfg.yaml"
    config.write_text(BASE)
    report = tmp_path / "r.json"
    report.write_text(text.replace("qaudit-baseline/1", "qaudit/1") if where == "diff" else text)
    args = ("check", str(config), "--baseline", str(report)) if where == "baseline" else \
        ("diff", str(report), str(config))
    one_error_line(cli(*args), f"{report}: ", *words)


@pytest.mark.parametrize("option", ["-o", "--baseline", "--write-baseline", "diff"])
@pytest.mark.parametrize("name, words", [("p" * 5000, ("too long",)),
                                         ("a\x00b.json", ("NUL",))], ids=["long", "nul"])
def test_paths_too_long_or_with_nul_are_exit_2(tmp_path, option, name, words):
    config = tmp_path / "cfg.yaml"
    config.write_text(BASE)
    path = str(tmp_path / name)
    if option == "diff":
        args = ("diff", path + ".json", str(config))
    elif option == "-o":
        args = ("check", str(config), "-o", f"json={path}")
    else:
        args = ("check", str(config), option, path)
    err = one_error_line(cli(*args), f"{path[:40]}", *words)
    assert len(err) < 2100


# --- 4. reports and baselines read without checking types ----------------------------------------

def report_with(change) -> str:
    import json

    data = json.loads(h.good_report())
    change(data)
    return json.dumps(data)


TYPE_ERRORS = {
    "severity-critical": (lambda d: d["findings"][0].update(severity="critical"),
                          "findings[0].severity"),
    "evidence-dict": (lambda d: d["findings"][0].update(evidence={"a": 1}), "findings[0].evidence"),
    "module-name-null": (lambda d: d["modules"][0].update(name=None), "modules[0].name"),
    "runtime-number": (lambda d: d.update(runtime=3), "runtime"),
    "steps-string": (lambda d: d.update(steps="2"), "steps"),
    "steps-bool": (lambda d: d.update(steps=True), "steps"),
    # A guard's report carries the process's code (0-255); no process exits 256.
    "exit-code-256": (lambda d: d.update(exit_code=256), "exit_code"),
    "modules-dict": (lambda d: d.update(modules={}), "modules"),
    "calls-negative": (lambda d: d["modules"][0].update(calls_per_microbatch=-1),
                       "modules[0].calls_per_microbatch"),
    "summary-missing": (lambda d: d.pop("summary"), "summary"),
}


@pytest.mark.parametrize("name", sorted(TYPE_ERRORS))
def test_report_with_wrong_types_is_exit_2_naming_the_key(tmp_path, name):
    change, key = TYPE_ERRORS[name]
    report = tmp_path / "r.json"
    report.write_text(report_with(change))
    config = tmp_path / "cfg.yaml"
    config.write_text(BASE)
    one_error_line(cli("diff", str(report), str(config), "--steps", "1", "--microbatches", "1"),
                   f"{report}: key '{key}': not a valid qaudit JSON report")


@pytest.mark.parametrize("entry, key", [
    ({"fingerprint": 5}, "findings[0].fingerprint"),
    ({"fingerprint": "sha256:" + "0" * 32, "severity": "critical"}, "findings[0].severity"),
    ({"fingerprint": "sha256:" + "0" * 32, "module": {"a": 1}}, "findings[0].module"),
    ({"fingerprint": "not-a-fingerprint"}, "findings[0].fingerprint"),
])
def test_baseline_with_wrong_types_is_exit_2_naming_the_key(tmp_path, entry, key):
    import json

    baseline = tmp_path / "b.json"
    baseline.write_text(json.dumps({"schema": "qaudit-baseline/1", "findings": [entry]}))
    config = tmp_path / "cfg.yaml"
    config.write_text(BASE)
    one_error_line(cli("check", str(config), "--baseline", str(baseline)),
                   f"{baseline}: key '{key}': not a valid qaudit baseline")


def test_the_checker_knows_every_keyword_of_the_shipped_schemas():
    from qaudit.load.schema_check import ANNOTATIONS, SUPPORTED, keywords, load_schema

    for name in ("report-v1.schema.json", "baseline-v1.schema.json", "baseline-v2.schema.json"):
        assert keywords(load_schema(name)) <= SUPPORTED | ANNOTATIONS | {"properties"}, name


def test_the_checker_agrees_with_jsonschema_on_corrupted_reports():
    """The same verdict as the jsonschema package (a test dependency) on 300 corruptions."""
    import json

    import jsonschema

    from qaudit.load.schema_check import SchemaViolation, check, load_schema

    schema = load_schema("report-v1.schema.json")
    r = random.Random(14)
    for _ in range(300):
        data = json.loads(h.corrupt_json(h.good_report(), r))
        expected = jsonschema.Draft202012Validator(schema).is_valid(data)
        try:
            check(data, schema)
            ours = True
        except SchemaViolation:
            ours = False
        assert ours == expected, data


def test_reports_written_by_qaudit_still_load(tmp_path):
    report = tmp_path / "r.json"
    report.write_text(h.good_report())
    baseline = tmp_path / "b.json"
    baseline.write_text(h.good_baseline())
    config = tmp_path / "cfg.yaml"
    config.write_text(BASE)
    code, out, err = cli("diff", str(report), str(report))
    assert code == 0 and "no module changes" in out, err
    code, out, err = cli("check", str(config), "--baseline", str(baseline), "--steps", "1",
                         "--microbatches", "1")
    assert code == 0, err


# --- 5. outputs that destroy data ----------------------------------------------------------------

@pytest.fixture
def inputs(tmp_path, monkeypatch):
    """A config, a recipe and a baseline in tmp_path, which is also the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    (tmp_path / "cfg.yaml").write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n"
                                       "quant_recipe: r.yaml\n")
    (tmp_path / "r.yaml").write_text(h.RECIPE)
    (tmp_path / "b.json").write_text(h.good_baseline())
    return tmp_path


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("args, words", [
    (("-o", "markdown=cfg.yaml"), ("--output markdown would overwrite the config",)),
    (("-o", "json=r.yaml"), ("overwrite the recipe",)),  # the config's quant_recipe
    (("--recipe", "r.yaml", "-o", "sarif=r.yaml"), ("overwrite the recipe",)),
    (("--baseline", "b.json", "-o", "json=b.json"), ("overwrite the baseline",)),
    (("--baseline", "b.json", "--write-baseline", "b.json"), ("overwrite the baseline",)),
    (("-o", "json=r.json", "--write-baseline", "r.json"), ("of --output json",)),
    (("-o", "json=x.json", "-o", "md=./x.json"), ("of --output json",)),
    (("-o", "json=cfg-link.yaml"), ("is a symbolic link",)),  # round three: never followed
    (("-o", "json=cfg-hard.yaml"), ("overwrite the config",)),
    (("-o", "json=newdir/"), ("names a directory",)),
    (("-o", "json=."), ("names a directory",)),
], ids=["config", "quant-recipe", "recipe", "baseline", "write-baseline-is-baseline",
        "write-baseline-is-output", "two-outputs", "symlink-to-config", "hard-link-to-config",
        "trailing-slash", "dot"])
def test_outputs_that_would_destroy_data_are_refused(inputs, args, words):
    os.symlink("cfg.yaml", inputs / "cfg-link.yaml")
    os.link(inputs / "cfg.yaml", inputs / "cfg-hard.yaml")
    before = contents(inputs)
    one_error_line(cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1", *args), *words)
    assert contents(inputs) == before
    assert not (inputs / "newdir").exists()


def test_diff_outputs_cannot_overwrite_a_side(inputs):
    (inputs / "base.json").write_text(h.good_report())
    before = contents(inputs)
    one_error_line(cli("diff", "base.json", "cfg.yaml", "-o", "json=base.json"),
                   "overwrite the base")
    assert contents(inputs) == before


def test_new_files_follow_the_umask_and_existing_ones_keep_their_mode(inputs):
    old_mask = os.umask(0o027)
    try:
        os.umask(0o027)
        (inputs / "kept.json").write_text("{}")
        os.chmod(inputs / "kept.json", 0o604)
        code, _, err = cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                           "-o", "json=new.json", "-o", "sarif=kept.json",
                           "--write-baseline", "new-b.json")
    finally:
        os.umask(old_mask)
    assert code == 0, err
    mode = lambda name: stat.S_IMODE(os.stat(inputs / name).st_mode)  # noqa: E731
    assert (mode("new.json"), mode("new-b.json"), mode("kept.json")) == (0o640, 0o640, 0o604)
    assert b'"version": "2.1.0"' in (inputs / "kept.json").read_bytes()


def test_a_symlinked_output_stays_a_symlink(inputs):
    (inputs / "real.json").write_text("{}")
    os.symlink("real.json", inputs / "link.json")
    os.symlink("missing.json", inputs / "dangling.json")
    code, _, err = cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                       "-o", "json=link.json", "-o", "md=dangling.json",
                       "--allow-symlinked-output")  # refused without it (round three)
    assert code == 0, err
    assert os.readlink(inputs / "link.json") == "real.json"
    assert b'"schema": "qaudit/1"' in (inputs / "real.json").read_bytes()
    assert os.readlink(inputs / "dangling.json") == "missing.json"
    assert (inputs / "missing.json").read_text().startswith("\u2705")


def test_non_regular_targets_are_written_through_or_refused(inputs):
    os.mkfifo(inputs / "fifo")
    # "no reader" is what a non-blocking open says (ENXIO): a blocking one would wait instead.
    one_error_line(cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                       "-o", "json=fifo"), "fifo: cannot write: a FIFO (named pipe) with no reader")
    assert stat.S_ISFIFO(os.lstat(inputs / "fifo").st_mode)
    code, _, err = cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                       "-o", "json=/dev/null")
    assert code == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_with_a_reader_gets_the_report(inputs):
    """The reader's end is open before qaudit runs (no sleep, no retry: a thread that had
    not reached its open() yet made qaudit see no reader); a second writer end, held by the
    test, keeps the reader from seeing the end of the data before qaudit has written it."""
    import threading

    os.mkfifo(inputs / "fifo")
    read_end = os.open(inputs / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    held_writer = os.open(inputs / "fifo", os.O_WRONLY)
    os.set_blocking(read_end, True)
    received = []

    def read_all():
        with os.fdopen(read_end, "rb") as handle:
            received.append(handle.read())

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()  # it drains the FIFO while qaudit writes (a report may exceed the pipe)
    try:
        code, _, err = cli("check", "cfg.yaml", "--steps", "1", "--microbatches", "1",
                           "-o", "json=fifo")
    finally:
        os.close(held_writer)
    reader.join(timeout=600)
    assert code == 0, err
    assert received and b'"schema": "qaudit/1"' in received[0]


def test_dev_stdout_gets_the_report_and_stays_a_device(tmp_path):
    (tmp_path / "cfg.yaml").write_text(BASE)
    out = tmp_path / "out.txt"
    with open(out, "w") as handle:
        done = subprocess.run([str(BIN / "qaudit"), "check", "cfg.yaml", "--steps", "1",
                               "--microbatches", "1", "-o", "json=/dev/stdout"], cwd=tmp_path,
                              stdout=handle, stderr=subprocess.PIPE, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.count('"schema": "qaudit/1"') == 1 and "0 error(s)" in text  # both, in order
    assert text.index('"schema"') < text.index("0 error(s)")


# The rename waits until the test has sent its signal (the "go" file), however slow the
# machine: a fixed sleep let a loaded machine signal only after the write had finished.
# write_file renames with os.rename(..., src_dir_fd=, dst_dir_fd=) (files/outputs.py).
WRITER = """
import os, signal, sys, time
# As started from a terminal: a child of nohup or of a background job inherits SIGHUP or
# SIGINT ignored, and an ignored signal is not delivered after the rename either.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
from qaudit.files import outputs
real_rename = os.rename  # write_file renames the temporary file in its directory's fd
def slow_rename(*args, **kwargs):
    open(sys.argv[2], "w").write("ready")
    deadline = time.monotonic() + 600  # a hang guard only
    while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
        time.sleep(0.01)
    real_rename(*args, **kwargs)
os.rename = slow_rename
outputs.write_file(sys.argv[1], "report\\n" * 1000)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_no_temporary_file_is_left_when_killed(tmp_path, signum):
    target, ready, go = tmp_path / "out" / "r.json", tmp_path / "ready", tmp_path / "go"
    target.parent.mkdir()
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(ready), str(go)],
                             cwd=REPO, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while not ready.exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), child.stderr.read() if child.poll() is not None else "not ready"
    child.send_signal(signum)  # while the temporary file exists
    go.write_text("go")
    child.wait(timeout=600)
    assert child.returncode != 0  # it still ends, after the rename
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]
    assert target.read_text() == "report\n" * 1000


# --- 6. workflow-command injection through the table -----------------------------------------

def command_lines(text: str) -> list[str]:
    from qaudit.render.defuse import has_command_line

    return [line for line in text.replace("\r", "\n").split("\n") if has_command_line(line)]


@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "sarif", "svg"])
@pytest.mark.parametrize("expand", [False, True])
def test_no_line_of_any_format_starts_a_workflow_command(tmp_path, fmt, expand):
    import json

    # Long names wrap; the command lands at the start of a continuation line.
    recipe = {"configs": {"w" * 60 + " ::error::config": {
        "transformer_engine_config_type": "TEQuantizationParams", "training_recipe": {}}},
        "matchers": {
            "w" * 70 + " ::error::pwned ::stop-commands::tok": {
                "type": "glob", "pattern": "nothing", "config": "w" * 60 + " ::error::config"},
            "x" * 75 + " ##[error]legacy \u00a0::warning::nbsp": {
                "type": "glob", "pattern": "*linear_proj", "config": "w" * 60 + " ::error::config",
                "enabled": True}}}
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    (tmp_path / "cfg.yaml").write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n")
    out_file = tmp_path / f"out.{fmt}"
    code, out, err = cli("check", str(tmp_path / "cfg.yaml"), "--recipe", str(tmp_path / "r.yaml"),
                         "--steps", "1", "--microbatches", "1",
                         *(["-f", fmt] if fmt != "svg" else []), "-o", f"{fmt}={out_file}",
                         *(["--expand"] if expand else []))
    assert code == 0, err
    assert fmt == "svg" or "pwned" in out_file.read_text()  # the SVG shows no matcher names
    assert command_lines(out) == [] and command_lines(out_file.read_text()) == []
    assert command_lines(err) == []


def test_github_format_lines_are_only_its_own_commands(tmp_path):
    import json

    recipe = {"configs": {"hp": {"transformer_engine_config_type": "TEQuantizationParams",
                                 "training_recipe": {}}},
              "matchers": {"a\n::error::pwned\r::warning::x": {
                  "type": "glob", "pattern": "nothing", "config": "hp"}}}
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    (tmp_path / "cfg.yaml").write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n")
    code, out, _ = cli("check", str(tmp_path / "cfg.yaml"), "--recipe", str(tmp_path / "r.yaml"),
                       "-f", "github", "--steps", "1", "--microbatches", "1")
    lines = out.splitlines()
    assert all(line.startswith(("::warning ", "::error ", "::notice ", "qaudit: "))
               for line in lines), lines


def test_defuse_covers_every_line_start():
    from qaudit.render.defuse import defuse

    assert command_lines(defuse("x\n   ::error::a\r::b\n##[c]\n\u00a0::d")) == []
    assert defuse("  ::error::a") == "  \\::error::a"
    assert defuse("a ::error::b") == "a ::error::b"  # not at a line start: harmless


# --- 7. model checks upstream makes -------------------------------------------------------------

@pytest.mark.parametrize("index", range(len(h.UPSTREAM_REFUSALS)),
                         ids=[c[1].split()[0] + "+" + c[1].split()[-2].lstrip("-")
                              for c in h.UPSTREAM_REFUSALS])
def test_upstream_refusals_on_every_route(tmp_path, index):
    fields, flags, words = h.UPSTREAM_REFUSALS[index]
    for name in h.write_three_ways(tmp_path, fields, flags):
        path = str(tmp_path / name)
        one_error_line(cli("check", path, "--steps", "1", "--microbatches", "1"),
                       f"{path}:", "key '", *words)


@pytest.mark.parametrize("fields, flags", [
    ({"hidden_size": 100, "num_attention_heads": 8, "kv_channels": 16},
     "--hidden-size 100 --num-attention-heads 8 --kv-channels 16"),
    ({"num_moe_experts": 4, "moe_shared_expert_intermediate_size": 64, "add_bias_linear": False},
     "--num-experts 4 --moe-shared-expert-intermediate-size 64 --disable-bias-linear"),
    ({"num_moe_experts": 4, "moe_router_topk": 1, "moe_router_pre_softmax": True},
     "--num-experts 4 --moe-router-topk 1 --moe-router-pre-softmax"),
    ({"num_moe_experts": 4, "moe_router_topk": 1, "moe_router_score_function": "sigmoid"},
     "--num-experts 4 --moe-router-topk 1 --moe-router-score-function sigmoid"),
    ({"num_moe_experts": 4, "moe_router_topk": 1, "moe_router_load_balancing_type": "sinkhorn"},
     "--num-experts 4 --moe-router-topk 1 --moe-router-load-balancing-type sinkhorn"),
    ({"num_moe_experts": 8, "moe_router_num_groups": 4, "moe_router_group_topk": 2,
      "tensor_model_parallel_size": 2, "expert_model_parallel_size": 4},
     "--num-experts 8 --moe-router-num-groups 4 --moe-router-group-topk 2 "
     "--tensor-model-parallel-size 2 --expert-model-parallel-size 4"),
], ids=["kv-channels", "no-bias", "pre-softmax", "sigmoid", "sinkhorn", "groups-and-sizes"])
def test_what_upstream_accepts_still_audits(tmp_path, fields, flags):
    for name in h.write_three_ways(tmp_path, fields, flags):
        code, out, err = cli("check", str(tmp_path / name), "--steps", "1", "--microbatches", "1")
        assert code == 0, f"{name}: {err}"


def test_a_value_from_outside_skips_the_check_instead_of_guessing(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nif [ -n \"$NOBIAS\" ]; then X=--disable-bias-linear; fi\n"
                      "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 4 --num-experts 4 "
                      "--moe-shared-expert-intermediate-size 64 $X\n")
    code, out, err = cli("check", str(script), "--steps", "1", "--microbatches", "1")
    assert code in (0, 1) and "shared_experts" in out, err


def test_checked_fields_are_type_checked_in_yaml(write_yaml):
    from qaudit.commands.check import load_inputs

    path = write_yaml("cfg.yaml", BASE + "add_bias_linear: 'no'\n")
    with pytest.raises(InputError) as info:
        load_inputs(path)
    assert (info.value.line, info.value.key) == (4, "add_bias_linear")
    assert "expected true or false" in str(info.value)


# --- 8. smaller ones -----------------------------------------------------------------------------

def test_a_100000_term_layer_freq_parses_in_linear_time(monkeypatch):
    from qaudit.load.sources import listexpr

    tokens = count_calls(monkeypatch, listexpr._Parser, "take")
    terms = count_calls(monkeypatch, listexpr._Parser, "term")
    assert listexpr.parse_list_expression("+".join(["[1]"] * 100_000)) == [1] * 100_000
    # Each token is taken once (3 per term and the "+" between terms), each term built once.
    assert (tokens.calls, terms.calls) == (4 * 100_000 - 1, 100_000)


@pytest.mark.parametrize("kind, words", [("fifo", "is a FIFO (named pipe)"),
                                         ("loop", "is a symbolic link loop"),
                                         ("dir", "is a directory"),
                                         ("dangling", "symbolic link to a file that does not")])
@pytest.mark.parametrize("where", ["baseline", "diff"])
def test_baseline_or_report_that_is_not_a_file_says_what_it_is(tmp_path, kind, words, where):
    path = tmp_path / "b.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        os.symlink("c.json", path)
        os.symlink("b.json", tmp_path / "c.json")
    elif kind == "dir":
        path.mkdir()
    else:
        os.symlink("nowhere.json", path)
    config = tmp_path / "cfg.yaml"
    config.write_text(BASE)
    args = ("check", str(config), "--baseline", str(path)) if where == "baseline" else \
        ("diff", str(path), str(config))
    one_error_line(cli(*args), f"{path}: ", words)


def test_job_summary_fifo_does_not_block(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "summary")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary"))
    (tmp_path / "cfg.yaml").write_text(BASE)
    with h._deadline(60):
        code, out, err = cli("check", str(tmp_path / "cfg.yaml"), "--steps", "1",
                             "--microbatches", "1")
    assert code == 0
    assert "cannot append to GITHUB_STEP_SUMMARY" in err and "no reader" in err


DEEPSEEK_ISH = ("num_layers: 61\nhidden_size: 1024\nnum_attention_heads: 8\nnum_moe_experts: 256\n"
                "moe_grouped_gemm: true\nadd_bias_linear: false\n"
                "moe_shared_expert_intermediate_size: 512\nmtp_num_layers: 1\n")


def test_long_runs_are_estimated_and_refused_unless_allowed(tmp_path, monkeypatch):
    config = tmp_path / "cfg.yaml"
    config.write_text(DEEPSEEK_ISH)

    def must_not_train(*args, **kwargs):
        raise AssertionError("trained before refusing")

    # Refused before a single microbatch runs (the run it refuses would take hours).
    monkeypatch.setattr("qaudit.run.audit.run_training", must_not_train)
    result = cli("check", str(config), "--steps", "100", "--microbatches", "64")
    err = one_error_line(result, f"{config}: the audit would run for about", "--allow-long-audit")
    assert " h " in err
    result = cli("check", str(config), "--steps", "50", "--microbatches", "8",
                 "--compare-policies")
    from qaudit.plan.policies import COMPARED_POLICIES

    one_error_line(result, f"x {len(COMPARED_POLICIES)} runs")
    # The flag lets it run (the run itself is replaced: only the refusal is under test).
    monkeypatch.setattr("qaudit.run.audit.run_training", lambda *a, **k: None)
    code, out, err = cli("check", str(config), "--steps", "100", "--microbatches", "64",
                         "--allow-long-audit", "-f", "json")
    assert code in (0, 1) and '"steps": 100' in out, err


def test_estimate_counts_modules_expert_gemms_and_microbatches(repo_configs):
    """The estimate is counted work: one unit per module and per extra expert GEMM of a
    grouped module, per microbatch and run. How many seconds a unit takes on a 2-core CPU is
    a measurement (docs/performance.md), not a test's."""
    from qaudit.commands.check import load_inputs
    from qaudit.model.gpt import build_model
    from qaudit.model.session import Session
    from qaudit.plan.dims import model_dims
    from qaudit.plan.policies import POLICIES
    from qaudit.run import cost
    from qaudit.runtime import select_runtime

    config, recipe = load_inputs(str(repo_configs / "qwen3-235b-a22b-mxfp8.yaml"))
    model = build_model(config, model_dims(config, False),
                        Session(select_runtime("reference", None), POLICIES["config"]), recipe)
    modules = list(model.audited_modules())
    gemms = sum(cost.expert_gemms(module) for module in modules)
    assert gemms > 0  # grouped experts: weight0..weightN or one stacked weight
    one = cost.estimate_seconds(modules, 1)
    assert one == pytest.approx(len(modules) * cost.SECONDS_PER_MODULE
                                + gemms * cost.SECONDS_PER_GROUPED_EXPERT)
    assert cost.estimate_seconds(modules, 4, runs=3) == pytest.approx(12 * one)
