"""The guard on upstream's own training loop: `megatron.training.pretrain()` of the
megatron-core 0.19.2 wheel (its argument parser, initialisation, DDP, optimizer, schedule and
loop), launched by torchrun with one rank and with two gloo ranks, under `qaudit guard --cpu`
(TE's own Python on qaudit's CPU kernel stand-in). Only the entry script is ours
(tests/megatron_pretrain_gpt.py, written as Megatron-LM's pretrain_gpt.py is: the wheel ships
none). The flags are a real launch's: `--bf16`, the default `--clip-grad` 1.0, tied
embeddings (the default) or `--untie-embeddings-and-output-weights`,
`--use-distributed-optimizer`, and an FP8 recipe (megatron-core 0.19.2 re-arms
`is_first_microbatch` only for FP8/FP4 configs).

Megatron's start-up runs `make` in `megatron/core/datasets` to build its dataset helpers
(the mock data's sample index is built by them); the wheel ships `helpers.cpp` and a cp312
build but no Makefile. The tests run on a copy of the wheel's `megatron` package with a
Makefile of ours that builds the helpers for this Python (g++, pybind11 from the [test]
extra), built once per module, so every launch's own `make` finds them up to date.

Slow (five torchrun launches and one `qaudit check`); needs QAUDIT_TEST_TE_DIRS and
QAUDIT_TEST_MEGATRON_CORE.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qaudit.guard.session import EXIT_STOPPED

REPO = Path(__file__).resolve().parent.parent
TE_DIRS = [Path(p) for p in os.environ.get("QAUDIT_TEST_TE_DIRS", "").split(":") if p]
MEGATRON = os.environ.get("QAUDIT_TEST_MEGATRON_CORE", "")
ENTRY = REPO / "tests" / "megatron_pretrain_gpt.py"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not TE_DIRS or not MEGATRON,
    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")]

# The dataset helpers' build, as Megatron-LM's source tree does it (a shared library named
# for the interpreter that imports it), with this test's Python for pybind11's headers.
MAKEFILE = """\
PYTHON ?= {python}
CXXFLAGS += -O3 -Wall -shared -std=c++17 -fPIC
CPPFLAGS += $(shell $(PYTHON) -m pybind11 --includes)
OUT = helpers_cpp$(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")

default: $(OUT)

$(OUT): helpers.cpp
\t$(CXX) $(CXXFLAGS) $(CPPFLAGS) $< -o $@
"""

# The smallest GPT with MTP that Megatron's own parser accepts (MTP needs rope), two
# iterations of two microbatches per rank, Megatron's mock data. The kernel fusions that are
# CUDA kernels are off (the unfused paths are the same modules).
MODEL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 "
         "--max-position-embeddings 16 --position-embedding-type rope --vocab-size 128 "
         "--tokenizer-type NullTokenizer --mock-data --micro-batch-size 2 --train-iters 2 "
         "--lr 1e-4 --eval-iters 0 --eval-interval 1000 --log-interval 1 "
         "--transformer-impl transformer_engine --no-bias-gelu-fusion "
         "--no-masked-softmax-fusion --no-bias-dropout-fusion --no-rope-fusion "
         "--no-persist-layer-norm --mtp-num-layers 2 --bf16 --fp8-format hybrid "
         "--fp8-recipe tensorwise").split()
_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*2 \|")


@pytest.fixture(scope="module")
def megatron(tmp_path_factory) -> Path:
    """The wheel's `megatron` package, copied, with its dataset helpers built for this
    Python (first on PYTHONPATH; the wheel's own directory follows for numpy and einops)."""
    if shutil.which("make") is None or shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("make and a C++ compiler are needed to build Megatron's dataset helpers")
    pytest.importorskip("pybind11", reason="pybind11 (the [test] extra) builds the helpers")
    root = tmp_path_factory.mktemp("megatron-core")
    shutil.copytree(Path(MEGATRON) / "megatron", root / "megatron",
                    ignore=shutil.ignore_patterns("__pycache__"))
    datasets = root / "megatron" / "core" / "datasets"
    (datasets / "Makefile").write_text(MAKEFILE.format(python=sys.executable))
    built = subprocess.run(["make", "-C", str(datasets)], capture_output=True, text=True,
                           timeout=900)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return root


def _env(megatron: Path) -> dict[str, str]:
    env = dict(os.environ)
    te = TE_DIRS[-1]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(megatron), MEGATRON, str(te),
                                         str(te.parent / "te-deps")])
    return env


def _pretrain(megatron: Path, tmp_path: Path, flags: list[str], ranks: int = 1,
              guard: list[str] = ()) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`qaudit guard --cpu --report R [guard] -- torchrun --nproc-per-node N entry MODEL
    flags`, in an empty directory; returns the finished process and the report."""
    report = tmp_path / "guard.json"
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    batch = ["--global-batch-size", str(4 * ranks)]  # two microbatches per rank
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
              str(ranks), str(ENTRY), *MODEL, *batch, *flags]
    done = subprocess.run([sys.executable, "-m", "qaudit", "guard", "--cpu", "--report",
                           str(report), *guard, "--", *launch], cwd=work, env=_env(megatron),
                          capture_output=True, text=True, timeout=1800)
    return done, (json.loads(report.read_text()) if report.exists() else None)


def _iterations(stdout: str) -> list[int]:
    """The iterations Megatron's loop logged (after each optimizer step)."""
    return [int(match.group(1)) for match in _ITERATION.finditer(stdout)]


def _lost(report: dict) -> set[str]:
    return {f["module"] for f in report["findings"] if f["rule"] == "QA001"}


REPEATED_MTP_LAYER = {"mtp.layers.0.eh_proj",
                      "mtp.layers.0.mtp_model_layer.self_attention.linear_qkv",
                      "mtp.layers.0.mtp_model_layer.self_attention.linear_proj",
                      "mtp.layers.0.mtp_model_layer.mlp.linear_fc1",
                      "mtp.layers.0.mtp_model_layer.mlp.linear_fc2"}


def test_repeated_mtp_in_pretrain_is_stopped_before_the_first_update(megatron, tmp_path):
    done, report = _pretrain(megatron, tmp_path, ["--mtp-use-repeated-layer"])
    assert done.returncode == EXIT_STOPPED, done.stderr[-4000:]
    assert _iterations(done.stdout) == []  # Megatron logs an iteration after its update
    assert _lost(report) == REPEATED_MTP_LAYER
    assert {f["rule"] for f in report["findings"] if f["severity"] == "error"} == {"QA001"}
    rows = {row["name"]: row for row in report["modules"]}
    assert rows["mtp.layers.0.eh_proj"]["calls_per_microbatch"] == 2
    assert rows["mtp.layers.0.eh_proj"]["precision"].startswith("fp8")


def test_one_mtp_layer_per_depth_trains_and_agrees_with_qaudit_check(megatron, tmp_path):
    """Per depth, BF16, clipping at the default 1.0, tied embeddings: both iterations train.
    The tied output layer's writes into the embedding's main_grad are attributed to its
    calls (and measured: --numeric), so `qaudit diff` against `qaudit check` on the same
    launch written as a shell script shows no module change."""
    done, report = _pretrain(megatron, tmp_path, [], guard=["--numeric"])
    assert done.returncode == 0, done.stderr[-4000:]
    assert _iterations(done.stdout) == [1, 2]
    assert "grad norm:" in done.stdout  # clip_grads ran (it asserts CUDA type names)
    assert not [f for f in report["findings"] if f["severity"] != "info"]
    rows = {row["name"]: row for row in report["modules"]}
    assert rows["output_layer"]["calls_per_microbatch"] == 3  # the head and two depths
    assert rows["output_layer"]["accumulation"] == "accumulate"
    assert rows["output_layer"]["precision"] == "bf16"
    tied = [c for c in report["guard"]["numeric"] if c["module"] == "output_layer"]
    assert len(tied) == 3 * 2  # every call of both microbatches, into the embedding's buffer
    assert all(c["decision"] == "accumulate" and c["own"] > 0 for c in tied)
    assert max(c["residual"] for c in report["guard"]["numeric"]) < 1e-5

    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 1 pretrain_gpt.py "
                      + " ".join([*MODEL, "--global-batch-size", "4"]) + "\n")
    check = subprocess.run([sys.executable, "-m", "qaudit", "check", str(script), "--format",
                            "json", "--megatron", "0.19.2"], capture_output=True, text=True,
                           cwd=REPO, timeout=600)
    assert check.returncode == 0, check.stderr
    predicted = tmp_path / "check.json"
    predicted.write_text(check.stdout)
    diff = subprocess.run([sys.executable, "-m", "qaudit", "diff", str(predicted),
                           str(tmp_path / "guard.json"), "--format", "json"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert diff.returncode == 0, diff.stderr
    document = json.loads(diff.stdout)
    assert document["modules"] == []
    assert all(not entries for entries in document["findings"].values())


def test_two_gloo_ranks_untied_stop_on_the_repeated_mtp_layer(megatron, tmp_path):
    done, report = _pretrain(megatron, tmp_path, ["--mtp-use-repeated-layer",
                                                  "--untie-embeddings-and-output-weights"],
                             ranks=2)
    assert done.returncode == EXIT_STOPPED, done.stderr[-4000:]
    assert _iterations(done.stdout) == []
    assert report["guard"]["ranks"] == 2
    assert _lost(report) == REPEATED_MTP_LAYER


def test_two_gloo_ranks_per_depth_train_with_the_distributed_optimizer(megatron, tmp_path):
    done, report = _pretrain(megatron, tmp_path, ["--untie-embeddings-and-output-weights",
                                                  "--use-distributed-optimizer"], ranks=2)
    assert done.returncode == 0, done.stderr[-4000:]
    assert _iterations(done.stdout) == [1, 2]
    assert report["guard"]["ranks"] == 2
    rows = {row["name"]: row for row in report["modules"]}
    assert rows["output_layer"]["accumulation"] == "accumulate"  # its own weight, untied


def test_a_pinned_gpu_attention_backend_is_named_and_runs_unfused(megatron, tmp_path):
    """`--attention-backend fused`: Megatron opts TE out of its other backends, and a CPU has
    no cuDNN. Rank 0 says so on one line before anything is built; TE's unfused attention
    runs (core attention has no linear module) and both iterations train."""
    done, _ = _pretrain(megatron, tmp_path, ["--attention-backend", "fused"])
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stderr.splitlines()
             if line.startswith("qaudit guard: --attention-backend fused under --cpu")]
    assert len(lines) == 1
    # Printed from validate_args: before anything the guard says about the step it judges.
    guard_lines = [line for line in done.stderr.splitlines() if line.startswith("qaudit guard:")]
    assert guard_lines[0] == lines[0] and len(guard_lines) > 1
    assert _iterations(done.stdout) == [1, 2]
