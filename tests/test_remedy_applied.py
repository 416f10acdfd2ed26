"""Issue 45: the first printed remedy, applied to a copy of the input exactly as its text says
(tests/remedy_apply.py), clears the finding it was printed for: on every bundled config that
fails, and on real corpus files (MODEL_ARGS, launch scripts, Bridge dumps) made to fail."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from qaudit.commands.check import audit_files
from qaudit.run.options import AuditOptions

from remedy_apply import apply, apply_snippet, first_remedy

REPO = Path(__file__).resolve().parents[1]
import os
# ../shared/corpus beside the clone (as tests/test_corpus.py reads it), or QAUDIT_TEST_CORPUS.
CORPUS = Path(os.environ.get("QAUDIT_TEST_CORPUS")
              or Path(__file__).resolve().parents[2] / "shared" / "corpus")
FAST = AuditOptions(steps=1, microbatches=2)


def _fixes(report) -> dict[str, set[str]]:
    """Each QA001 fix text and the modules it was printed for."""
    groups: dict[str, set[str]] = {}
    for finding in report.findings:
        if finding.rule == "QA001":
            groups.setdefault(finding.fix, set()).add(finding.module)
    return groups


def _qa001(report) -> set[str]:
    return {f.module for f in report.findings if f.rule == "QA001"}


def _applied_clears(copy_of, options: AuditOptions) -> int:
    """For each QA001 fix of the input `copy_of()` makes: apply its first remedy to a fresh
    copy, re-audit, and check those modules no longer lose gradients; where QA001 was the only
    error and one fix covers it, the audit then passes. Returns how many fixes."""
    report = audit_files(str(copy_of()), None, options)
    fixes = _fixes(report)
    assert fixes, "expected the input to fail with QA001"
    only_qa001 = {f.rule for f in report.findings if f.severity == "error"} == {"QA001"}
    for fix, modules in fixes.items():
        path = copy_of()
        overrides = apply(fix, path, tuple(options.overrides))
        fixed = audit_files(str(path), None, replace(options, overrides=overrides))
        left = modules & _qa001(fixed)
        assert not left, f"{first_remedy(fix)!r} left QA001 on {sorted(left)[:3]}"
        if only_qa001 and len(fixes) == 1:
            assert fixed.exit_code() == 0, first_remedy(fix)
    return len(fixes)


FAILING_BUNDLED = ["deepseek-v3-mtp-fp8", "gpt-mtp-bf16", "gpt-mtp-fp8-mtp-bf16",
                   "bridge-lightning-mtp-bf16", "bridge-super-nvfp4-mtp-bf16"]


@pytest.mark.parametrize("name", FAILING_BUNDLED)
def test_first_remedy_applied_as_printed_clears_qa001_on_bundled_config(name, tmp_path):
    counter = iter(range(100))

    def copy_of() -> Path:
        folder = tmp_path / f"copy{next(counter)}"
        shutil.copytree(REPO / "configs", folder)  # recipes are referenced relatively
        return folder / f"{name}.yaml"

    assert _applied_clears(copy_of, FAST) >= 1


@pytest.mark.parametrize("name", FAILING_BUNDLED)
def test_every_format_prints_the_same_first_remedy(name):
    """table, markdown, github and SARIF (the goldens, which tests/test_formats.py keeps equal
    to the CLI) all carry the fix text the test above applied."""
    report = audit_files(str(REPO / "configs" / f"{name}.yaml"), None, FAST)
    for fix in _fixes(report):
        first = first_remedy(fix)
        for suffix in (".md", ".github", ".sarif", ".json"):
            text = (REPO / "tests" / "golden" / f"{name}{suffix}").read_text()
            assert first in text, (suffix, first)
        table = " ".join((REPO / "tests" / "golden" / f"{name}.txt").read_text().split())
        assert f"fix: {first}" in table


@pytest.mark.parametrize("name", FAILING_BUNDLED)
def test_first_passing_suggestion_applied_as_printed_passes(name, tmp_path):
    report = audit_files(str(REPO / "configs" / f"{name}.yaml"), None, FAST, suggest=True)
    first = report.suggestions[0]
    assert first["passes"]
    folder = tmp_path / "configs"
    shutil.copytree(REPO / "configs", folder)
    path = folder / f"{name}.yaml"
    overrides = apply_snippet(first["yaml"], path, name.startswith("bridge-"))
    fixed = audit_files(str(path), None, replace(FAST, overrides=overrides))
    assert not [f for f in fixed.findings if f.severity == "error"], first["remedy"]


def test_every_failing_bundled_config_is_covered():
    failing = sorted(p.stem for p in (REPO / "configs").glob("*.yaml")
                     if "exit 1" in (REPO / "tests" / "golden" / f"{p.stem}.txt").read_text()
                     .split("\n\n", 2)[1])
    assert failing == sorted(FAILING_BUNDLED)


# --- real corpus files ------------------------------------------------------------------------
# Each list names files whose copy fails with QA001: as they are (Nemotron-3.5 Lightning's
# repeated MTP), or after `_with_repeated_mtp` adds a repeated MTP layer at two depths the way
# a user would write it in that file. Dense and MoE, BF16 and FP8, CUDA graphs, Megatron-FSDP.
MODEL_ARGS_AS_IS = ["nemotron__nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200.yaml",
                    "nemotron__nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G"
                    ".yaml"]
MODEL_ARGS_MADE_TO_FAIL = [
    "gpt__gpt3_15b_8t_release.yaml", "gpt__gpt3_15b_8t_release_sm.yaml",
    "gpt__gpt3_mcore_te_tp2_pp2_defer_embedding_wgrad_compute.yaml",
    "gpt__gpt_dynamic_inference_tp1_pp1_583m_cuda_graphs_fp8_logitsmatch.yaml",
    "gpt__gpt_static_inference_tp1_pp1_16b_multiprompt_tokensmatch.yaml",
    "gpt__gpt_static_inference_tp1_pp1_583m_fp8_cudagraphs.yaml",
    "mimo__mimo_vlm_pretrain_convergence_tp1_pp1_cp1_dp8.yaml"]
SCRIPTS_MADE_TO_FAIL = [
    "llama__train_llama3_8b_h100_fp8.sh", "mixtral__train_mixtral_8x7b_distributed.sh",
    "post_training__modelopt__conf__Qwen__Qwen2.5-0.5B-Instruct.sh",
    "post_training__modelopt__conf__Qwen__Qwen3-8B.sh",
    "post_training__modelopt__conf__meta-llama__Llama-3.1-8B-Instruct.sh",
    "post_training__modelopt__conf__meta-llama__Llama-4-Scout-17B-16E-Instruct.sh",
    "post_training__modelopt__conf__nvidia__Nemotron-Mini-4B-Instruct.sh",
    "post_training__modelopt__conf__openai__gpt-oss-20b.sh"]
BRIDGE_AS_IS = [f"nemotron_3_5_lightning_pretrain_{name}_config.yaml" for name in (
    "16gpu_h100_fp8cs", "8gpu_b200_bf16", "8gpu_b200_fp8mx", "8gpu_b200_nvfp4",
    "8gpu_gb200_fp8mx_fsdp", "8gpu_gb300_bf16", "8k_fsdp", "")]
BRIDGE_AS_IS[-1] = "nemotron_3_5_lightning_pretrain_config.yaml"


def _with_repeated_mtp(text: str, model_args: bool) -> str:
    """Two MTP depths sharing one layer, written beside the file's --num-layers."""
    lines = text.splitlines()
    pattern = r"\s+--num-layers:" if model_args else r"\s+--num-layers\s"
    index = next(i for i, line in enumerate(lines) if re.match(pattern, line))
    if model_args:
        indent = lines[index][:len(lines[index]) - len(lines[index].lstrip())]
        lines[index + 1:index + 1] = [f"{indent}--mtp-num-layers: 2",
                                      f"{indent}--mtp-use-repeated-layer: true"]
    else:
        lines[index] = lines[index].replace(
            "--num-layers", "--mtp-num-layers 2 --mtp-use-repeated-layer --num-layers", 1)
    return "\n".join(lines) + "\n"


CASES = ([("megatron/functional_tests", name, False) for name in MODEL_ARGS_AS_IS]
         + [("megatron/functional_tests", name, True) for name in MODEL_ARGS_MADE_TO_FAIL]
         + [("megatron/launch_scripts", name, True) for name in SCRIPTS_MADE_TO_FAIL]
         + [("bridge/dumps", name, False) for name in BRIDGE_AS_IS])


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
@pytest.mark.parametrize("folder,name,mutate", CASES, ids=[case[1] for case in CASES])
def test_first_remedy_applied_as_printed_clears_qa001_on_corpus_file(folder, name, mutate,
                                                                      tmp_path):
    source = CORPUS / folder / name
    text = source.read_text(encoding="utf-8")
    if mutate:
        text = _with_repeated_mtp(text, name.endswith(".yaml"))
    counter = iter(range(100))

    def copy_of() -> Path:
        path = tmp_path / f"copy{next(counter)}" / name  # a copy in a temporary folder only
        path.parent.mkdir()
        path.write_text(text, encoding="utf-8")
        return path

    assert _applied_clears(copy_of, FAST) >= 1


def test_corpus_cases_cover_every_input_kind():
    assert len(CASES) >= 20
    assert {folder for folder, _, _ in CASES} == {"megatron/functional_tests",
                                                  "megatron/launch_scripts", "bridge/dumps"}
