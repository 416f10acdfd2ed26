"""The te runtime on qaudit's CPU kernel stand-in (qaudit/runtime/te_cpu, docs/te-runtime.md).

Fast: the stand-in's GEMM and its observation of main_grad writes, without TE.
Slow, per TE release that `scripts/fetch-te` unpacked (QAUDIT_TEST_TE_DIRS, ':'-separated;
skipped when unset): TE's own Linear / LayerNormLinear / GroupedLinear through every case
the reference runtime models give the same wgrad decisions and weight-cache uses, and
`check --runtime te` gives the same rows and findings as `--runtime reference` on every
bundled config, and (newest release) on 60 corpus files; and TE's own Python shape checks
agree with qaudit's table of TE's rules (qaudit/runtime/te_shapes.py) on every bundled config's
shapes and on hand-made bad ones (tests/te_standin.py does the work in a subprocess: one TE
per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qaudit.runtime.te_cpu import kernels, unsupported_reason

REPO = Path(__file__).resolve().parent.parent
TE_DIRS = [Path(p) for p in os.environ.get("QAUDIT_TEST_TE_DIRS", "").split(":") if p]
CORPUS = REPO.parent / "shared" / "corpus" / "megatron" / "functional_tests"
# Corpus files, on the newest fetched release only (CI time: TE's Python runs one GEMM and
# one cast per expert, about 20x the reference's time on MoE models): 72 spread over the
# files whose audit builds at most this many modules.
CORPUS_FILES, CORPUS_MAX_MODULES = 72, 120  # some are refused (exit 2): 60 must compare


def test_gemm_layouts_follow_cublas_in_row_major():
    a, b = torch.randn(5, 3), torch.randn(4, 3)
    out, *_ = kernels.generic_gemm(a, True, b, False, None, None, None, None, None, False,
                                   None, False, None, 0, False, False)
    assert torch.allclose(out, b @ a.t())  # TN: fprop, y = x W^T
    g = torch.randn(4, 5)
    dgrad, *_ = kernels.generic_gemm(a, False, g, False, None, None, None, None, None, False,
                                     None, False, None, 0, False, False)
    assert torch.allclose(dgrad, g @ a)  # NN: dgrad
    x = torch.randn(4, 3)
    wgrad, *_ = kernels.generic_gemm(x, False, g, True, None, None, None, None, None, False,
                                     None, False, None, 0, False, False)
    assert torch.allclose(wgrad, g.t() @ x)  # NT: wgrad


@pytest.mark.parametrize("accumulate", [True, False])
def test_a_watched_main_grad_write_reports_its_accumulate_flag(accumulate):
    main_grad = torch.full((5, 3), 7.0)
    x, g = torch.randn(4, 3), torch.randn(4, 5)
    seen = []
    kernels.expect_write([main_grad], seen.append)
    kernels.generic_gemm(x, False, g, True, main_grad, None, None, None, None, False, None,
                         False, None, 0, accumulate, False)
    expected = g.t() @ x + (7.0 if accumulate else 0.0)
    assert torch.allclose(main_grad, expected)
    assert seen == [accumulate]
    kernels.generic_gemm(x, False, g, True, main_grad, None, None, None, None, False, None,
                         False, None, 0, True, False)
    assert seen == [accumulate]  # reported once per armed backward


@pytest.mark.parametrize("accumulate", [True, False])
def test_a_wgrad_over_no_rows_reports_its_flag_without_reading_operands(accumulate, monkeypatch):
    """An expert no token reached: D = 0, so main_grad keeps (accumulate) or is cleared
    (overwrite), the flag is reported, and no operand is decoded."""
    main_grad = torch.full((5, 3), 7.0)
    x, g = torch.randn(0, 3), torch.randn(0, 5)
    reads = []
    monkeypatch.setattr(kernels.storage, "logical", lambda *a: reads.append(a))
    seen = []
    kernels.expect_write([main_grad], seen.append)
    kernels.generic_gemm(x, False, g, True, main_grad, None, None, None, None, False, None,
                         False, None, 0, accumulate, False)
    assert seen == [accumulate]
    assert torch.equal(main_grad, torch.full((5, 3), 7.0 if accumulate else 0.0))
    assert reads == []


def test_two_pending_backwards_of_one_weight_report_in_order():
    main_grad = torch.zeros(5, 3)
    x, g = torch.randn(4, 3), torch.randn(4, 5)
    seen = []
    kernels.expect_write([main_grad], lambda acc: seen.append(("first", acc)))
    kernels.expect_write([main_grad], lambda acc: seen.append(("second", acc)))
    for accumulate in (False, True):
        kernels.generic_gemm(x, False, g, True, main_grad, None, None, None, None, False, None,
                             False, None, 0, accumulate, False)
    assert seen == [("first", False), ("second", True)]


@pytest.mark.parametrize("odd", ["loop", "fifo"])
def test_the_stand_in_reads_te_s_version_through_the_bounded_reader(tmp_path, monkeypatch, odd):
    """A METADATA that is a symlink loop or a FIFO (a PYTHONPATH holding a PR's tree) is no
    version: never an OSError (exit 3) or a hang, as for --te auto (fuzz case version_env)."""
    from qaudit.runtime import te_cpu

    (tmp_path / "transformer_engine").mkdir()
    (tmp_path / "transformer_engine" / "__init__.py").write_text("")
    info = tmp_path / "transformer_engine-2.8.0.dist-info"
    info.mkdir()
    if odd == "loop":
        (info / "METADATA").symlink_to(info / "METADATA")
    else:
        os.mkfifo(info / "METADATA")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert te_cpu.te_version() is None


def test_supported_releases():
    assert unsupported_reason("2.8.0") == ""
    assert unsupported_reason("2.20.2") == ""
    assert "2.8 to 2.20" in unsupported_reason("1.13.0")
    assert "not importable" in unsupported_reason(None)


def _corpus_files() -> list[str]:
    from test_corpus import te_modules

    from qaudit.commands.check import load_inputs
    from qaudit.errors import InputError

    chosen = []
    for path in sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []:
        try:
            config, _ = load_inputs(str(path))
        except InputError:
            continue
        if te_modules(config) <= CORPUS_MAX_MODULES:
            chosen.append(str(path))
    # Evenly spread over the name order: dense, MoE, hybrid, T5 and every recipe the corpus has.
    step = max(1, len(chosen) // CORPUS_FILES)
    return chosen[::step][:CORPUS_FILES]


def _run_release(te_dir: Path, configs: list[str], tmp_path: Path) -> dict:
    out = tmp_path / f"{te_dir.name}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(te_dir), str(te_dir.parent / "te-deps")])
    done = subprocess.run([sys.executable, str(REPO / "tests" / "te_standin.py"), str(out),
                           *configs], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.skipif(not TE_DIRS, reason="QAUDIT_TEST_TE_DIRS not set (scripts/fetch-te)")
@pytest.mark.parametrize("te_dir", TE_DIRS, ids=[p.name for p in TE_DIRS])
def test_te_modules_and_checks_match_the_reference(te_dir, tmp_path):
    bundled = sorted(str(p) for p in (REPO / "configs").glob("*.yaml"))
    newest = te_dir == TE_DIRS[-1]
    corpus = _corpus_files() if newest else []
    result = _run_release(te_dir, bundled + corpus, tmp_path)
    assert result["cases"] > 500
    # TE's own modules make the reference runtime's decisions in every case, including TE
    # 2.9-2.14's reading of overwrite_main_grad from a quantized weight copy (modelled in
    # qaudit/plan/upstream/te.py): no difference is excused.
    assert result["differences"] == []
    # TE's own Python shape checks (issue 24) give qaudit's table's answer on every bundled
    # config's real-width shapes and on hand-made bad shapes, in every recipe; some of those
    # answers are refusals, so the comparison can fail.
    shapes = result["shape_checks"]
    assert shapes["disagreements"] == []
    assert shapes["answers"] > 1000 and shapes["refusals"] > 50
    assert "assert_dim_for_fp8_exec" in shapes["checks"]
    # What the stand-in does not serve is named, never skipped silently: NVFP4 (no cast
    # kernel), and where TE itself refuses a recipe on the posed GPU.
    for line in result["not_stood_in"]:
        assert line.startswith(("nvfp4", "blockwise")), line
    differing = {p: v for p, v in result["configs"].items() if v.startswith("DIFFERENCE")}
    assert differing == {}
    # A config the te runtime cannot run here says why: a recipe not stood in, or one TE
    # itself refuses on the posed GPU.
    for path, verdict in result["configs"].items():
        if verdict.startswith("not run on te"):
            assert "NVFP4" in verdict or "Float8BlockScaling" in verdict, (path, verdict)
    compared = [p for p, v in result["configs"].items() if v == "same"]
    assert set(bundled) - set(compared) <= {p for p, v in result["configs"].items()
                                            if v.startswith("not run on te")}
    assert not newest or len(compared) - len(bundled) >= 60 or not CORPUS.is_dir()


def test_grouped_row_padding_round_trips():
    """TE's Fp8Padding / Fp8Unpadding kernels (Megatron's grouped experts under a recipe)."""
    x = torch.randn(5, 3)
    padded = torch.full((8, 3), 9.0)
    kernels.fused_multi_row_padding(x, padded, [2, 3], [4, 4])
    assert torch.equal(padded[:2], x[:2]) and torch.equal(padded[4:7], x[2:])
    assert not padded[2:4].any() and not padded[7:].any()
    back = torch.empty(5, 3)
    kernels.fused_multi_row_unpadding(padded, back, [4, 4], [2, 3])
    assert torch.equal(back, x)
