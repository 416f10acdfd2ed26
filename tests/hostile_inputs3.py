"""Generators of hostile inputs for the classes of issue 21 (round three), one per class,
for `scripts/fuzz` (tests/test_hostile_round3.py tests each class directly):

- `megatron`: a fake Megatron on sys.path whose import exits, interrupts, raises any
  BaseException, calls os._exit, kills itself, prints floods, forks, hangs or exhausts memory,
  run with `--cross-check`: always exit 3 with one line, nothing upstream printed on stdout;
- `symlinks`: outputs and baselines that are symlinks (to files outside, dangling, chains) or
  lie in symlinked directories: refused, nothing outside changes;
- `shell3`: the launch-script shapes outside the budget (left-deep && lists, nested `<(` and
  `[[ (`, here-documents full of expansions, many here-documents on a line), around the bounds;
- `globs`: recipe patterns around the length and wildcard bounds;
- `escaping`: reports, baselines and configs whose strings hold ANSI, bidi, C1 controls and lone
  surrogates, through check and diff in every format: every printed character printable;
- `encoding`: markdown and table on a stdout without UTF-8 (child process);
- `version_env`: odd dist-info METADATA and VERSION.txt files on PYTHONPATH (symlinks to
  /dev/zero, FIFOs, loops, huge versions) read by `--megatron auto` / `--te auto`
  (child process, with a memory limit and a deadline).
"""

from __future__ import annotations

import json
import os
import random
import textwrap
from pathlib import Path

from hostile_inputs import BASE, LAUNCH, RECIPE, SMALL_RUN, Case, good_baseline, good_report

# --- megatron: the user's own Megatron under --cross-check ---------------------------------

UPSTREAM_MARK = "UPSTREAM-OUTPUT"
MEGATRON_BODIES = [
    "exit()", "exit(0)", "import sys; sys.exit(1)", "import sys; sys.exit('text \\x1b[31m')",
    "raise SystemExit(130)", "raise KeyboardInterrupt", "raise GeneratorExit('g')",
    "class Odd(BaseException): pass\nraise Odd('odd \\u202e')",
    "import os; os._exit(0)", "import os; os._exit(1)", "import os; os._exit(2)",
    "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "import os, signal; os.kill(os.getpid(), signal.SIGINT)",
    "raise RuntimeError('\\u202e\\x1b]0;title\\x07\\r' * 50)",
    "raise MemoryError", "raise RecursionError('deep')",
    "def f(): f()\nf()",
    "x = bytearray(64 * 1024 ** 3)",
    "x = [bytearray(1 << 20) for _ in range(100000)]",
    "import time; time.sleep(3600)",
    "while True: pass",
    "import os, time\nif os.fork() == 0:\n    time.sleep(3600)\nraise RuntimeError('forked')",
    "import os\nif os.fork() == 0:\n    os._exit(0)\nimport time; time.sleep(3600)",
    "import os\nos.close(1)\nos.close(2)\nraise RuntimeError('closed')",
    "import sys\nsys.stdout = None\nraise RuntimeError('no stdout')",
    "import atexit, os\natexit.register(lambda: os.write(1, b'%s-atexit'))\nexit(0)",
    "import threading, os, time\n"
    "threading.Thread(target=lambda: [os.write(1, b'%s\\n') or time.sleep(0.01) "
    "for _ in range(1000)], daemon=True).start()\nraise RuntimeError('thread')",
    "import signal; signal.signal(signal.SIGALRM, signal.SIG_IGN)\nimport time; time.sleep(3600)",
    "import os\nfor _ in range(100000): os.write(1, b'%s ' * 100)\nraise RuntimeError('flood')",
    "print('%s', flush=True)\nimport sys; sys.stderr.write('%s\\n')\nexit()",
    "import sys\nsys.modules['qaudit'] = None\nraise ImportError('shadow')",
]


def gen_megatron(r: random.Random, folder: Path) -> Case:
    body = r.choice(MEGATRON_BODIES).replace("%s", UPSTREAM_MARK)
    tree = folder / "tree"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "__init__.py").write_text("")
    where = r.choice(["core", "core", "package"])
    if where == "core":
        (tree / "megatron" / "core" / "__init__.py").write_text(body + "\n")
    else:
        (tree / "megatron" / "__init__.py").write_text(body + "\n")
        (tree / "megatron" / "core" / "__init__.py").write_text("")
    (folder / "cfg.yaml").write_text(BASE)
    argv = ["check", "cfg.yaml", "--cross-check", *SMALL_RUN, "--cross-check-timeout",
            str(r.choice([2, 3, 5])), "--cross-check-memory", str(r.choice([256, 512, 1024]))]
    argv += ["-f", r.choice(["json", "table", "markdown", "sarif", "github"])]
    return Case("megatron", argv, allowed=(3,), unchanged=["cfg.yaml"], seconds=60,
                sys_path=[str(tree)], forbidden=(UPSTREAM_MARK,),
                note=body.splitlines()[0][:60])


# --- symlinks: nothing written through a link ----------------------------------------------

def gen_symlinks(r: random.Random, folder: Path) -> Case:
    outside = folder / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    (folder / "cfg.yaml").write_text(BASE)
    (folder / "real").mkdir()
    kinds = {
        "file": lambda name: os.symlink(outside / "precious", folder / name),
        "dangling": lambda name: os.symlink(outside / "created", folder / name),
        "relative": lambda name: os.symlink("outside/created", folder / name),
        "chain": lambda name: (os.symlink(name + ".2", folder / name),
                               os.symlink(outside / "precious", folder / (name + ".2"))),
        "loop": lambda name: (os.symlink(name + ".2", folder / name),
                              os.symlink(name, folder / (name + ".2"))),
        "dir": lambda name: os.symlink(outside, folder / name),
        "self-dir": lambda name: os.symlink(".", folder / name),
    }
    argv, links = ["check", "cfg.yaml", *SMALL_RUN], []
    for i in range(r.choice((1, 2, 3))):
        kind = r.choice(sorted(kinds))
        name = f"link{i}"
        kinds[kind](name)
        links.append(f"{kind}:{name}")
        target = {"dir": f"{name}/out.json", "self-dir": f"{name}/out.json"}.get(kind, name)
        if r.random() < 0.3:
            target = r.choice([f"real/../{target}", f"./{target}", f"real/./../{target}"])
        if r.random() < 0.3:
            argv += ["--write-baseline", target]
        else:
            fmt = r.choice(["json", "markdown", "table", "sarif", "svg", "github"])
            argv += ["-o", f"{fmt}={target}"]
    if r.random() < 0.3:
        (folder / "plain").mkdir()
        argv += ["-o", "json=plain/new.json"]
    # `self-dir` links name the folder itself: writing through one stays inside, but is still
    # refused; nothing may appear outside or through any link.
    return Case("symlinks", argv, allowed=(2,), unchanged=["cfg.yaml", "outside/precious"],
                words=("symbolic link",), seconds=60, note=" ".join(links))


# --- shell3: script shapes outside the budget ----------------------------------------------

def _shell3_body(r: random.Random) -> tuple[str, str]:
    shape = r.choice(["andlist", "orlist", "pipes", "procsub", "cond", "heredoc", "heredoc-sp",
                      "heredoc-lines", "heredocs-line", "cmdsub", "dq-param", "mixed"])
    n = r.choice([100, 1000, 5000, 19_000, 20_000, 25_000, 33_000, 50_000, 120_000, 200_000])
    if shape == "andlist":
        return shape, " && ".join(["true"] * n)
    if shape == "orlist":
        return shape, " || ".join(["false"] * n)
    if shape == "pipes":
        return shape, " | ".join(["cat"] * n)
    if shape == "procsub":
        n = min(n, 140_000)
        return shape, "cat <(" * n + "true" + ")" * n
    if shape == "cond":
        n = min(n, 100_000)
        return shape, "[[ " + "( " * n + "a" + " )" * n + " ]]"
    if shape == "heredoc":
        return shape, "A=x\ncat <<EOF\n" + "$A" * n + "\nEOF"
    if shape == "heredoc-sp":
        return shape, "A=x\ncat <<EOF\n" + r.choice(["$A ", "${A} ", "$(a) ", "$((1)) "]) * \
            min(n, 120_000) + "\nEOF"
    if shape == "heredoc-lines":
        width = r.choice([1, 10, 100, 999, 1000, 1001])
        return shape, "A=x\ncat <<EOF\n" + ("$A " * width + "\n") * max(1, n // width) + "EOF"
    if shape == "heredocs-line":
        n = min(n, 50_000)
        return shape, ("cat " + " ".join(f"<<E{i}" for i in range(n)) + "\n"
                       + "".join(f"x\nE{i}\n" for i in range(n)))
    if shape == "cmdsub":
        return shape, "echo " + "$(" * n + "a" + ")" * n
    if shape == "dq-param":
        return shape, "echo " + '"${A:-' * n + "a" + '}"' * n
    return shape, "\n".join(_shell3_body(r)[1][:200_000] for _ in range(3))


def gen_shell3(r: random.Random, folder: Path) -> Case:
    shape, body = _shell3_body(r)
    text = ("#!/bin/bash\n" + body + "\n" + LAUNCH)[: (1 << 20) - 1]
    (folder / "train.sh").write_text(text)
    return Case("shell3", ["check", "train.sh", *SMALL_RUN], unchanged=["train.sh"],
                seconds=60, note=f"{shape} ({len(text):,} bytes)")


# --- globs: recipe patterns around the bounds ----------------------------------------------

def _pattern(r: random.Random) -> str:
    kind = r.choice(["star-bracket", "stars", "questions", "brackets", "long", "negated",
                     "unclosed", "nested", "real"])
    n = r.choice([10, 63, 64, 65, 100, 999, 1000, 1001, 5000, 70_000])
    if kind == "star-bracket":
        return "*[" * (n // 2)
    if kind == "stars":
        return "*" * n + "linear_fc1"
    if kind == "questions":
        return "?" * n
    if kind == "brackets":
        return "[a-z]" * n
    if kind == "long":
        return "decoder." * (n // 8) + "*"
    if kind == "negated":
        return "[!" * n + "]" * n
    if kind == "unclosed":
        return "[" * n
    if kind == "nested":
        return "*[*[*[*]" * (n // 8)
    return r.choice(["*.self_attention.*", "*linear_fc1", "decoder.layers.[0-3].*",
                     "*experts*", "[!d]*"])


def gen_globs(r: random.Random, folder: Path) -> Case:
    pattern = _pattern(r)
    (folder / "cfg.yaml").write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n")
    (folder / "r.yaml").write_text(RECIPE.replace('"*linear_proj"', json.dumps(pattern)))
    return Case("globs", ["check", "cfg.yaml", "--recipe", "r.yaml", *SMALL_RUN],
                unchanged=["cfg.yaml", "r.yaml"], seconds=60,
                note=f"pattern {pattern[:30]!r}... ({len(pattern):,} chars)")


# --- escaping: every string from any input escaped -----------------------------------------

HOSTILE_TEXTS = ["\x1b[31mred", "\x1b]0;title\x07", "\x1b[2J", "\u202eevil", "\u2066iso",
                 "\r\rover", "\x9bcsi", "\ud800", "\udfff", "a\x00b", "\u200b", "\ufeff",
                 "tab\there", "::error::x", "\x7f", "\u0085nel", "\U000e0001tag"]


def hostile_text(r: random.Random) -> str:
    return "".join(r.choice(HOSTILE_TEXTS) for _ in range(r.choice((1, 2, 4))))


def _hostile_report(r: random.Random) -> str:
    report = json.loads(good_report())
    targets = [(report, "config"), (report, "runtime"), (report, "recipe")]
    for row in report.get("modules", []):
        targets += [(row, key) for key in ("name", "type", "precision", "recipe", "accumulation")
                    if isinstance(row.get(key), str)]
    for finding in report.get("findings", []):
        targets += [(finding, key) for key in ("module", "message", "fix", "file")]
    for holder, key in r.sample(targets, min(len(targets), r.choice((1, 3, 8)))):
        holder[key] = hostile_text(r) + str(holder.get(key) or "")
    return json.dumps(report)


def gen_escaping(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE)
    (folder / "base.json").write_text(good_report())
    (folder / "head.json").write_text(_hostile_report(r))
    route = r.choice(["diff", "diff", "baseline", "config-key", "recipe-name"])
    fmt = r.choice(["table", "markdown", "json"])
    if route == "diff":
        sides = r.sample(["base.json", "head.json"], 2) if r.random() < 0.5 else \
            ["base.json", "head.json"]
        argv = ["diff", *sides, "-f", fmt]
    elif route == "baseline":
        baseline = json.loads(good_baseline())
        for entry in baseline.get("findings", []):
            entry["module"] = hostile_text(r)
        (folder / "b.json").write_text(json.dumps(baseline))
        argv = ["check", "cfg.yaml", "--baseline", "b.json", *SMALL_RUN,
                "-f", r.choice(["table", "markdown", "github", "sarif"])]
    elif route == "config-key":
        key = hostile_text(r).replace("\ud800", "").replace("\udfff", "").replace("\x00", "")
        (folder / "cfg.yaml").write_text(BASE + json.dumps(key) + ": 1\n")
        argv = ["check", "cfg.yaml", *SMALL_RUN, "-f", fmt]
    else:
        name = hostile_text(r).replace("\ud800", "").replace("\udfff", "").replace("\x00", "")
        (folder / "r.yaml").write_text(RECIPE.replace("proj:", json.dumps(name) + ":"))
        (folder / "cfg.yaml").write_text(BASE + "fp8: e4m3\nfp8_recipe: tensorwise\n")
        argv = ["check", "cfg.yaml", "--recipe", "r.yaml", *SMALL_RUN,
                "-f", r.choice(["table", "markdown", "github"])]
    return Case("escaping", argv, unchanged=["cfg.yaml", "base.json", "head.json"],
                seconds=60, printable=True, note=route)


# --- encoding: a stdout without UTF-8 ------------------------------------------------------

def gen_encoding(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE)
    (folder / "base.json").write_text(good_report())
    (folder / "head.json").write_text(_hostile_report(r))
    env = r.choice([{"LC_ALL": "POSIX", "PYTHONUTF8": "0"}, {"PYTHONIOENCODING": "ascii"},
                    {"PYTHONIOENCODING": "latin-1"}, {"LC_ALL": "C", "PYTHONUTF8": "0"}])
    argv = r.choice([["check", "cfg.yaml", *SMALL_RUN, "-f", r.choice(["markdown", "table",
                                                                        "github"])],
                     ["diff", "base.json", "head.json", "-f", r.choice(["markdown", "table"])],
                     ["env"], ["rules", "-f", "markdown"]])
    return Case("encoding", argv, unchanged=["cfg.yaml"], env=env, subprocess=True,
                seconds=120, note=" ".join(f"{k}={v}" for k, v in env.items()))


# --- version_env: odd installed metadata (the fix is the `upstream` helper's) -------------

def gen_version_env(r: random.Random, folder: Path) -> Case:
    site = folder / "site"
    site.mkdir()
    (folder / "cfg.yaml").write_text(BASE)
    which = r.choice(["megatron", "te"])
    if which == "megatron":
        (site / "megatron" / "core").mkdir(parents=True)
        (site / "megatron" / "core" / "__init__.py").write_text("")
        info = site / "megatron_core-0.19.2.dist-info"
    else:
        (site / "transformer_engine").mkdir()
        (site / "transformer_engine" / "__init__.py").write_text("")
        info = site / r.choice(["transformer_engine-2.8.0.dist-info",
                                "transformer_engine_torch-2.8.0.dist-info"])
    info.mkdir()
    metadata = info / "METADATA"
    kind = r.choice(["zero", "fifo", "loop", "dir", "huge-version", "long-line", "binary",
                     "dangling", "urandom", "empty", "version-txt-fifo", "long-path"])
    if kind == "zero":
        os.symlink("/dev/zero", metadata)
    elif kind == "urandom":
        os.symlink("/dev/urandom", metadata)
    elif kind == "fifo":
        os.mkfifo(metadata)
    elif kind == "loop":
        os.symlink("METADATA", metadata)
    elif kind == "dir":
        metadata.mkdir()
    elif kind == "huge-version":
        metadata.write_text("Metadata-Version: 2.1\nName: x\nVersion: " + "9" * 5000 + "\n")
    elif kind == "long-line":
        metadata.write_text("Version: 0.19.2" + "x" * (10 << 20) + "\n")
    elif kind == "binary":
        metadata.write_bytes(bytes(r.randrange(256) for _ in range(4096)))
    elif kind == "dangling":
        os.symlink("/nonexistent/METADATA", metadata)
    elif kind == "empty":
        metadata.write_text("")
    elif kind == "version-txt-fifo":
        (site / "transformer_engine" / "build_tools").mkdir(parents=True, exist_ok=True)
        os.mkfifo(site / "transformer_engine" / "build_tools" / "VERSION.txt")
    pythonpath = str(site)
    if kind == "long-path":
        pythonpath = "/" + "x" * 5000 + os.pathsep + str(site)
    argv = ["check", "cfg.yaml", *SMALL_RUN, "--megatron", "auto", "--te", "auto"]
    return Case("version_env", argv, allowed=(0, 1, 2), unchanged=["cfg.yaml"],
                env={"PYTHONPATH": pythonpath}, subprocess=True, seconds=60,
                memory_mib=3072, note=f"{which} {kind}")


FAMILIES3 = {"megatron": gen_megatron, "symlinks": gen_symlinks, "shell3": gen_shell3,
             "globs": gen_globs, "escaping": gen_escaping, "encoding": gen_encoding,
             "version_env": gen_version_env}
