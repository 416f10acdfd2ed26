"""Megatron-LM's hybrid and T5 corpus files through --cross-check, a training run each (slow). The
family corpus is split in two files so that neither runs for more than a few minutes; the
other half is tests/test_families_corpus_bridge.py, the lists and helpers are in
tests/test_crosscheck_families.py."""

from __future__ import annotations

import json
import os
import re

import pytest

from test_crosscheck_families import (CORPUS, MEGATRON_FILES, T5_FILES, ULTRA_FILE, check_corpus_file,
                                      hybrid_megatron)  # noqa: F401 (a fixture)


# The TE-side sweep (tests/te_cpu_sweep.py) cross-checks every other hybrid and T5 file (the
# even places) with the same Megatron and comparison on TE's own Python: here the odd places,
# and every file when that sweep cannot run (no TE fetched).
TE_SIDE_RUNS = bool(os.environ.get("QAUDIT_TEST_TE_DIRS"))


def standin_files() -> list[str]:
    step = (lambda files: files[1::2]) if TE_SIDE_RUNS else (lambda files: files)
    return [f"megatron/{n}" for n in step(MEGATRON_FILES) + (ULTRA_FILE,) + step(T5_FILES)]


# Nemotron-3 Super's 512 routed experts are 40,960 of its 41,217 modules and most of its
# cross-check's time (51 s of CPU); their number is not what the file tests here (Nemotron-3
# Ultra, the same launch script with 512 experts too, is cross-checked at full size). A copy
# with fewer experts is cross-checked instead, and its audit must give each kind of module
# the file's row (test below).
FEWER_EXPERTS = {"megatron/launch_scripts/post_training__modelopt__conf__nvidia__"
                 "NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh": 32}
_EXPERTS_FLAG = re.compile(r"(--num-experts\s+)(\d+)")


def with_fewer_experts(name: str, folder) -> "os.PathLike":
    text = (CORPUS / name).read_text()
    lighter, count = _EXPERTS_FLAG.subn(lambda m: f"{m.group(1)}{FEWER_EXPERTS[name]}", text)
    assert count == 1
    copy = folder / os.path.basename(name)
    copy.write_text(lighter)
    return copy


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", standin_files())
def test_hybrid_corpus_file_cross_checks(hybrid_megatron, monkeypatch, capsys, name, tmp_path):
    path = with_fewer_experts(name, tmp_path) if name in FEWER_EXPERTS else None
    check_corpus_file(monkeypatch, capsys, name, path)


def _rows_by_kind(report: dict) -> dict[str, list]:
    """Each kind of module (its name with the layer and expert numbers taken out): the
    distinct rows its modules have, without the name."""
    kinds: dict[str, list] = {}
    for row in report["modules"]:
        kind = re.sub(r"\.\d+(?=\.|$)", ".N", row["name"])
        fields = {k: v for k, v in row.items() if k not in ("name", "grad_rel_error")}
        if fields not in kinds.setdefault(kind, []):
            kinds[kind].append(fields)
    return kinds


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
@pytest.mark.parametrize("name", sorted(FEWER_EXPERTS))
def test_fewer_experts_give_every_kind_of_module_the_files_row(monkeypatch, capsys, name,
                                                               tmp_path):
    from cli_helpers import run_in_process

    reports = []
    for path in (CORPUS / name, with_fewer_experts(name, tmp_path)):
        code, out, err = run_in_process(monkeypatch, capsys, "check", str(path), "--format",
                                        "json", "--megatron", "0.19.2")
        assert code in (0, 1), err
        reports.append(json.loads(out))
    whole, fewer = reports
    assert _rows_by_kind(whole) == _rows_by_kind(fewer)
    assert {(f["rule"], f["severity"]) for f in whole["findings"]} \
        == {(f["rule"], f["severity"]) for f in fewer["findings"]}
    assert len(whole["modules"]) > len(fewer["modules"])


def test_every_family_file_is_cross_checked_on_one_side_or_both():
    """A file left out here is one the TE-side sweep cross-checks (tests/te_cpu_sweep.py)."""
    from te_cpu_sweep import corpus_selection

    te_side = {str(CORPUS / "megatron" / name) for name in MEGATRON_FILES + T5_FILES} \
        & set(corpus_selection())
    every = {f"megatron/{n}" for n in MEGATRON_FILES + (ULTRA_FILE,) + T5_FILES}
    left_out = every - set(standin_files())
    assert not left_out or TE_SIDE_RUNS
    assert {str(CORPUS / name) for name in left_out} <= te_side
