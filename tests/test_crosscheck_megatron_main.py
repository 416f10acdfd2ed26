"""--cross-check against a Megatron-LM checkout (main), only where one is given:
QAUDIT_TEST_MEGATRON_LM_MAIN=DIR, DIR holding `megatron/` (e.g. `git archive HEAD megatron`
of a clone, untarred), with numpy and einops importable (beside it, or installed). The
checkout is read as the installed Megatron (`--megatron auto`), so its own behaviour is the
one checked, whatever commit it is."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from cli_helpers import run_in_process

pytestmark = pytest.mark.usefixtures("forget_megatron")

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"


@pytest.fixture
def megatron_main(monkeypatch) -> Path:
    where = os.environ.get("QAUDIT_TEST_MEGATRON_LM_MAIN")
    if not where:
        pytest.skip("QAUDIT_TEST_MEGATRON_LM_MAIN not set (a Megatron-LM checkout)")
    root = Path(where)
    if not (root / "megatron" / "core" / "__init__.py").is_file():
        pytest.fail(f"QAUDIT_TEST_MEGATRON_LM_MAIN={where} holds no megatron/core/")
    monkeypatch.syspath_prepend(str(root))
    for package in ("numpy", "einops"):
        if importlib.util.find_spec(package) is None:
            pytest.fail(f"{package} is not importable beside {root} (pip install --target "
                        f"{root} {package})")
    return root


CONFIGS = ["configs/gpt-small-bf16.yaml", "configs/deepseek-v3-mtp-fp8.yaml",
           "configs/nemotron-h-8b-fp8.yaml", "configs/bridge-lightning-mtp-bf16.yaml"]
CORPUS_FILES = [
    "megatron/functional_tests/nemotron__nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200.yaml",
    "megatron/functional_tests/t5__t5_mcore_te_tp2_pp1_vp1.yaml",
]


@pytest.mark.parametrize("path", CONFIGS + [str(CORPUS / name) for name in CORPUS_FILES])
def test_megatron_lm_main_cross_checks(megatron_main, monkeypatch, capsys, path):
    if Path(path).is_absolute() and not Path(path).exists():
        pytest.skip(f"corpus file not found: {path}")
    code, out, err = run_in_process(monkeypatch, capsys, "check", path, "--cross-check",
                                    "--format", "json")
    assert code in (0, 1), err
    report = json.loads(out)
    result = report["cross_check"]
    assert report["megatron"]["source"] == "installed"  # the checkout's own behaviour
    assert result["ran"] and result["modules_compared"] == len(report["modules"]) > 0
    assert result["differences"] == [], result["differences"][:5]
