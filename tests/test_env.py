"""`qaudit env`: versions, GPU, recipes the GPU can run, what `auto` picks. Exit 0."""

from __future__ import annotations

import json
import platform

import pytest

from cli_helpers import run_in_process as run_cli_in_process
from qaudit.commands.env import capability_support, collect, render_env_text


def run_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    return run_cli_in_process(monkeypatch, capsys, *args, cwd=None)  # the test sets the cwd


def supported(capability, cuda="12.9"):
    return {r.recipe for r in capability_support(capability, cuda) if r.supported}


def test_env_prints_versions_and_exits_0(monkeypatch, capsys):
    import torch

    code, out, err = run_in_process(monkeypatch, capsys, "env")
    assert code == 0, err
    assert platform.python_version() in out and torch.__version__ in out
    assert "auto" in out and "-> reference" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_env_json(monkeypatch, capsys):
    code, out, _ = run_in_process(monkeypatch, capsys, "env", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["schema"] == "qaudit-env/1"
    assert data["auto_runtime"] == "reference"
    assert {r["recipe"] for r in data["recipes"]} == {"bf16", "fp8/delayed", "fp8/tensorwise",
                                                      "fp8/blockwise", "fp8/mxfp8", "fp4/nvfp4"}


@pytest.mark.parametrize("capability,cuda,expected", [
    (None, None, {"bf16"}),
    ((8, 0), "12.4", {"bf16"}),
    ((8, 9), "12.4", {"bf16", "fp8/delayed", "fp8/tensorwise"}),
    ((8, 9), "12.0", {"bf16"}),
    ((9, 0), "12.8", {"bf16", "fp8/delayed", "fp8/tensorwise"}),
    ((9, 0), "12.9", {"bf16", "fp8/delayed", "fp8/tensorwise", "fp8/blockwise"}),
    ((10, 0), "12.9", {"bf16", "fp8/delayed", "fp8/tensorwise", "fp8/blockwise", "fp8/mxfp8",
                       "fp4/nvfp4"}),
    ((12, 0), "12.9", {"bf16", "fp8/delayed", "fp8/tensorwise", "fp8/blockwise", "fp4/nvfp4"}),
])
def test_recipe_support_by_compute_capability(capability, cuda, expected):
    assert supported(capability, cuda) == expected


def test_simulated_hopper_gpu_without_te(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100")
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    report = collect()
    assert report.gpus == [{"index": 0, "name": "NVIDIA H100", "compute_capability": "9.0"}]
    ok = {r.recipe for r in report.recipes if r.supported}
    assert ok == {"bf16", "fp8/delayed", "fp8/tensorwise", "fp8/blockwise"}
    text = render_env_text(report)
    assert "NVIDIA H100, compute capability 9.0" in text
    assert "fp8/mxfp8       no   MXFP8 needs compute capability 10.0+ (sm90)" in text


def test_broken_torch_cuda_query_is_reported_not_raised(monkeypatch):
    import torch

    def boom():
        raise RuntimeError("driver too old")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    report = collect()
    assert report.cuda_available is False and "driver too old" in report.te_reason
