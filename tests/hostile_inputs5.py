"""Generators of hostile inputs for round five (issue 44), for `scripts/fuzz`
(tests/test_hostile_round5.py tests each class directly):

- `planted`: upstream trees planted on PYTHONPATH (and in the working directory) of a plain
  `qaudit check` (no --startup-checks, no --cross-check): a Megatron-LM checkout with a
  `megatron_core-*.dist-info` beside it, a `megatron.py`, a namespace `megatron/` holding
  `core.py` or a `core/` package, `einops/`, `einops.py`, `numpy.py`, `transformer_engine/`,
  `triton/`, `apex/`, over an installed megatron-core (QAUDIT_TEST_MEGATRON_CORE, counted as
  the interpreter's site-packages for the run) or none. Every planted module writes a
  `RAN-*` file and prints the upstream mark when imported: the run must exit 0 or 1 and
  import none of them.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from hostile_inputs import BASE, SMALL_RUN, Case
from hostile_inputs3 import UPSTREAM_MARK

# What qaudit reads of a Megatron to know its behaviour (tests/test_startup_checks.py).
READ_FILES = ("megatron/core/package_info.py", "megatron/core/transformer/module.py",
              "megatron/core/extensions/transformer_engine.py",
              "megatron/core/transformer/transformer_config.py",
              "megatron/core/model_parallel_config.py")
SHADOWS = ("megatron.py", "namespace-core.py", "namespace-core-package", "einops/",
           "einops.py", "numpy.py", "transformer_engine/", "triton/", "apex/")


def _ran(name: str) -> str:
    return (f"open('RAN-{name}', 'w').write('x')\n"
            f"print({UPSTREAM_MARK!r}, flush=True)\n")


def _plant(tree: Path, shadow: str, tag: str) -> None:
    if shadow == "megatron.py":
        (tree / "megatron.py").write_text(_ran(tag))
    elif shadow == "namespace-core.py":
        (tree / "megatron").mkdir(parents=True, exist_ok=True)
        (tree / "megatron" / "core.py").write_text(_ran(tag))
    elif shadow == "namespace-core-package":
        (tree / "megatron" / "core").mkdir(parents=True, exist_ok=True)
        (tree / "megatron" / "core" / "__init__.py").write_text(_ran(tag))
    elif shadow.endswith("/"):
        (tree / shadow[:-1]).mkdir(parents=True, exist_ok=True)
        (tree / shadow[:-1] / "__init__.py").write_text(_ran(tag))
    else:
        (tree / shadow).write_text(_ran(tag))


def _checkout(tree: Path, r: random.Random, installed: str | None) -> str:
    """A Megatron-LM checkout (0.19.2's files qaudit reads, where there is a copy) with a
    dist-info beside it, its import planted."""
    for name in READ_FILES:
        if installed and r.random() < 0.9:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes((Path(installed) / name).read_bytes())
    (tree / "megatron" / "core").mkdir(parents=True, exist_ok=True)
    if r.random() < 0.5:
        (tree / "megatron" / "__init__.py").write_text(_ran("megatron-init"))
    (tree / "megatron" / "core" / "__init__.py").write_text(_ran("checkout"))
    version = r.choice(["0.19.2", "0.16.0", "0.20.0rc1", "99.0", "0.19.2+local"])
    info = tree / f"megatron_core-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: megatron-core\n"
                                   f"Version: {version}\n")
    if r.random() < 0.3:
        (info / "RECORD").write_text("megatron/core/__init__.py,,\n")
    return f"dist-info {version}"


def gen_planted(r: random.Random, folder: Path) -> Case:
    (folder / "cfg.yaml").write_text(BASE + ("bf16: true\n" if r.random() < 0.5 else ""))
    installed = os.environ.get("QAUDIT_TEST_MEGATRON_CORE") or None
    trees = [folder / f"tree{i}" for i in range(r.choice((1, 1, 2)))]
    notes = []
    use_installed = installed is not None and r.random() < 0.5
    for index, tree in enumerate(trees):
        tree.mkdir()
        if not use_installed and index == 0:
            notes.append(_checkout(tree, r, installed))
        for shadow in r.sample(SHADOWS, r.randrange(1, 4)):
            if (tree / "megatron" / "core").exists() and shadow.startswith("namespace"):
                continue
            _plant(tree, shadow, f"{tree.name}-{shadow.strip('/').replace('/', '-')}")
            notes.append(f"{tree.name}:{shadow}")
    entries = [str(t) for t in trees]
    if r.random() < 0.3:  # an empty entry (`export PYTHONPATH=$PYTHONPATH:...`): the cwd
        entries.insert(r.randrange(len(entries) + 1), "")
        _plant(folder, r.choice(SHADOWS[:3] + ("einops/",)), "cwd")
        notes.append("cwd entry")
    argv = ["check", "cfg.yaml", *SMALL_RUN]
    argv += r.choice([[], [], ["--megatron", "auto"], ["--no-startup-checks"]])
    argv += ["-f", r.choice(["json", "table", "markdown", "sarif", "github"])]
    return Case("planted", argv, allowed=(0, 1), unchanged=["cfg.yaml"], seconds=120,
                env={"PYTHONPATH": os.pathsep.join(entries)},
                sys_path=[e if e else str(folder) for e in entries],
                forbidden=(UPSTREAM_MARK,), installed=[installed] if use_installed else [],
                note=("installed megatron-core; " if use_installed else "") + ", ".join(notes))


FAMILIES5 = {"planted": gen_planted}
