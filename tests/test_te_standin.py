"""The te runtime on qaudit's CPU kernel stand-in (qaudit/runtime/standin, docs/te-runtime.md).

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

from qaudit.runtime.standin import kernels
from qaudit.runtime.standin.te_python import unsupported_reason

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


class NVFP4Quantizer:  # the names the stand-in dispatches on; buffers as TE allocates them
    def __init__(self, rowwise: bool, columnwise: bool) -> None:
        self.rowwise_usage, self.columnwise_usage = rowwise, columnwise


class NVFP4TensorStorage:
    def __init__(self, shape, rowwise: bool, columnwise: bool) -> None:
        *rest, last = shape
        self._quantizer = NVFP4Quantizer(rowwise, columnwise)
        self._rowwise_data = torch.empty(*rest, last // 2, dtype=torch.uint8) if rowwise else None
        self._rowwise_scale_inv = torch.empty(128, 4, dtype=torch.uint8) if rowwise else None
        self._amax_rowwise = torch.empty(1) if rowwise else None
        self._columnwise_data = (torch.empty(last, *rest[:-1], rest[-1] // 2, dtype=torch.uint8)
                                 if columnwise else None)
        self._columnwise_scale_inv = torch.empty(128, 4, dtype=torch.uint8) if columnwise else None
        self._amax_columnwise = torch.empty(1) if columnwise else None


def _nearest_e2m1(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest of amax/6 x E2M1's magnitudes, signed (written directly)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]) * (x.abs().max() / 6)
    nearest = (x.abs().unsqueeze(-1) - grid).abs().argmin(-1)
    return grid[nearest] * x.sign()


@pytest.mark.parametrize("usages", [(True, True), (True, False), (False, True)],
                         ids=["both", "rowwise", "columnwise"])
def test_the_nvfp4_cast_round_trips_through_te_s_buffers(usages):
    """NVFP4: the stand-in's cast writes E2M1 codes, block scales and the amax into the buffers
    TE's quantizer allocates; its GEMM reads back the nearest E2M1 value of each element,
    from either copy, in the shape the tensor stands for."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 32) * 3
    dst = NVFP4TensorStorage(x.shape, *usages)
    kernels.quantize(x, dst._quantizer, dst)
    assert kernels.storage.storage_family(dst) == "nvfp4"
    assert kernels.storage.logical_shape(dst) == (2, 4, 32)
    want = _nearest_e2m1(x.reshape(8, 32))
    for usage in ("rowwise", "columnwise"):
        got = kernels.storage.logical(dst, usage, kernels.FP8_DTYPES)
        assert got.shape == (8, 32)
        assert torch.allclose(got, want, atol=1e-6), usage
    assert len(torch.unique(want.abs())) > 4  # more than a few codes were exercised
    assert torch.allclose(kernels.dequantize(dst), want.reshape(2, 4, 32), atol=1e-6)


def test_an_nvfp4_columnwise_copy_made_from_the_rowwise_one_reads_the_same():
    """TE's 2D-scaled NVFP4 weights make their columnwise copy from the rowwise one
    (nvfp4_data_transpose, nvfp4_2d_scale_transpose)."""
    torch.manual_seed(2)
    w = torch.randn(16, 32)
    rowwise_only = NVFP4TensorStorage(w.shape, True, False)
    kernels.quantize(w, rowwise_only._quantizer, rowwise_only)
    both = NVFP4TensorStorage(w.shape, True, True)
    both._rowwise_data.copy_(rowwise_only._rowwise_data)
    both._rowwise_scale_inv.copy_(rowwise_only._rowwise_scale_inv)
    both._amax_rowwise.copy_(rowwise_only._amax_rowwise)
    both._amax_columnwise.copy_(rowwise_only._amax_rowwise)
    kernels.nvfp4_data_transpose(both._rowwise_data, out=both._columnwise_data)
    kernels.nvfp4_2d_scale_transpose(both._rowwise_scale_inv, both._columnwise_scale_inv, 1, 2)
    assert both._columnwise_data.shape == (32, 8)
    rows = kernels.storage.logical(both, "rowwise", kernels.FP8_DTYPES)
    assert torch.equal(kernels.storage.logical(both, "columnwise", kernels.FP8_DTYPES), rows)
    assert torch.allclose(rows, _nearest_e2m1(w), atol=1e-6)


def test_an_empty_nvfp4_cast_writes_unit_block_scales_and_a_zero_amax():
    """An expert no token reached: nothing to encode, and nothing left uninitialized that a
    later read of the amax could pick up."""
    dst = NVFP4TensorStorage((0, 32), True, True)
    dst._amax_rowwise.fill_(float("nan"))
    dst._amax_columnwise.fill_(float("nan"))
    kernels.quantize(torch.empty(0, 32), dst._quantizer, dst)
    assert float(dst._amax_rowwise) == float(dst._amax_columnwise) == 0.0
    assert torch.equal(dst._rowwise_scale_inv.view(torch.float8_e4m3fn).float(),
                       torch.full((128, 4), 448.0))


def test_an_nvfp4_gemm_is_the_product_of_the_rounded_operands():
    torch.manual_seed(1)
    x, w = torch.randn(16, 32), torch.randn(8, 32)
    qx, qw = NVFP4TensorStorage(x.shape, True, True), NVFP4TensorStorage(w.shape, True, True)
    kernels.quantize(x, qx._quantizer, qx)
    kernels.quantize(w, qw._quantizer, qw)
    out, *_ = kernels.generic_gemm(qw, True, qx, False, None, None, None, None, None, False,
                                   None, False, None, 0, False, False)
    assert torch.allclose(out, _nearest_e2m1(x) @ _nearest_e2m1(w).t(), atol=1e-5)
    rel = ((out - x @ w.t()).norm() / (x @ w.t()).norm()).item()
    assert rel < 0.3  # FP4 with one scale a tensor: about 0.17 here, not garbage


@pytest.mark.parametrize("layout", ["sbhd", "bshd"])
def test_attention_tensors_are_permuted_to_bhsd(layout):
    """TE's MXFP8 attention: q, k, v (or their scale buffers) as [b, h, s, d], into TE's own
    outputs when it passes them (last dimension padded: the padding left as it was)."""
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    want = x.permute(1, 2, 0, 3) if layout == "sbhd" else x.permute(0, 2, 1, 3)
    fresh, absent = kernels.multi_tensor_transpose_to_bhsd([x, None], original_format=layout)
    assert absent is None and torch.equal(fresh, want) and fresh.is_contiguous()
    padded = torch.full((*want.shape[:-1], 8), -1.0)
    (into,) = kernels.multi_tensor_transpose_to_bhsd([x], original_format=layout, outputs=[padded])
    assert into is padded and torch.equal(padded[..., :5], want)
    assert (padded[..., 5:] == -1).all()


def _grouped(data, count, rows, cols, first_dims=None, tensor_offsets=None):
    """A GroupedTensorStorage as TE 2.19's Python builds one, as far as the kernel reads it."""
    import types

    return types.SimpleNamespace(rowwise_data=data.reshape(-1), num_tensors=count,
                                 logical_shape=(rows, cols), first_dims=first_dims,
                                 last_dims=None, tensor_offsets=tensor_offsets, quantizer=None)


def test_splits_become_sizes_and_per_stride_offsets():
    sizes, (points, rows, elements) = kernels.splits_to_offsets_multi(
        torch.tensor([3, 0, 2]), "cuda", strides=[1, 1, 4], include_leading_zero=[False, True,
                                                                                  True],
        dtypes=[torch.int32, torch.int64, torch.int64], bulk_allocate=True)
    assert sizes.tolist() == [3, 0, 2] and sizes.dtype == torch.int64
    assert points.tolist() == [3, 3, 5] and points.dtype == torch.int32
    assert rows.tolist() == [0, 3, 3, 5] and elements.tolist() == [0, 12, 12, 20]


@pytest.mark.parametrize("accumulate", [True, False])
def test_the_grouped_tensor_gemm_is_one_gemm_per_member(accumulate):
    """TE 2.19's single grouped weight: fprop (TN) over varying row counts, and the wgrad
    (NT) into the grouped main_grad, which is reported as one watched write."""
    torch.manual_seed(0)
    splits = torch.tensor([3, 0, 2])
    sizes, (_, x_off, y_off) = kernels.splits_to_offsets_multi(
        splits, None, strides=[1, 4, 5], include_leading_zero=[True] * 3,
        dtypes=[torch.int64] * 3)
    weights, x = torch.randn(3, 5, 4), torch.randn(5, 4)
    y = torch.zeros(5, 5)
    one, zero = torch.ones(3), torch.zeros(3)
    kernels.te_general_grouped_gemm_for_grouped_tensor(
        _grouped(weights, 3, 15, 4), True, _grouped(x, 3, 5, 4, sizes, x_off), False,
        _grouped(y, 3, 5, 5, sizes, y_off), None, None, one, zero, None, None, False, 0)
    assert torch.allclose(y[:3], x[:3] @ weights[0].t())
    assert torch.allclose(y[3:], x[3:] @ weights[2].t())
    dy = torch.randn(5, 5)
    main_grad = torch.full((3, 5, 4), 2.0)
    seen = []
    kernels.expect_write([main_grad], seen.append)
    kernels.te_general_grouped_gemm_for_grouped_tensor(
        _grouped(x, 3, 5, 4, sizes, x_off), False, _grouped(dy, 3, 5, 5, sizes, y_off), True,
        _grouped(main_grad, 3, 15, 4), None, None, one, one if accumulate else zero, None,
        None, False, 0)
    base = 2.0 if accumulate else 0.0
    assert torch.allclose(main_grad[0], dy[:3].t() @ x[:3] + base)
    assert torch.allclose(main_grad[1], torch.full((5, 4), base))  # no rows reached it
    assert torch.allclose(main_grad[2], dy[3:].t() @ x[3:] + base)
    assert seen == [accumulate]


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
    from qaudit.runtime.standin import te_python as te_cpu

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


def _run_release(te_dir: Path, configs: list[str], tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / f"{te_dir.name}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(te_dir), str(te_dir.parent / "te-deps")])
    done = subprocess.run([sys.executable, str(REPO / "tests" / "te_standin.py"), str(out),
                           *flags, *configs], cwd=REPO, env=env, capture_output=True, text=True,
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
    # Inference by class (qaudit/runtime/te_infer.py) is on in every audit here; on the oldest
    # and the newest release each config also runs with it off, for the same rows and findings.
    both = ("--infer-both",) if te_dir in (TE_DIRS[0], TE_DIRS[-1]) else ()
    result = _run_release(te_dir, bundled + corpus, tmp_path, *both)
    assert result["cases"] > 500
    if both:
        inference = result["inference"]
        assert [p for p, v in inference.items() if not v.startswith("same")] == []
        # Something was inferred, or the comparison proves nothing.
        assert sum(int(v.split("; ")[1].split()[0]) for v in inference.values()) > 100
    # TE's own modules make the reference runtime's decisions in every case, including TE
    # 2.9-2.14's reading of overwrite_main_grad from a quantized weight copy (modelled in
    # qaudit/plan/upstream/te.py): no difference is excused. Each case runs on two identical
    # modules in a row, the second's calls inferred from the first's: the same records too.
    assert result["differences"] == []
    # TE's own Python shape checks (issue 24) give qaudit's table's answer on every bundled
    # config's real-width shapes and on hand-made bad shapes, in every recipe; some of those
    # answers are refusals, so the comparison can fail.
    shapes = result["shape_checks"]
    assert shapes["disagreements"] == []
    assert shapes["answers"] > 1000 and shapes["refusals"] > 50
    assert "assert_dim_for_fp8_exec" in shapes["checks"]
    # Every recipe runs, NVFP4 included (its E2M1 cast is stood in); what is not served is
    # named, never skipped silently: only where TE itself refuses a recipe on the posed GPU
    # (TE 2.8's Float8BlockScaling on compute capability 10.0).
    for line in result["not_stood_in"]:
        assert line.startswith("blockwise"), line
    differing = {p: v for p, v in result["configs"].items() if v.startswith("DIFFERENCE")}
    assert differing == {}
    # A config the te runtime cannot run here says why: a recipe TE itself refuses on the
    # posed GPU.
    for path, verdict in result["configs"].items():
        if verdict.startswith("not run on te"):
            assert "Float8BlockScaling" in verdict, (path, verdict)
    compared = [p for p, v in result["configs"].items() if v == "same"]
    # Not compared: a recipe TE refuses on the posed GPU, or a setting the te runtime says it
    # does not model yet (CUDA graphs: the Super NVFP4 example), never anything else.
    assert set(bundled) - set(compared) <= {
        p for p, v in result["configs"].items()
        if v.startswith("not run on te") or "--runtime te does not model" in v}
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
