"""Every real Megatron-LM config of the shared corpus, audited in place.

The corpus (`../shared/corpus/megatron`: 278 functional-test `model_config.yaml` files and 32
launch scripts, see its SOURCE.md) is never copied into this repository; the module is skipped
when it is absent. Each file must audit without a traceback, with exit code 0 or 1, or exit 2
with a message naming an unsupported feature or a value that comes from outside the file. The
share of files fully audited is printed at the end of the session.

Every file is read and its config built. The few whose model has more than `MAX_MODULES` TE
modules (sequential experts: Qwen3-235B, DeepSeek-R1, Kimi-K2, ...) take minutes each to run
and are run only with `QAUDIT_CORPUS_FULL=1`; the summary counts them apart.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import traceback
from pathlib import Path

import pytest

from qaudit.run.options import AuditOptions

from qaudit.commands.check import audit_config, load_inputs
from qaudit.errors import InputError

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "megatron"
FILES = sorted(p for folder in ("functional_tests", "launch_scripts")
               for p in (CORPUS / folder).glob("*") if p.is_file()) if CORPUS.is_dir() else []

pytestmark = [pytest.mark.skipif(not FILES, reason=f"corpus not found at {CORPUS}"),
              pytest.mark.slow]

# One step of two microbatches: every call, precision and the overwrite-or-accumulate decision
# of a re-armed step (one microbatch alone would show every first call as an overwrite).
OPTIONS = AuditOptions(steps=1, microbatches=2)
MAX_MODULES = 5_000
FULL = os.environ.get("QAUDIT_CORPUS_FULL") == "1"

# What an exit 2 may say: an unsupported feature, or a value the file does not contain.
ACCEPTED_REFUSALS = re.compile(
    r"models are not modelled and --num-layers is not given"  # heterogeneous layers
    r"|transformer-impl local: no TE modules"
    r"|the audit would build \d+ routed experts"  # beyond the size the audit builds
    r"|, and the audit needs it; (pass --set|write the value)"  # a value from outside
    r"|no Megatron flags found"  # an empty file, or one that sets only non-model variables
    r"|required flag --num-layers is not set"  # an add-on argument file (pipeline layout)
    r"|is not modelled yet"  # e.g. virtual pipelining with uneven stages
    # Configs Megatron itself rejects, e.g. examples/gpt_oss sets PP to the GPU count (8) for
    # 12 layers: fixed with --set GPUS_PER_NODE=4.
    r"|do not split evenly over pipeline_model_parallel_size"
    # DeepSeek-V2-Lite's ModelOpt argument file: the modelopt spec's q norm without q_lora_rank.
    r"|which Megatron rejects without q_lora_rank"
    # Megatron's own start-up refusals (issue 37; tests/test_startup_refusals.py names the 4).
    r"|Megatron's (argument parser stops|validate_args refuses it) at start-up")

RESULTS: dict[str, tuple[int, str, float]] = {}  # name -> exit code (-1: not run), message, s


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    started = time.perf_counter()
    yield
    elapsed = time.perf_counter() - started
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or not RESULTS:
        return
    # Written past pytest's output capture, so it shows with or without -s.
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        _write_summary(reporter, elapsed)


def _write_summary(reporter, elapsed: float) -> None:
    audited = sum(1 for code, _, _ in RESULTS.values() if code in (0, 1))
    loaded_only = sum(1 for code, _, _ in RESULTS.values() if code == -1)
    refusals: dict[str, int] = {}
    for code, message, _ in RESULTS.values():
        if code == 2:
            reason = ACCEPTED_REFUSALS.search(message)
            key = reason.group(0) if reason else message
            refusals[key] = refusals.get(key, 0) + 1
    slowest = sorted(RESULTS.items(), key=lambda kv: -kv[1][2])[:3]
    reporter.write_line("")
    reporter.write_line(f"corpus: {audited} of {len(RESULTS)} files fully audited "
                        f"({100 * audited / len(RESULTS):.0f}%), "
                        f"{sum(1 for c, _, _ in RESULTS.values() if c == 1)} with errors (exit 1), "
                        f"in {elapsed:.0f} s")
    if loaded_only:
        reporter.write_line(f"  {loaded_only} more read and built as configs, not run (over "
                            f"{MAX_MODULES} modules; QAUDIT_CORPUS_FULL=1 runs them)")
    for reason, count in sorted(refusals.items(), key=lambda kv: -kv[1]):
        reporter.write_line(f"  exit 2 x{count}: {reason}")
    reporter.write_line("  slowest: " + ", ".join(f"{name} {t:.1f} s"
                                                  for name, (_, _, t) in slowest))


def te_modules(config) -> int:
    """About how many modules the audit builds (sequential experts dominate; the hybrid TE
    spec always groups its experts, the modelopt spec never does; a T5 encoder adds its
    layers)."""
    mtp_layers = config.mtp_moe_layers() if config.mtp_depths else []
    layers = config.num_layers + (config.encoder_num_layers or 0) + config.mtp_depths * len(mtp_layers)
    moe_layers = sum(config.moe_layer_pattern()) + config.mtp_depths * sum(mtp_layers)
    grouped = config.layer_spec == "te" and (config.moe_grouped_gemm or config.is_hybrid)
    per_expert = 0 if grouped else 2
    return 4 * layers + moe_layers * (config.num_moe_experts or 0) * per_expert


MAX_TABLE_LINES = 200  # a reviewer reads the whole table
VERDICT_WITHIN = 25  # the verdict and its findings start on the first screen


def check_first_screen(report, code: int) -> None:
    """The table output opens with the verdict (findings within the first 25 lines) and fits
    in 200 lines (modules that behave alike share rows)."""
    from qaudit.render import render

    lines = render(report, code, "table").splitlines()
    assert len(lines) <= MAX_TABLE_LINES, f"{len(lines)} lines"
    verdict = next(i for i, line in enumerate(lines) if line.startswith("verdict: "))
    assert verdict < VERDICT_WITHIN, verdict
    if report.findings:
        assert lines[verdict + 1].startswith("  "), lines[verdict + 1]  # an entry or the count


def audit(path: Path) -> tuple[int, str]:
    started = time.perf_counter()
    try:
        config, recipe = load_inputs(str(path))
        if te_modules(config) > MAX_MODULES and not FULL:
            code, message = -1, "not run"
        else:
            report = audit_config(config, recipe, OPTIONS)
            code, message = report.exit_code(), ""
            check_first_screen(report, code)
    except InputError as exc:
        code, message = 2, str(exc)
    except Exception:  # noqa: BLE001 - the assertion below reports it
        code, message = 3, traceback.format_exc()
    RESULTS[path.name] = (code, message, time.perf_counter() - started)
    return code, message


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_corpus_file_audits_or_names_what_is_missing(path):
    code, message = audit(path)
    assert code in (-1, 0, 1, 2), message
    if code == 2:
        assert ACCEPTED_REFUSALS.search(message), message
        assert str(path) in message  # names the file


def _report(name: str, folder: str = "functional_tests"):
    config, recipe = load_inputs(str(CORPUS / folder / name))
    return audit_config(config, recipe, OPTIONS)


def _rows(report, pattern: str) -> dict[str, object]:
    """Rows whose name (without a pipeline `stageS.chunkC/` prefix) matches, by that name."""
    rows = {}
    for row in report.modules:
        name = row.name.split("/", 1)[-1]
        if re.fullmatch(pattern, name):
            rows[f"{row.name.split('/')[0]}/{name}" if "/" in row.name else name] = row
    return rows


def _precision_by_layer(report, module: str) -> dict[int, str]:
    """Global layer index -> precision (single-stage configs: local index == global)."""
    return {int(name.split("layers.")[1].split(".")[0]): row.precision
            for name, row in _rows(report, rf"decoder\.layers\.\d+\.{module}").items()}


def test_fp8_mtp_moe_file_runs_fp8_in_decoder_and_mtp():
    report = _report("moe__gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8.yaml")
    decoder = _rows(report, r"decoder\.layers\.\d+\..*")
    assert decoder and {r.precision for r in decoder.values()} == {"fp8/tensorwise"}
    mtp = _rows(report, r"mtp\.layers\.0\..*")
    assert mtp and {r.precision for r in mtp.values()} == {"fp8/tensorwise"}
    assert {r.calls_per_microbatch for r in mtp.values()} == {1}  # one MTP layer per depth
    assert {r.tracked for r in mtp.values()} == {"yes"}
    assert not _rows(report, r"mtp\.layers\.1\..*")


def test_blockwise_fp8_with_first_and_last_layers_bf16():
    report = _report("moe__gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph_1node.yaml")
    precision = _precision_by_layer(report, r"self_attention\.linear_proj")
    assert sorted(precision) == list(range(13))
    assert precision[0] == precision[12] == "bf16"
    assert {precision[i] for i in range(1, 12)} == {"fp8/blockwise"}
    assert {r.precision for r in _rows(report, r"mtp\.layers\.0\..*").values()} == \
        {"fp8/blockwise"}  # the BF16 rule is not applied to MTP


def test_tensorwise_fp8_first_last_bf16_dense():
    report = _report("gpt__gpt_static_inference_tp1_pp1_583m_fp8_cudagraphs.yaml")
    precision = _precision_by_layer(report, r"self_attention\.linear_qkv")
    assert sorted(precision) == list(range(24))
    assert precision[0] == precision[23] == "bf16"
    assert {precision[i] for i in range(1, 23)} == {"fp8/tensorwise"}


def test_launch_script_fp8_hybrid_format_uses_the_delayed_default():
    report = _report("llama__train_llama3_8b_h100_fp8.sh", "launch_scripts")
    assert {r.precision for r in _rows(report, r"decoder\.layers\.\d+\..*").values()} == \
        {"fp8/delayed"}


def test_repeated_mtp_layer_runs_twice_per_microbatch():
    report = _report("nemotron__nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G.yaml")
    mtp = _rows(report, r"mtp\.layers\.\d+\..*")
    assert mtp and all(".layers.0." in name for name in mtp)
    assert {r.calls_per_microbatch for r in mtp.values() if r.tracked != "-"} == {2}


# --- hybrid (Mamba) models ------------------------------------------------------------------

def test_hybrid_pipe_segments_are_stages_and_virtual_chunks():
    report = _report("hybrid__hybrid_mr_mcore_te_tp1_pp2_vpp2_cp1_dgx_a100_1N8G.yaml")
    prefixes = {row.name.split("/")[0] for row in report.modules if "/" in row.name}
    assert prefixes == {"stage0.chunk0", "stage1.chunk0", "stage0.chunk1", "stage1.chunk1",
                        "stage1.chunk1"}
    mixers = _rows(report, r"decoder\.layers\.\d+\.mixer\.(in|out)_proj")
    # 'M-M-M-M*-M-|M-M-M*-M-M-|M-M*-M-M-M-|M*-M-M-M-M-': 5 Mamba layers in every segment.
    assert len(mixers) == 2 * 5 * 4
    assert "stage1.chunk1/decoder.layers.0.mixer.in_proj" in mixers
    assert "stage1.chunk1/decoder.layers.1.self_attention.linear_qkv" in report_names(report)


def report_names(report) -> set[str]:
    return {row.name for row in report.modules}


def test_hybrid_moe_mtp_in_mxfp8_with_first_last_layers_bf16():
    report = _report("nemotron__nemotron3_super_release_gb200.yaml")
    # --num-layers-at-start-in-bf16 0, --num-layers-at-end-in-bf16 14: layers 74-87 stay BF16.
    for module in (r"mixer\.in_proj", r"mlp\.experts\.linear_fc1"):
        precision = _precision_by_layer(report, module)
        assert {p for layer, p in precision.items() if layer < 74} == {"fp8/mxfp8"}
        assert {p for layer, p in precision.items() if layer >= 74} == {"bf16"}
    mtp = _rows(report, r"mtp\.layers\.\d\..*")
    assert {r.precision for r in mtp.values()} == {"fp8/mxfp8"}  # the BF16 rule skips MTP
    assert "mtp.layers.1.mtp_model_layer.layers.1.mlp.experts.linear_fc1" in mtp
    assert "mtp.layers.1.mtp_model_layer.layers.0.self_attention.linear_qkv" in mtp


def test_hybrid_override_pattern_overrides_num_layers_with_a_note():
    config, _ = load_inputs(str(CORPUS / "functional_tests" /
                                "hybrid__hybrid_flextron_nightly_tp2_pp1_ep2_dgx_h100_1N8G.yaml"))
    assert (config.hybrid_layer_pattern, config.num_layers) == ("MEM*EMEM*EME*", 13)
    assert any("--num-layers 12: ignored" in note.message for note in config.source.notes)


# --- encoder-decoder (T5) models ------------------------------------------------------------

def test_t5_builds_encoder_and_decoder_with_cross_attention():
    report = _report("t5__t5_mcore_te_tp2_pp1_vp1.yaml")
    for block in ("encoder", "decoder"):
        assert len(_rows(report, rf"{block}\.layers\.\d+\.mlp\.linear_fc1")) == 12
    cross = _rows(report, r"decoder\.layers\.\d+\.cross_attention\..*")
    assert len(cross) == 3 * 12
    assert not _rows(report, r"encoder\.layers\.\d+\.cross_attention\..*")
    assert {(r.precision, r.calls_per_microbatch) for r in report.modules} == {("bf16", 1)}
    assert report.modules[-1].name == "lm_head.output_layer"
    # BF16 under megatron-core 0.19.2 (the default): only the harmless stale-flag notes.
    assert {(f.rule, f.severity) for f in report.findings} == {("QA003", "info")}


# --- upstream's own model (issue 13: docs/upstream-model.md) -----------------------------------

def test_explicit_layout_file_is_pipelined_as_the_layout_says():
    # --pipeline-model-parallel-layout Et*3|(tt|)*6tmL with PP 2: 8 chunks, VPP 4.
    report = _report("moe__gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental.yaml")
    layers: dict[str, set[str]] = {}
    for row in report.modules:
        prefix, _, name = row.name.partition("/")
        if name.startswith("decoder.layers."):
            layers.setdefault(prefix, set()).add(name.split(".")[2])
    assert {prefix: len(found) for prefix, found in layers.items()} == {
        "stage0.chunk0": 3, "stage1.chunk0": 2, "stage0.chunk1": 2, "stage1.chunk1": 2,
        "stage0.chunk2": 2, "stage1.chunk2": 2, "stage0.chunk3": 2, "stage1.chunk3": 1}
    assert "stage1.chunk3/mtp.layers.0.eh_proj" in report_names(report)


def test_modelopt_argument_file_builds_megatron_linears():
    report = _report("post_training__modelopt__conf__Qwen__Qwen3-8B.sh", "launch_scripts")
    assert {row.type for row in report.modules} == {"ColumnParallelLinear", "RowParallelLinear"}


def test_mla_without_qk_layernorm_has_plain_column_up_projections():
    report = _report("gpt__gpt3_mcore_te_tp2_pp2_mla.yaml")
    ups = _rows(report, r"decoder\.layers\.\d+\.self_attention\.linear_(q|kv)_up_proj")
    assert ups and {row.type for row in ups.values()} == {"TEColumnParallelLinear"}


# Performance flags common in the corpus: each is read and shown to change nothing
# (docs/no-effect-settings.md) or modelled, so none may be a QA090 warning.
PERFORMANCE_FLAGS = ("--overlap-grad-reduce", "--overlap-param-gather",
                     "--overlap-param-gather-with-optimizer-step", "--use-distributed-optimizer",
                     "--sequence-parallel", "--recompute-granularity", "--recompute-activations",
                     "--cross-entropy-loss-fusion", "--moe-grouped-gemm", "--bf16",
                     "--attention-backend", "--ckpt-format", "--use-mcore-models")


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_common_performance_flags_are_not_warnings(path):
    try:
        config, _ = load_inputs(str(path))
    except InputError:
        return  # refused with a reason: test_corpus_file_audits_or_names_what_is_missing
    warned = [note.message for note in config.source.notes if not note.no_effect
              and note.message.split(" ", 1)[0].split(":", 1)[0] in PERFORMANCE_FLAGS]
    assert warned == []
