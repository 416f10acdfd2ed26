"""--cross-check with TE's own Python on qaudit's CPU kernel stand-in (crosscheck/te_side.py):
Megatron's TE wrappers subclass TE's own modules, and the comparison covers TE's side too.

One process per TE release (TE's modules cannot be unloaded, and the boot poses torch as a
CUDA build for the rest of the process): `qaudit check` runs as a subprocess with the
release and the unpacked megatron-core on PYTHONPATH. Slow; skipped unless both
QAUDIT_TEST_TE_DIRS (scripts/fetch-te) and QAUDIT_TEST_MEGATRON_CORE (scripts/fetch-megatron)
are set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TE_DIRS = [Path(p) for p in os.environ.get("QAUDIT_TEST_TE_DIRS", "").split(":") if p]
MEGATRON = os.environ.get("QAUDIT_TEST_MEGATRON_CORE", "")
# Dense BF16, dense FP8 (delayed scaling, fused wgrad), grouped MoE experts in MXFP8 (TE's
# Fp8Padding), and a hybrid Mamba model: each builds and trains on TE's own modules.
CONFIGS = ("gpt-small-bf16", "llama-3.1-405b-fp8", "moe-mxfp8", "nemotron-h-8b-fp8")


def _cross_check(te_dir: Path, config: str, *flags: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), MEGATRON, str(te_dir),
                                         str(te_dir.parent / "te-deps")])
    done = subprocess.run([sys.executable, "-m", "qaudit", "check", f"configs/{config}.yaml",
                           "--cross-check", "--format", "json", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode in (0, 1), done.stderr[-4000:]
    return json.loads(done.stdout)["cross_check"]


# Every config on the newest fetched release, the dense BF16 one on the others (about a
# minute each on a 2-core machine: TE's Python and qaudit's own audit both run).
CASES = [(te_dir, config) for te_dir in TE_DIRS for config in CONFIGS
         if te_dir == TE_DIRS[-1] or config == CONFIGS[0]]


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
@pytest.mark.parametrize(("te_dir", "config"), CASES,
                         ids=[f"{d.name}-{c}" for d, c in CASES])
def test_megatron_on_tes_own_python_matches(te_dir, config):
    result = _cross_check(te_dir, config)
    version = te_dir.name.removeprefix("te-")
    # The report names the TE side: TE's own Python, not qaudit's stand-in package.
    assert result["te"] == (f"Transformer Engine {version} Python on CPU (kernels: qaudit "
                            "CPU stand-in)")
    assert result["ran"], result["not_covered"]
    assert result["differences"] == []


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
def test_a_difference_is_still_seen_on_tes_own_python():
    """`--policy config` (Megatron-LM main's tracking) is not what 0.19.2 does: TE's own
    modules receive 0.19.2's stale flag, and their GEMMs overwrite at it, as on the stand-in
    package."""
    result = _cross_check(TE_DIRS[-1], "gpt-small-bf16", "--policy", "config")
    assert {(d["field"], d["qaudit"], d["megatron"]) for d in result["differences"]} == {
        ("tracked", "no", "stale"), ("accumulation", "accumulate", "overwrite-first")}
    assert len(result["differences"]) == 2 * 16
