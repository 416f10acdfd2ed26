"""The guard catches TE issue #3234 on the release that shipped it, on this CPU: TE's own
GroupedLinear with one grouped weight parameter, trained through megatron-core 0.19.2's DDP
and schedule (tests/guard_single_grouped_weight_job.py) under `qaudit guard --cpu`. On TE
2.17.0 its backward computes no weight gradient: the guard stops the job before the first
update with QA009 (exit 10). On TE 2.19.0, the first release with the fix (PR #3224), the
same job's wgrad is written into main_grad by the grouped-tensor GEMM and the guard lets it
run. Slow; each release runs where it is fetched (scripts/fetch-te; CI's te-range)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qaudit.guard.session import EXIT_STOPPED
from qaudit.plan.upstream.te import locate_te

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "guard_single_grouped_weight_job.py"
MEGATRON = os.environ.get("QAUDIT_TEST_MEGATRON_CORE", "")
TE_DIRS = [Path(p) for name in ("QAUDIT_TEST_TE_DIRS", "QAUDIT_TEST_TE_RANGE_DIRS")
           for p in os.environ.get(name, "").split(":") if p]
AFFECTED, FIXED = "2.17.0", "2.19.0"


def _release(version: str) -> Path | None:
    for te_dir in TE_DIRS:
        if te_dir.is_dir() and locate_te([str(te_dir)])[1] == version:
            return te_dir
    return None


def _guard(te_dir: Path, tmp_path: Path) -> tuple[int, str, str, dict]:
    report = tmp_path / "guard.json"
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), MEGATRON, str(te_dir),
                                         str(te_dir.parent / "te-deps")])
    # The stand-in serves TE 2.19+'s grouped-tensor path (docs/te-runtime.md).
    env["QAUDIT_TE_CPU_GROUPED_GEMM"] = "1"
    done = subprocess.run([sys.executable, "-m", "qaudit", "guard", "--cpu", "--report",
                           str(report), "--", sys.executable, str(JOB)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    return done.returncode, done.stdout, done.stderr, json.loads(report.read_text())


def _steps(stdout: str) -> int:
    return sum(1 for line in stdout.splitlines() if line.startswith("step "))


def _failing(report: dict) -> list[tuple[str, str]]:
    return [(f["rule"], f["module"]) for f in report["findings"] if f["severity"] != "info"]


pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not MEGATRON, reason="QAUDIT_TEST_MEGATRON_CORE not set (scripts/megatron-releases)")]


def test_the_guard_stops_te_2_17_0s_single_grouped_weight_run(tmp_path):
    te_dir = _release(AFFECTED)
    if te_dir is None:
        pytest.skip(f"TE {AFFECTED} not fetched (scripts/fetch-te; QAUDIT_TEST_TE_RANGE_DIRS)")
    code, stdout, stderr, report = _guard(te_dir, tmp_path)
    assert code == EXIT_STOPPED, stderr[-4000:]
    assert _steps(stdout) == 0  # stopped before the first update
    assert _failing(report) == [("QA009", "linear_fc1")]
    finding = report["findings"][0]
    assert "#3234" in finding["message"] and "2.19" in finding["fix"]
    assert report["te"]["version"] == AFFECTED
    assert report["guard"]["calls_observed"] == 2  # one call per microbatch, both watched


def test_the_guard_lets_te_2_19_0_the_first_fixed_release_run(tmp_path):
    te_dir = _release(FIXED)
    if te_dir is None:
        pytest.skip(f"TE {FIXED} not fetched (scripts/fetch-te; QAUDIT_TEST_TE_RANGE_DIRS)")
    code, stdout, stderr, report = _guard(te_dir, tmp_path)
    assert code == 0, stderr[-4000:]
    assert _steps(stdout) == 2
    assert _failing(report) == []
    assert report["te"]["version"] == FIXED
    # The wgrad GEMM's writes were seen, as accumulations into the grouped main_grad.
    [row] = [m for m in report["modules"] if m["name"] == "linear_fc1"]
    assert row["accumulation"] == "accumulate", row
    assert report["guard"]["calls_observed"] == 2
