"""Every real Megatron-LM config of the shared corpus, audited in place.

The corpus (`../shared/corpus/megatron`: 278 functional-test `model_config.yaml` files and 32
launch scripts, see its SOURCE.md) is never copied into this repository; the module is skipped
when it is absent. Each file must audit without a traceback, with exit code 0 or 1, or exit 2
with a message naming an unsupported feature or a value that comes from outside the file. The
share of files fully audited is printed at the end of the session.
"""

from __future__ import annotations

import re
import time
import traceback
from pathlib import Path

import pytest
import torch

from qaudit.audit import AuditOptions, audit_files
from qaudit.errors import InputError

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "megatron"
FILES = sorted(p for folder in ("functional_tests", "launch_scripts")
               for p in (CORPUS / folder).glob("*") if p.is_file()) if CORPUS.is_dir() else []

pytestmark = pytest.mark.skipif(not FILES, reason=f"corpus not found at {CORPUS}")

# One step, one microbatch: enough to see every call, precision and overwrite decision.
OPTIONS = AuditOptions(steps=1, microbatches=1)

# What an exit 2 may say: an unsupported feature, or a value the file does not contain.
ACCEPTED_REFUSALS = re.compile(
    r"models are not modelled and --num-layers is not given"  # hybrid (Mamba), T5
    r"|transformer-impl local: no TE modules"
    r"|the audit would build \d+ routed experts"  # beyond the size the audit builds
    r"|, and the audit needs it; (pass --set|write the value)"  # a value from outside
    r"|no Megatron flags found"  # an empty file, or one that sets only non-model variables
    r"|required flag --num-layers is not set")  # an add-on argument file (pipeline layout)

RESULTS: dict[str, tuple[int, str, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    # The reference runtime runs tiny GEMMs: one thread avoids oversubscribing the cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    yield
    torch.set_num_threads(threads)
    elapsed = time.perf_counter() - started
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not RESULTS:
        return
    audited = sum(1 for code, _, _ in RESULTS.values() if code in (0, 1))
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
    for reason, count in sorted(refusals.items(), key=lambda kv: -kv[1]):
        reporter.write_line(f"  exit 2 x{count}: {reason}")
    reporter.write_line("  slowest: " + ", ".join(f"{name} {t:.1f} s"
                                                  for name, (_, _, t) in slowest))


def audit(path: Path) -> tuple[int, str]:
    started = time.perf_counter()
    try:
        report = audit_files(str(path), None, OPTIONS)
        code, message = report.exit_code(), ""
    except InputError as exc:
        code, message = 2, str(exc)
    except Exception:  # noqa: BLE001 - the assertion below reports it
        code, message = 3, traceback.format_exc()
    RESULTS[path.name] = (code, message, time.perf_counter() - started)
    return code, message


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_corpus_file_audits_or_names_what_is_missing(path):
    code, message = audit(path)
    assert code in (0, 1, 2), message
    if code == 2:
        assert ACCEPTED_REFUSALS.search(message), message
        assert str(path) in message  # names the file


def _report(name: str):
    return audit_files(str(CORPUS / "functional_tests" / name), None, OPTIONS)


def _rows(report, pattern: str) -> list:
    return [row for row in report.modules if re.fullmatch(pattern, row.name)]


def test_fp8_mtp_moe_file_runs_fp8_in_decoder_and_mtp():
    report = _report("moe__gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8.yaml")
    assert {r.precision for r in _rows(report, r"decoder\.layers\.\d+\..*")} == {"fp8/tensorwise"}
    mtp = _rows(report, r"mtp\.layers\.0\..*")
    assert mtp and {r.precision for r in mtp} == {"fp8/tensorwise"}
    assert all(r.calls_per_microbatch == 1 for r in mtp)  # one MTP layer per depth
    assert not _rows(report, r"mtp\.layers\.1\..*")
    assert {r.tracked for r in mtp} == {"yes"}


def test_blockwise_fp8_with_first_and_last_layers_bf16():
    report = _report("moe__gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph_1node.yaml")
    precision = {int(r.name.split(".")[2]): r.precision
                 for r in _rows(report, r"decoder\.layers\.\d+\.self_attention\.linear_qkv")}
    assert len(precision) == 13
    assert precision[0] == precision[12] == "bf16"
    assert {precision[i] for i in range(1, 12)} == {"fp8/blockwise"}


def test_mxfp8_with_layers_at_end_in_bf16_and_two_mtp_depths():
    report = _report("nemotron__nemotron3_super_release_gb200_sm.yaml")
    precision = {int(r.name.split(".")[2]): r.precision
                 for r in _rows(report, r"decoder\.layers\.\d+\.self_attention\.linear_qkv")}
    assert len(precision) == 88
    assert {precision[i] for i in range(74)} == {"fp8/mxfp8"}  # num-layers-at-start-in-bf16: 0
    assert {precision[i] for i in range(74, 88)} == {"bf16"}  # num-layers-at-end-in-bf16: 14
    assert len({r.name.split(".")[2] for r in _rows(report, r"mtp\.layers\.\d+\.eh_proj")}) == 2


def test_repeated_mtp_layer_runs_twice_per_microbatch():
    report = _report("nemotron__nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G.yaml")
    mtp = _rows(report, r"mtp\.layers\.\d+\..*")
    assert mtp and all(r.name.startswith("mtp.layers.0.") for r in mtp)
    assert {r.calls_per_microbatch for r in mtp if r.tracked != "-"} == {2}
