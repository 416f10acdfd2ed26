"""TE issue #3234 shown on the affected releases' own Python, on qaudit's CPU kernel stand-in
and without the guard: TE's GroupedLinear with one grouped weight parameter writes neither
main_grad nor .grad, while the same module with per-expert weights writes both (the control:
the stand-in computes weight gradients). This is the code QA050 flags. The fixed releases
(2.19+) run their grouped-tensor path on the stand-in's grouped-tensor GEMM and write the
right gradient into the grouped weight's main_grad. The guard catching it:
tests/test_guard_single_grouped_weight.py.
(tests/te_single_grouped_weight.py does the work in a subprocess: one TE per process.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qaudit.plan.upstream.te import locate_te, te_behaviour

REPO = Path(__file__).resolve().parent.parent
TE_DIRS = [Path(p) for name in ("QAUDIT_TEST_TE_DIRS", "QAUDIT_TEST_TE_RANGE_DIRS")
           for p in os.environ.get(name, "").split(":") if p]


def _affected(te_dir: Path) -> bool:
    _, version = locate_te([str(te_dir)])
    source = (te_dir / "transformer_engine/pytorch/module/grouped_linear.py").read_text()
    return "single_grouped_weight" in source and not te_behaviour(version).single_grouped_weight_wgrad


def _fixed(te_dir: Path) -> bool:
    _, version = locate_te([str(te_dir)])
    source = (te_dir / "transformer_engine/pytorch/module/grouped_linear.py").read_text()
    return "single_grouped_weight" in source and te_behaviour(version).single_grouped_weight_wgrad


def _version_key(te_dir: Path) -> tuple[int, ...]:
    _, version = locate_te([str(te_dir)])
    return tuple(int(part) for part in (version or "0").split(".")[:3] if part.isdigit())


def _range_ends(dirs: list[Path]) -> list[Path]:
    """The oldest and the newest affected release: each TE import costs 10-60 s of CPU, and
    the releases between are covered by QA050's range test, which reads every release's
    code without running it."""
    affected = sorted({d for d in dirs if _affected(d)}, key=_version_key)
    return affected[:1] + affected[-1:] if len(affected) > 1 else affected


ENDS = _range_ends(TE_DIRS)
FIXED = sorted({d for d in TE_DIRS if _fixed(d)}, key=_version_key)


def _run(te_dir: Path, tmp_path: Path) -> dict:
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(te_dir), str(te_dir.parent / "te-deps")])
    done = subprocess.run([sys.executable, str(REPO / "tests" / "te_single_grouped_weight.py"),
                           str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.skipif(not ENDS, reason="no TE release in QA050's range fetched (scripts/fetch-te)")
@pytest.mark.parametrize("te_dir", ENDS, ids=[p.name for p in ENDS])
def test_a_single_grouped_weight_gets_no_gradient_in_the_affected_releases(te_dir, tmp_path):
    result = _run(te_dir, tmp_path)
    assert result["per_expert"] == {"parameters": 2, "main_grad_written": True,
                                    "main_grad_is_the_gradient": True, "grad_set": True,
                                    "input_grad": True}, result
    assert result["single_grouped_weight"] == {"parameters": 1, "main_grad_written": False,
                                               "main_grad_is_the_gradient": False,
                                               "grad_set": False, "input_grad": True}, result


@pytest.mark.slow
@pytest.mark.skipif(not FIXED, reason="no TE release with the fix fetched (scripts/fetch-te)")
@pytest.mark.parametrize("te_dir", FIXED, ids=[p.name for p in FIXED])
def test_the_fixed_releases_write_the_gradient_into_the_grouped_main_grad(te_dir, tmp_path):
    """2.19+: the grouped-tensor path, on the stand-in's grouped-tensor GEMM, writes the
    gradient computed by hand into the single grouped weight's main_grad."""
    result = _run(te_dir, tmp_path)
    for layout, count in (("per_expert", 2), ("single_grouped_weight", 1)):
        assert result[layout]["parameters"] == count, result
        assert result[layout]["main_grad_written"], result
        assert result[layout]["main_grad_is_the_gradient"], result
