"""Hostile and careless inputs, round two (issue 14): one section per class.

1. code from the working directory; 2. unbounded shell evaluation; 3. exit 3 for user errors;
4. reports read without checking types; 5. outputs that destroy data; 6. workflow-command
injection; 7. model checks upstream makes; 8. smaller ones (list expressions, FIFOs, run cost).
scripts/fuzz has a generator for each class (tests/hostile_inputs.py).
"""

from __future__ import annotations

import os
import shutil
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


def run_in(folder: Path, argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
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
