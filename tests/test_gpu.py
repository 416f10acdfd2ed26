"""On a GPU: the te runtime (real Transformer Engine) and the reference runtime on CUDA give the
same table and the same gradient outcome as the reference runtime on every bundled config.

Marked `gpu`; skipped cleanly where CUDA or TE is missing (the reference-on-CUDA tests need
CUDA only). scripts/gpu-check runs the fast tests here and prints the parity table itself.
A config whose recipe this GPU cannot execute (MXFP8/NVFP4 below sm100, FP8 below sm89) is
skipped on te with TE's reason, not failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qaudit.load.precision import Quant
from qaudit.runtime import te_unavailable_reason
from qaudit.commands.parity import audit_side, differences

pytestmark = pytest.mark.gpu

CONFIGS = sorted(str(p) for p in (Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))
HAS_CUDA = torch.cuda.is_available()
TE_REASON = te_unavailable_reason() if HAS_CUDA else "no CUDA device"
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
needs_te = pytest.mark.skipif(bool(TE_REASON), reason=f"needs TE and CUDA: {TE_REASON}")

_cache: dict[tuple[str, str], object] = {}


def side(config: str, name: str):
    """One audit (with --verify) per config and side, shared by the tests below."""
    key = (config, name)
    if key not in _cache:
        _cache[key] = audit_side(config, name, verify=True)
    result = _cache[key]
    if result.unavailable is not None:
        pytest.skip(f"{name}: {result.unavailable}")
    return result


def ids(path: str) -> str:
    return Path(path).stem


@needs_te
def test_te_wgrad_rule_is_the_documented_one():
    """What TE's Linear, LayerNormLinear and GroupedLinear did to main_grad, measured, equals
    docs/semantics.md §1.2-1.3 (accumulate = fuse and not flag; None follows fuse;
    overwrite_main_grad overwrites) for every combination."""
    from qaudit.runtime.te import TERuntime

    runtime = TERuntime()
    found = runtime.wgrad_rule_differences()
    major, minor = (int(part) for part in runtime.api.version.split(".")[:2])
    if (major, minor) < (2, 9):  # overwrite_main_grad arrived in TE 2.9 (docs/semantics.md §1.3)
        found = {k: [d for d in v if "overwrite_main_grad=True" not in d] for k, v in found.items()}
    assert found == {k: [] for k in ("linear", "layernorm_linear", "grouped_linear")}


@needs_te
@pytest.mark.parametrize("quant", [None, Quant("fp8", "tensorwise", "e4m3"), Quant("fp8", "delayed", "hybrid"),
                                   Quant("fp8", "blockwise", "e4m3"), Quant("fp8", "mxfp8", "e4m3"),
                                   Quant("fp4", "nvfp4")], ids=lambda q: q.label if q else "bf16")
def test_te_modules_run_each_recipe_and_report_it(quant):
    """Each module kind runs forward and backward under each recipe this GPU supports; TE's
    state reads back as the recipe entered; the probe reports one decision per backward."""
    from qaudit.errors import EnvironmentProblem
    from qaudit.runtime.te import TERuntime

    runtime = TERuntime()
    try:
        context = runtime.autocast(quant)
    except EnvironmentProblem as exc:
        pytest.skip(str(exc))
    modules = [runtime.linear(64, 32, fuse=True), runtime.layernorm_linear(64, 32, fuse=True),
               runtime.grouped_linear(4, 64, 32, fuse=True)]
    decisions = []
    for module in modules:
        for p in module.parameters():
            p.main_grad = torch.zeros_like(p)
            p.grad_added_to_main_grad = False
        module.wgrad_listener = decisions.append
    x = torch.randn(2, 16, 64, device="cuda")
    with context:
        assert runtime.current_quant() == quant
        outs = [modules[0](x, is_first_microbatch=True), modules[1](x, is_first_microbatch=False),
                modules[2](x.reshape(32, 64), [5, 0, 20, 7], is_first_microbatch=None)]
    sum(o.float().sum() for o in outs).backward()
    assert sorted(decisions) == ["accumulate", "accumulate", "overwrite"]
    written = [p.main_grad for m in modules for n, p in m.named_parameters()
               if n.startswith("weight") and n != "weight1"]  # grouped weight1 got no tokens
    assert len(written) == 5
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in written)


@needs_te
@pytest.mark.parametrize("config", CONFIGS, ids=ids)
def test_parity_te_vs_reference(config):
    """Same rows (precision, recipe, tracked, accumulation, calls, verdict), same findings and
    exit code, and the same gradient outcome per module under --verify (QA001 modules lose
    their gradient on TE too)."""
    te, ref = side(config, "te"), side(config, "reference-cuda")
    assert differences(ref, te) == []
    assert te.runtime.startswith("te (CUDA, TE ")


@needs_cuda
@pytest.mark.parametrize("config", CONFIGS, ids=ids)
def test_parity_reference_cuda_vs_cpu(config):
    cpu, cuda = side(config, "reference-cpu"), side(config, "reference-cuda")
    assert differences(cpu, cuda) == []
    assert cuda.runtime == "reference (CUDA)"
