"""Megatron-Bridge's named-recipe table read from the user's Bridge source
(qaudit/plan/upstream/bridge_recipes.py, docs/bridge-recipes.md): the static evaluation, the
three layouts it is found in, the fallback to qaudit's table with its reason, and the check
against the 0.6.2 wheel (QAUDIT_TEST_BRIDGE, unpacked by scripts/bridge-recipes fetch)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli_helpers import run_in_process
from qaudit.load import load_files
from qaudit.load.bridge import mixed_precision as mp
from qaudit.plan.upstream import bridge_recipes
from qaudit.plan.upstream.bridge_recipes import (RECIPES_FILE, bridge_at, evaluate,
                                                 locate_bridge, read_recipe_table,
                                                 recipe_table_for)
from test_bridge import gpt_model, write_dump

REPO = Path(__file__).resolve().parent.parent

# A recipes file of Bridge's shape, with a recipe qaudit's table lacks.
SOURCE = '''\
import torch
from dataclasses import dataclass

raise SystemExit("importing this file would stop the test")


@dataclass(kw_only=True)
class MixedPrecisionConfig:
    bf16: bool = False
    fp16: bool = False
    params_dtype: torch.dtype = None
    fp8: str = None
    fp8_recipe: str = "tensorwise"
    fp8_param: bool = None
    fp8_param_gather: bool = False
    num_layers_at_end_in_bf16: int = 0
    loss_scale_window: float = -1.5

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name == "fp8_param_gather" and hasattr(self, "fp8_param"):
            object.__setattr__(self, "fp8_param", value)
        elif name == "fp8_param" and hasattr(self, "fp8_param_gather"):
            object.__setattr__(self, "fp8_param_gather", value)


MIXED_PRECISION_RECIPES = {}


def register(func):
    MIXED_PRECISION_RECIPES[func.__name__] = func
    MIXED_PRECISION_RECIPES[func.__name__.replace("_", "-")] = func
    return func


@register
def bf16_mixed() -> MixedPrecisionConfig:
    """Docstring."""
    return MixedPrecisionConfig(bf16=True, params_dtype=torch.bfloat16)


@register
def team_fp8_mixed():
    cfg = bf16_mixed()
    cfg.fp8 = "e4m3"
    cfg.fp8_recipe = "mxfp8"
    cfg.fp8_param = True
    cfg.num_layers_at_end_in_bf16 = 3
    return cfg
'''


def write_source(root: Path, text: str = SOURCE) -> Path:
    path = root / RECIPES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_static_shape_is_evaluated_as_the_dataclass_would_run():
    defaults, recipes = evaluate(ast.parse(SOURCE), "mixed_precision.py")
    assert defaults["fp8_recipe"] == "tensorwise" and defaults["loss_scale_window"] == -1.5
    assert set(recipes) == {"bf16_mixed", "team_fp8_mixed"}
    assert recipes["bf16_mixed"]["params_dtype"] == "bfloat16"
    # __init__ assigns the pair in field order: fp8_param follows the gather flag (False).
    assert recipes["bf16_mixed"]["fp8_param"] is False
    team = recipes["team_fp8_mixed"]
    assert (team["bf16"], team["fp8"], team["fp8_recipe"]) == (True, "e4m3", "mxfp8")
    # Setting fp8_param alone sets the gather flag too (the __setattr__ keeps them equal).
    assert team["fp8_param"] is True and team["fp8_param_gather"] is True
    assert team["num_layers_at_end_in_bf16"] == 3


def test_a_dict_literal_registry_is_read():
    text = SOURCE.replace("@register\n", "") + (
        '\nMIXED_PRECISION_RECIPES = {"bf16_mixed": bf16_mixed, "team": team_fp8_mixed}\n')
    _, recipes = evaluate(ast.parse(text), "x.py")
    assert set(recipes) == {"bf16_mixed", "team"}


@pytest.mark.parametrize("change, says", [
    ("    cfg.fp8 = \"e4m3\"\n", "    if True:\n        cfg.fp8 = \"e4m3\"\n"),
    ("    cfg.num_layers_at_end_in_bf16 = 3\n", "    cfg.num_layers_at_end_in_bf16 = 1 + 2\n"),
    ("    cfg.fp8_recipe = \"mxfp8\"\n", "    cfg.fp8_recipee = \"mxfp8\"\n"),
])
def test_what_cannot_be_evaluated_falls_back_to_qaudits_table_saying_where(tmp_path, change,
                                                                           says):
    path = write_source(tmp_path, SOURCE.replace(change, says))
    table = recipe_table_for(str(tmp_path))
    assert table.recipes == mp.NAMED_RECIPES and table.origin == mp.QAUDIT_TABLE.origin
    line = SOURCE.replace(change, says).splitlines().index(says.splitlines()[0]) + 1
    assert f"could not read its recipes: {path}:{line}" in table.note


def test_the_work_is_bounded_by_a_node_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(bridge_recipes, "MAX_READ_NODES", 100)
    write_source(tmp_path)
    table = recipe_table_for(str(tmp_path))
    assert table.recipes == mp.NAMED_RECIPES
    assert "more than 100 syntax-tree nodes" in table.note


def test_a_recipe_cycle_is_refused_not_followed(tmp_path):
    text = SOURCE.replace("    cfg = bf16_mixed()\n", "    cfg = team_fp8_mixed()\n")
    write_source(tmp_path, text)
    assert "deep (a cycle?)" in recipe_table_for(str(tmp_path)).note


def test_the_three_layouts_are_found(tmp_path):
    # An installed wheel: site-packages/megatron/bridge/ beside its dist-info.
    site = tmp_path / "site"
    write_source(site)
    (site / "megatron_bridge-0.7.0.dist-info").mkdir()
    (site / "megatron_bridge-0.7.0.dist-info" / "METADATA").write_text("Version: 0.7.0\n")
    found = locate_bridge(["", str(tmp_path / "empty"), str(site)])
    assert (found.root, found.version, found.layout) == (site, "0.7.0", "Megatron-Bridge")
    # A Bridge checkout: src/megatron/bridge/, found from the repository's root.
    checkout = tmp_path / "Megatron-Bridge"
    write_source(checkout / "src")
    (checkout / "pyproject.toml").write_text("")
    assert bridge_at(checkout).layout == "Megatron-Bridge checkout"
    # Megatron-LM with Bridge folded in: megatron/bridge/ beside megatron/core/.
    mlm = tmp_path / "Megatron-LM"
    write_source(mlm)
    (mlm / "megatron/core").mkdir()
    (mlm / "megatron/core/__init__.py").write_text("")
    for given in (mlm, mlm / "megatron", mlm / "megatron/bridge"):
        assert bridge_at(given).layout == "Megatron-LM's megatron/bridge"
    assert locate_bridge([str(mlm)]).root == mlm
    assert read_recipe_table(bridge_at(mlm)).origin.startswith(
        f"Megatron-LM's megatron/bridge (version unknown) at {mlm}")
    assert "no megatron/bridge" in recipe_table_for(str(tmp_path / "empty")).note


def test_a_dump_naming_a_recipe_uses_the_table_given(tmp_path):
    write_source(tmp_path / "bridge")
    path = write_dump(tmp_path, model=gpt_model(), mixed_precision="team-fp8-mixed")
    config, _ = load_files(path, recipe_table=lambda: recipe_table_for(str(tmp_path / "bridge")))
    assert (config.fp8, config.fp8_recipe, config.fp8_param) == ("e4m3", "mxfp8", True)
    assert any("as defined by Megatron-Bridge (version unknown) at" in line
               for line in config.source.header_notes)
    # qaudit's own table has no such recipe: exit 2, saying which table.
    with pytest.raises(Exception, match="qaudit's table for Megatron-Bridge 0.6.2 has"):
        load_files(path)


def _bridge_wheel() -> Path | None:
    where = os.environ.get("QAUDIT_TEST_BRIDGE")
    return Path(where) if where and (Path(where) / RECIPES_FILE).is_file() else None


def test_megatron_lm_with_bridge_folded_in_is_read_under_megatron_path(tmp_path, monkeypatch,
                                                                        capsys):
    """`--megatron PATH` on a Megatron-LM tree holding megatron/core/ and megatron/bridge/:
    the verdict's recipe comes from that tree (the 0.6.2 wheel's file where CI fetched it,
    with a recipe of its own added; Bridge's shape otherwise)."""
    core = os.environ.get("QAUDIT_TEST_MEGATRON_CORE")
    if not core or not (Path(core) / "megatron/core/__init__.py").is_file():
        pytest.skip("QAUDIT_TEST_MEGATRON_CORE not set (scripts/fetch-megatron DIR)")
    mlm = tmp_path / "Megatron-LM"
    (mlm / "megatron").mkdir(parents=True)
    (mlm / "megatron/core").symlink_to(Path(core) / "megatron/core")
    wheel = _bridge_wheel()
    if wheel is not None:
        text = (wheel / RECIPES_FILE).read_text() + textwrap.dedent('''
            @register
            def team_fp8_mixed() -> MixedPrecisionConfig:
                cfg = bf16_with_mxfp8_mixed()
                cfg.num_layers_at_end_in_bf16 = 3
                return cfg
            ''')
    else:
        text = SOURCE
    write_source(mlm, text)
    path = write_dump(tmp_path, model=gpt_model(), mixed_precision="team_fp8_mixed")
    code, out, err = run_in_process(monkeypatch, capsys, "check", path, "--megatron", str(mlm),
                                    "--format", "json", cwd=None)
    assert code in (0, 1), err
    import json

    report = json.loads(out)
    assert any("Megatron-LM's megatron/bridge" in line and str(mlm) in line
               for line in report["source"]), report["source"]
    precisions = {row["precision"] for row in report["modules"]}
    assert any(p.startswith("fp8/mxfp8") for p in precisions), precisions
    # Without PATH, qaudit's table: the recipe is unknown there.
    code, out, err = run_in_process(monkeypatch, capsys, "check", path, cwd=None)
    assert code == 2 and "unknown mixed-precision recipe 'team_fp8_mixed'" in err


def test_qaudits_table_equals_the_062_wheels_source():
    """The CI check (.ci/run fetches the wheel): every recipe and every default equal."""
    wheel = _bridge_wheel()
    if wheel is None:
        pytest.skip("QAUDIT_TEST_BRIDGE not set (scripts/bridge-recipes fetch DIR)")
    table = read_recipe_table(bridge_at(wheel))
    assert bridge_at(wheel).version == mp.QAUDIT_TABLE_VERSION
    assert table.defaults == mp.DEFAULTS
    assert set(table.recipes) == set(mp.NAMED_RECIPES)
    for name in table.recipes:
        assert mp.recipe_by_name(name, table) == mp.recipe_by_name(name), name


def test_the_check_script_finds_a_difference(tmp_path):
    wheel = _bridge_wheel()
    if wheel is None:
        pytest.skip("QAUDIT_TEST_BRIDGE not set (scripts/bridge-recipes fetch DIR)")
    copy = tmp_path / "copy"
    shutil.copytree(wheel, copy)
    source = copy / RECIPES_FILE
    source.write_text(source.read_text().replace("cfg.num_layers_at_end_in_bf16 = 14",
                                                 "cfg.num_layers_at_end_in_bf16 = 12"))
    result = subprocess.run([sys.executable, str(REPO / "scripts/bridge-recipes"), "check",
                             str(copy)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "nemotron_3_super_bf16_with_nvfp4_mixed: differs in num_layers_at_end_in_bf16" \
        in result.stderr


def test_a_resolved_megatron_target_stands_for_its_spec(tmp_path):
    """`diff` resolves --megatron before loading: PATH stays PATH, an installed Megatron's
    directory (auto) does not limit where the Bridge is looked for."""
    from qaudit.plan.upstream.releases import KNOWN, NEWEST_RELEASE
    from qaudit.plan.upstream.target import MegatronTarget

    write_source(tmp_path / "mlm")
    behaviour = KNOWN[NEWEST_RELEASE]
    named = MegatronTarget("named", "0.19.2", behaviour, location=str(tmp_path / "mlm"))
    assert str(tmp_path / "mlm") in recipe_table_for(named).origin
    installed = MegatronTarget("installed", "0.19.2", behaviour, location=str(tmp_path / "mlm"))
    assert recipe_table_for(installed, search_path=[str(tmp_path / "none")]).note \
        == "no Megatron-Bridge importable"
