"""Each input file is read and parsed once per run (issue 38, item 8), on every route.

The counts come from instrumenting what every YAML parse in qaudit constructs, the bounded
loader of qaudit/load/yamlio.py given text (building a document from a parse gives it none),
and the reads of files (`Path.open`, which `read_bytes` and `read_text` use), by file.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from cli_helpers import REPO, run_in_process
from hostile_inputs4 import write_dump
from qaudit.load import yamlio

SMALL = ("--steps", "1", "--microbatches", "1")
RECIPE = REPO / "configs" / "recipes" / "attention-bf16.yaml"
CONFIG = ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nfp8: hybrid\n"
          "fp8_recipe: tensorwise\nquant_recipe: recipe.yaml\n")


@pytest.fixture
def counted(monkeypatch):
    """(parses, reads): Counters of the texts parsed and the paths read during the test."""
    parses: Counter = Counter()
    reads: Counter = Counter()
    loader_init = yamlio.BoundedSafeLoader.__init__

    def counting_loader(self, stream, *args, **kwargs):
        if stream:
            parses[stream] += 1
        loader_init(self, stream, *args, **kwargs)

    monkeypatch.setattr(yamlio.BoundedSafeLoader, "__init__", counting_loader)
    path_open = Path.open  # read_bytes and read_text open through it

    def counting_open(self, *args, **kwargs):
        if not set(args[0] if args else kwargs.get("mode", "r")) & set("wax+"):  # reads only
            reads[os.path.realpath(self)] += 1
        return path_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counting_open)
    return parses, reads


def assert_once(counted, parsed: list[Path], read_only: list[Path] = ()) -> None:
    """Each of `parsed` parsed exactly once and read once; each of `read_only` read once."""
    parses, reads = counted
    for path in parsed:
        with open(path, encoding="utf-8") as handle:  # not through Path.open: not counted
            times = parses[handle.read()]
        assert times == 1, f"{path.name} parsed {times} times"
    for path in [*parsed, *read_only]:
        assert reads[os.path.realpath(path)] == 1, \
            f"{path.name} read {reads[os.path.realpath(path)]} times"


def test_plain_yaml_and_its_recipe(tmp_path, monkeypatch, capsys, counted):
    shutil.copy(RECIPE, tmp_path / "recipe.yaml")
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    code, _, err = run_in_process(monkeypatch, capsys, "check", "cfg.yaml", *SMALL, cwd=tmp_path)
    assert code in (0, 1), err
    assert_once(counted, [tmp_path / "cfg.yaml", tmp_path / "recipe.yaml"])


def test_bridge_dump_override_files_and_arguments(tmp_path, monkeypatch, capsys, counted):
    dump = write_dump(tmp_path)
    (tmp_path / "more.yaml").write_text("model:\n  num_layers: 4\n")
    code, _, err = run_in_process(monkeypatch, capsys, "check", dump, "--override", "more.yaml",
                                  "--override", "more.yaml", "model.hidden_size=128",
                                  "train.train_iters=5", *SMALL, cwd=tmp_path)
    assert code in (0, 1), err
    assert_once(counted, [tmp_path / dump, tmp_path / "more.yaml"])


def test_launch_script_and_its_recipe_file(tmp_path, monkeypatch, capsys, counted):
    shutil.copy(RECIPE, tmp_path / "recipe.yaml")
    (tmp_path / "train.sh").write_text(
        "#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
        "--num-attention-heads 4 --fp8-format hybrid --fp8-recipe tensorwise "
        "--te-precision-config-file recipe.yaml\n")
    code, _, err = run_in_process(monkeypatch, capsys, "check", "train.sh", *SMALL, cwd=tmp_path)
    assert code in (0, 1), err
    assert_once(counted, [tmp_path / "recipe.yaml"], read_only=[tmp_path / "train.sh"])
    assert not any("pretrain_gpt" in text for text in counted[0])  # a script is no YAML


def test_functional_test_yaml(tmp_path, monkeypatch, capsys, counted):
    (tmp_path / "model_config.yaml").write_text(
        "ENV_VARS:\n  LAYERS: 2\nMODEL_ARGS:\n  --num-layers: ${LAYERS}\n  --hidden-size: 64\n"
        "  --num-attention-heads: 4\n  --fp8-format: hybrid\n  --fp8-recipe: tensorwise\n")
    code, _, err = run_in_process(monkeypatch, capsys, "check", "model_config.yaml", *SMALL,
                                  cwd=tmp_path)
    assert code in (0, 1), err
    assert_once(counted, [tmp_path / "model_config.yaml"])


def test_directory_mode_reads_a_shared_recipe_once(tmp_path, monkeypatch, capsys, counted):
    shutil.copy(RECIPE, tmp_path / "recipe.yaml")
    (tmp_path / "configs").mkdir()
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / "configs" / name).write_text(CONFIG.replace("recipe.yaml", "../recipe.yaml")
                                                 + f"# {name}\n")
    code, _, err = run_in_process(monkeypatch, capsys, "check", "configs", *SMALL, cwd=tmp_path)
    assert code in (0, 1), err
    assert_once(counted, [tmp_path / "configs" / "a.yaml", tmp_path / "configs" / "b.yaml",
                          tmp_path / "recipe.yaml"])


def test_diff_reads_a_shared_recipe_once(tmp_path, monkeypatch, capsys, counted):
    shutil.copy(RECIPE, tmp_path / "recipe.yaml")
    (tmp_path / "base.yaml").write_text(CONFIG)
    (tmp_path / "head.yaml").write_text(CONFIG.replace("num_layers: 2", "num_layers: 3"))
    code, _, err = run_in_process(monkeypatch, capsys, "diff", "base.yaml", "head.yaml", *SMALL,
                                  cwd=tmp_path)
    assert code in (0, 1), err
    assert_once(counted, [tmp_path / "base.yaml", tmp_path / "head.yaml",
                          tmp_path / "recipe.yaml"])


def test_a_file_changed_during_a_run_is_read_again(tmp_path):
    """The run's memory is keyed by the file's identity: new contents are never served old."""
    from qaudit.load.run_files import one_run

    path = tmp_path / "cfg.yaml"
    path.write_text("a: 1\n")
    with one_run():
        assert yamlio.load_yaml(path)["a"] == 1
        path.write_text("a: 22\n")  # another size: another identity, whatever the clock says
        assert yamlio.load_yaml(path)["a"] == 22
    with one_run():
        first = yamlio.load_yaml(path)
        first["a"] = 0  # a reader changing its document changes no other reader's
        assert yamlio.load_yaml(path)["a"] == 22


def test_nothing_is_kept_outside_a_run(tmp_path, counted):
    path = tmp_path / "cfg.yaml"
    path.write_text("a: 1\n")
    yamlio.load_yaml(path)
    yamlio.load_yaml(path)
    assert counted[0]["a: 1\n"] == 2


MERGES = ("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  x: 3\n",
          "a: &a {x: 1}\nb: &b {x: 2, z: 1}\nc:\n  <<: [*a, *b]\n  w: 1\n",
          "a: &a {x: 1}\nb: &b\n  <<: *a\n  y: 2\nc:\n  <<: *b\n  z: 3\n",
          "a: &a {x: 1}\nc:\n  <<: *a\n  x: 2\n  x: 3\n")


@pytest.mark.parametrize("text", MERGES)
def test_every_reader_of_one_parse_gets_the_same_document(text, tmp_path, counted):
    """Merge keys (`<<: *a`) are resolved without rewriting the parsed nodes: the strict
    reader (a duplicate is an error) and the lenient one (the recipe's: duplicates recorded)
    read the run's one parse as they read a fresh one, in either order."""
    from qaudit.errors import InputError
    from qaudit.load.run_files import one_run

    path = tmp_path / "merge.yaml"
    path.write_text(text)

    def read(strict: bool):
        duplicates = None if strict else []
        try:
            document = yamlio.load_yaml(path, duplicates=duplicates)
        except InputError as exc:
            return str(exc)
        return repr(document), [(k, v.key_lines) for k, v in document.items()], duplicates

    fresh = [read(True), read(False)]  # outside a run: each call parses
    with one_run():
        assert [read(True), read(False), read(False), read(True)] == fresh + fresh[::-1]
    assert counted[0][text] == 3  # two outside the run, one inside


def test_the_api_reads_each_file_once_per_call(tmp_path, counted):
    import qaudit

    shutil.copy(RECIPE, tmp_path / "recipe.yaml")
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    qaudit.audit(str(tmp_path / "cfg.yaml"), steps=1, microbatches=1)
    assert_once(counted, [tmp_path / "cfg.yaml", tmp_path / "recipe.yaml"])
    qaudit.audit(str(tmp_path / "cfg.yaml"), steps=1, microbatches=1)  # a new call: a new run
    assert counted[0][CONFIG] == 2
