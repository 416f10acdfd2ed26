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
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TE_DIRS = [Path(p) for p in os.environ.get("QAUDIT_TEST_TE_DIRS", "").split(":") if p]
MEGATRON = os.environ.get("QAUDIT_TEST_MEGATRON_CORE", "")
CORPUS = REPO.parent / "shared" / "corpus"
# Dense BF16 on every release; grouped MoE experts in MXFP8 (TE's Fp8Padding) on the newest.
# Both with qaudit's own audit on the te runtime too (a TE install's default). Every bundled
# config on the newest release: te_cpu_sweep.py (tests/test_te_cpu_sweep_*.py).
CONFIGS = ("gpt-small-bf16", "moe-mxfp8")


def _check(te_dir: Path, paths: list[str], *flags: str, prelude: str = "") -> dict:
    """`qaudit check PATHS --cross-check` with `te_dir` and the megatron-core importable;
    `prelude` is Python run in that process first (the forked worker inherits it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), MEGATRON, str(te_dir),
                                         str(te_dir.parent / "te-deps")])
    entry = ["-m", "qaudit"] if not prelude else [
        "-c", prelude + "\nimport runpy\nrunpy.run_module('qaudit', run_name='__main__')"]
    done = subprocess.run([sys.executable, *entry, "check", *paths, "--cross-check",
                           "--format", "json", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=5400)
    assert done.returncode in (0, 1), done.stderr[-4000:]
    return json.loads(done.stdout)


def _cross_check(te_dir: Path, config: str, *flags: str) -> dict:
    path = config if "/" in config else f"configs/{config}.yaml"
    return _check(te_dir, [path], *flags)["cross_check"]


# About a minute each on a 2-core machine: TE's Python and qaudit's own audit both run.
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
    package. The guard, watching that run, notes each BF16 module still tracked (QA003) where
    the audit under `config` notes none."""
    result = _cross_check(TE_DIRS[-1], "gpt-small-bf16", "--policy", "config")
    assert {(d["field"], d["qaudit"], d["megatron"]) for d in result["differences"]} == {
        ("tracked", "no", "stale"), ("accumulation", "accumulate", "overwrite-first"),
        ("guard QA003", "(none)", "info")}
    assert len(result["differences"]) == 3 * 16
    assert result["guard"]["differences"] == 16


_GUARD_BLIND_TO_FLAGS = """
from qaudit.run import observe
_on_call = observe.LiveObserver.on_call
observe.LiveObserver.on_call = lambda self, row, flag, module, quant: _on_call(
    self, row, None, module, quant)
"""


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
def test_the_guard_watches_the_cross_checks_run_and_its_verdict_is_compared():
    """Repeated MTP in BF16 under 0.19.2: the guard on upstream's run finds the audit's QA001
    errors, no difference. A guard made blind to the flag (each call seen as `None`) no longer
    does, and the comparison says so module by module."""
    report = _check(TE_DIRS[-1], ["configs/gpt-mtp-bf16.yaml"])
    guard = report["cross_check"]["guard"]
    assert report["cross_check"]["differences"] == [] and guard["differences"] == 0
    assert "QA001" in guard["rules"] and guard["findings"]["error"] > 0
    assert guard["modules_observed"] == len(report["modules"]) and guard["steps_watched"] == 2
    blind = _check(TE_DIRS[-1], ["configs/gpt-mtp-bf16.yaml"],
                   prelude=_GUARD_BLIND_TO_FLAGS)["cross_check"]
    lost = {d["module"] for d in blind["differences"]
            if (d["field"], d["qaudit"], d["megatron"]) == ("guard QA001", "error", "(none)")}
    errors = {f["module"] for f in report["findings"] if f["rule"] == "QA001"}
    assert lost == errors and blind["guard"]["differences"] >= len(errors)


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
def test_a_stale_weight_cache_is_seen_on_tes_own_python(tmp_path):
    """What TE's own forward did with its cached FP8 weight (the casts it ran): under
    `--policy pre-5642` qaudit says the second step reuses it, TE's own modules under
    Megatron 0.19.2 refresh it."""
    from test_crosscheck import RECIPE_ONLY_FP8

    for name, text in RECIPE_ONLY_FP8.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    config = str(tmp_path / "recipe-only.yaml")
    result = _cross_check(TE_DIRS[-1], config, "--policy", "pre-5642", "--runtime", "reference")
    caches = {(d["module"], d["qaudit"], d["megatron"]) for d in result["differences"]
              if d["field"] == "weight_cache"}
    assert caches == {(f"decoder.layers.{layer}.mlp.{name}", "refresh,reuse | reuse*2",
                       "refresh,reuse | refresh,reuse")
                      for layer in (0, 1) for name in ("linear_fc1", "linear_fc2")}
    assert _cross_check(TE_DIRS[-1], config, "--runtime", "reference")["differences"] == []


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
def test_grouped_experts_with_primary_fp8_weights_have_no_cache(tmp_path):
    """fp8_param with grouped experts: TE keeps each expert's weight as a Float8Tensor (no
    storage of its own, address 0, as every empty expert slice TE casts): none of those casts
    is the weight's, so every call is `primary`, as qaudit says."""
    config = tmp_path / "moe-primary.yaml"
    config.write_text(textwrap.dedent("""\
        num_layers: 2
        hidden_size: 64
        ffn_hidden_size: 128
        num_attention_heads: 4
        num_moe_experts: 32
        moe_router_topk: 2
        moe_grouped_gemm: true
        fp8: e4m3
        fp8_recipe: tensorwise
        fp8_param: true
        """))
    result = _cross_check(TE_DIRS[-1], str(config), "--runtime", "reference")
    assert result["ran"], result["not_covered"]
    assert result["differences"] == []


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
@pytest.mark.parametrize("backend", ["flash", "fused"])
def test_a_pinned_gpu_attention_backend_trains_with_tes_unfused_one(tmp_path, backend):
    """Megatron's build opts TE out of its unfused attention when the config pins flash or
    fused, and a CPU has neither: the run opts it back in (after Megatron validated the
    user's config) and says so; without that, nothing trains."""
    config = tmp_path / f"{backend}.yaml"
    config.write_text(textwrap.dedent(f"""\
        num_layers: 2
        hidden_size: 64
        num_attention_heads: 4
        attention_backend: {backend}
        fp8: e4m3
        fp8_recipe: tensorwise
        """))
    result = _cross_check(TE_DIRS[-1], str(config), "--runtime", "reference")
    assert result["ran"], result["not_covered"]
    assert result["differences"] == []
    assert result["not_covered"] == [
        f"attention_backend {backend}: TE's core attention run with its unfused backend (no "
        "flash or fused attention kernels on CPU; it has no linear module)"]


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
def test_a_kernel_the_stand_in_lacks_is_not_megatrons_refusal(tmp_path):
    """A TE module that needs a kernel the CPU stand-in lacks at construction (here NVFP4's
    cast withdrawn from it, for a primary FP4 weight TE casts when it is built): the
    cross-check says it could not build on TE's own Python, never that Megatron rejects the
    config (a QA030 error)."""
    config = tmp_path / "nvfp4.yaml"
    config.write_text(NVFP4_PRIMARY)
    document = _check(TE_DIRS[-1], [str(config)], "--runtime", "reference",
                      prelude=_WITHOUT_NVFP4_CAST)
    result = document["cross_check"]
    assert result["differences"] == [] and result["modules_compared"] == 0
    (reason,) = result["not_covered"]
    assert reason.startswith("TE's own Python cannot build this config on the CPU kernel "
                             "stand-in: ") and "NVFP4Quantizer" in reason
    assert not any(f["rule"] == "QA030" for f in document["findings"])


NVFP4_PRIMARY = textwrap.dedent("""\
    num_layers: 2
    hidden_size: 64
    num_attention_heads: 4
    fp4: e2m1
    fp4_recipe: nvfp4
    fp4_param: true
    """)
_WITHOUT_NVFP4_CAST = textwrap.dedent("""\
    from qaudit.runtime.standin import storage
    _family = storage.family
    def _without_nvfp4(quantizer):
        if type(quantizer).__name__ == "NVFP4Quantizer":
            raise storage.NotStoodIn("the qaudit CPU stand-in has no cast kernel for TE's NVFP4Quantizer")
        return _family(quantizer)
    storage.family = _without_nvfp4
    """)


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
@pytest.mark.parametrize("primary", [True, False], ids=["fp4-param", "bf16-param"])
def test_nvfp4_trains_on_tes_own_python(tmp_path, primary):
    """NVFP4 through TE's own modules on the stand-in's E2M1 cast, with and without primary
    FP4 weights (TE casts those at construction): trained and compared, 0 differences."""
    config = tmp_path / "nvfp4.yaml"
    config.write_text(NVFP4_PRIMARY if primary else NVFP4_PRIMARY.replace("fp4_param: true\n", ""))
    document = _check(TE_DIRS[-1], [str(config)], "--runtime", "reference")
    result = document["cross_check"]
    assert result["ran"], result["not_covered"]
    assert result["differences"] == [] and result["not_covered"] == []
    assert result["modules_compared"] == len(document["modules"]) > 0
    assert {row["precision"] for row in document["modules"]} >= {"fp4/nvfp4"}


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")
def test_mxfp8_attention_trains_at_the_sizes_te_accepts(tmp_path):
    """FP8 attention under MXFP8: TE wants sequence lengths % 128 and head sizes % 32, which
    the shrunk model (8 and 16) lacks. The run on TE's own Python uses 128 and 32, says so,
    and compares every module with 0 differences (on the newest fetched release: TE 2.14's
    DotProductAttention refuses the MXFP8 recipe itself)."""
    config = tmp_path / "mxfp8-attention.yaml"
    config.write_text(textwrap.dedent("""\
        num_layers: 2
        hidden_size: 64
        num_attention_heads: 4
        fp8: e4m3
        fp8_recipe: mxfp8
        fp8_dot_product_attention: true
        """))
    document = _check(TE_DIRS[-1], [str(config)], "--runtime", "reference")
    result = document["cross_check"]
    assert result["ran"], result["not_covered"]
    assert result["differences"] == []
    assert result["modules_compared"] == len(document["modules"]) > 0
    assert result["not_covered"] == ["MXFP8 attention: run at sequence length 128 and head "
                                     "size 32 (TE's minimum; widths are not compared)"]
