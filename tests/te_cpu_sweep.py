"""The cross-check on TE's own Python over every bundled config and a corpus selection,
in shards: each shard is one `qaudit check` process over its files (each file's upstream side
its own forked worker), so that pytest-xdist spreads the sweep over the cores and no test
file runs for more than a few minutes (tests/test_te_cpu_sweep_*.py hold the shards)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from test_crosscheck_te_cpu import CORPUS, MEGATRON, REPO, TE_DIRS, _check

SHARDS = 4

needs_te_and_megatron = [
    pytest.mark.slow,
    pytest.mark.skipif(not TE_DIRS or not MEGATRON,
                       reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set"),
    pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}"),
]


def corpus_selection() -> list[str]:
    """At least 60 corpus files, spread over what the corpus has: two in three of the stand-in
    side's corpus sweep (dense, MoE, MLA, MTP, FP8 recipes, pipelining, FSDP, launch scripts),
    half the hybrid ones (Nemotron-3.5 Lightning's repeated MTP among them), half the T5 ones,
    and five of Megatron-Bridge's Nemotron-3.5 Lightning dumps (BF16, FP8 current scaling with
    fp8_param and TE's own recompute, MXFP8 with FP8 attention, NVFP4, Megatron-FSDP)."""
    import test_crosscheck_corpus as dense
    import test_crosscheck_families as families

    files = [f"megatron/{name}" for index, name in enumerate(sorted(dense.FILES))
             if index % 3 != 2]
    files += [f"megatron/{name}" for name in families.MEGATRON_FILES[::2]]
    files += [f"megatron/{name}" for name in families.T5_FILES[::2]]
    files += [f"bridge/dumps/nemotron_3_5_lightning_pretrain_{name}_config.yaml" for name in (
        "8gpu_b200_bf16", "16gpu_h100_fp8cs", "8gpu_gb200_fp8mx", "8gpu_gb200_nvfp4",
        "8k_fsdp")]
    # (Three hybrid files are in both lists.)
    return [str(CORPUS / name) for name in dict.fromkeys(files)]


def every_file() -> list[str]:
    return [str(path) for path in sorted((REPO / "configs").glob("*.yaml"))] + corpus_selection()


def shard(index: int) -> list[str]:
    return every_file()[index::SHARDS]


# Bundled configs whose routed experts were most of the sweep's CPU (TE's grouped GEMM and its
# casts run once per expert: Nemotron-3 Super's 512 alone was 97 s). Here they are
# cross-checked with fewer experts, the rest of the file as it is: their experts are one
# grouped module per layer, so the same modules, calls and decisions are compared (checked
# below against qaudit's audit of the file as bundled), and the full expert counts are
# cross-checked on the stand-in side (tests/test_crosscheck.py, every bundled config).
FEWER_EXPERTS = {"bridge-super-nvfp4-mtp-bf16.yaml": 64, "deepseek-v3-mtp-fp8.yaml": 16,
                 "deepseek-v3-mtp-fp8-per-depth.yaml": 16, "qwen3-235b-a22b-mxfp8.yaml": 16}
_EXPERTS_LINE = re.compile(r"^(\s*num_moe_experts:\s*)(\d+)\s*$", re.MULTILINE)


def with_fewer_experts(paths: list[str], folder: Path) -> dict[str, str]:
    """{path as run: bundled path} for the FEWER_EXPERTS files among `paths`, each a copy in
    `folder` (beside a copy of configs/, whose recipes they name relatively)."""
    chosen = [path for path in paths if Path(path).parent == REPO / "configs"
              and Path(path).name in FEWER_EXPERTS]
    if not chosen:
        return {}
    shutil.copytree(REPO / "configs", folder / "configs")
    lighter = {}
    for path in chosen:
        copy = folder / "configs" / Path(path).name
        text, count = _EXPERTS_LINE.subn(
            lambda m: f"{m.group(1)}{FEWER_EXPERTS[copy.name]}", copy.read_text())
        assert count == 1 and int(_EXPERTS_LINE.search(Path(path).read_text()).group(2)) \
            > FEWER_EXPERTS[copy.name], path
        copy.write_text(text)
        lighter[str(copy)] = path
    return lighter


def _rows(report: dict) -> tuple[dict, set]:
    """What a file's audit decides, without sizes: each module's row and the findings."""
    rows = {row["name"]: {key: row[key] for key in ("type", "precision", "tracked",
                                                   "accumulation", "calls_per_microbatch",
                                                   "verdict")}
            for row in report["modules"]}
    return rows, {(f["rule"], f.get("module"), f["severity"]) for f in report["findings"]}


def _bundled_audits(paths: list[str]) -> dict[str, dict]:
    """qaudit's own audit (no cross-check) of `paths` as bundled, in the sweep's environment."""
    env = dict(os.environ)
    te_dir = TE_DIRS[-1]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), MEGATRON, str(te_dir),
                                         str(te_dir.parent / "te-deps")])
    done = subprocess.run([sys.executable, "-m", "qaudit", "check", *paths, "--format", "json",
                           "--runtime", "reference"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode in (0, 1), done.stderr[-4000:]
    document = json.loads(done.stdout)
    files = document["files"] if "files" in document else [{"path": paths[0],
                                                            "report": document}]
    return {entry["path"]: entry["report"] for entry in files}


def check_shard(index: int) -> None:
    """Megatron 0.19.2 on TE's own Python (newest fetched release): no difference on any file
    of the shard, every module compared, and every file trained on TE's modules (pinned
    attention backends, T5, Bridge's NVFP4 and MXFP8-attention dumps among them), with the
    guard watching every run and agreeing with the audit on every file."""
    # The deadline is the test's, not the worker's default: on a loaded 2-core machine
    # Nemotron-3 Super's upstream side alone can pass 900 s.
    with tempfile.TemporaryDirectory() as folder:
        lighter = with_fewer_experts(shard(index), Path(folder))
        paths = [next((run for run, bundled in lighter.items() if bundled == path), path)
                 for path in shard(index)]
        document = _check(TE_DIRS[-1], paths, "--runtime", "reference",
                          "--cross-check-timeout", "3600")
        bundled = _bundled_audits(list(lighter.values())) if lighter else {}
    for entry in document["files"]:
        if entry["path"] in lighter and entry.get("report") is not None:
            # Fewer experts, the same modules, calls and verdicts as the file as bundled.
            assert _rows(entry["report"]) == _rows(bundled[lighter[entry["path"]]]), \
                entry["path"]
    version = TE_DIRS[-1].name.removeprefix("te-")
    problems, untrained, unguarded, as_built = [], [], [], set()
    for entry in document["files"]:
        report = entry.get("report")
        if report is None:
            problems.append((entry["path"], entry.get("error")))
            continue
        result = report["cross_check"]
        assert result["te"].startswith(f"Transformer Engine {version} Python on CPU")
        if not result["ran"]:
            as_built.add(Path(entry["path"]).name)
        # A file not trained on TE's modules says why (a CUDA-only feature, a kernel the
        # stand-in lacks, TE's own size checks at shrunk widths): never silently.
        if not result["ran"] and not any("compared as built" in note or "cannot build" in
                                         note for note in result["not_covered"]):
            untrained.append((entry["path"], result["not_covered"]))
        # Every file is built and every module compared (NVFP4's dump too), and the guard
        # watched the same run: every module observed, its verdict the audit's (a difference
        # would be among `differences`, field "guard QA...").
        compared = result["modules_compared"] == len(report["modules"])
        guard = result.get("guard") or {}
        if guard.get("modules_observed") != len(report["modules"]) or guard["differences"]:
            unguarded.append((entry["path"], guard))
        if result["differences"] or not compared:
            problems.append((entry["path"], result["differences"][:3], result["not_covered"]))
    assert len(document["files"]) == len(shard(index))
    assert problems == []
    assert untrained == []
    assert unguarded == []
    assert as_built == set()
