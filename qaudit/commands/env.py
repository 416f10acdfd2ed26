"""`qaudit env`: what this machine can run — Python, torch, Transformer Engine, CUDA, the GPU's
compute capability, which quantization recipes it can execute, and which runtime `auto` picks.

Recipe support follows Transformer Engine's own checks (asked directly when TE imports):
fp8 delayed/tensorwise need sm89+ (Ada also needs CUDA 12.1+), fp8 blockwise needs sm90+ and
CUDA 12.9+, mxfp8 needs sm100+ (not yet sm120+), nvfp4 needs sm100+. Nothing here fails the
command: every probe that cannot run is reported as such.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

ENV_SCHEMA = "qaudit-env/1"
RECIPES = ("bf16", "fp8/delayed", "fp8/tensorwise", "fp8/blockwise", "fp8/mxfp8", "fp4/nvfp4")


@dataclass
class RecipeSupport:
    recipe: str
    supported: bool
    reason: str


@dataclass
class EnvReport:
    qaudit: str
    python: str
    platform: str
    torch: str | None
    torch_cuda: str | None
    cuda_available: bool
    gpus: list[dict[str, Any]] = field(default_factory=list)
    transformer_engine: str | None = None
    te_usable: bool = False
    te_reason: str = ""
    recipes: list[RecipeSupport] = field(default_factory=list)
    recipes_source: str = ""
    auto_runtime: str = "reference"
    auto_reason: str = ""
    runtimes: dict[str, str] = field(default_factory=dict)
    # The Megatron `check --megatron auto` audits for (qaudit/plan/upstream/target.py).
    megatron: dict[str, Any] = field(default_factory=dict)
    # The TE behaviour `check --te auto` audits for (qaudit/plan/upstream/te.py).
    te: dict[str, Any] = field(default_factory=dict)
    # The Megatron-Bridge named-recipe table a Bridge dump naming a recipe is read with
    # (qaudit/plan/upstream/bridge_recipes.py).
    bridge_recipes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": ENV_SCHEMA, **asdict(self)}


def _version(module: str) -> str | None:
    """The installed distribution's version, read bounded from its METADATA along sys.path
    (importlib.metadata would read a whole file, whatever a PYTHONPATH entry put there)."""
    from qaudit.plan.upstream.dist_info import installed_version

    return installed_version((module, module.replace("_", "-")), sys.path).version


def _cuda_major_minor(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def capability_support(capability: tuple[int, int] | None,
                       cuda: str | None) -> list[RecipeSupport]:
    """What TE's checks would say for this compute capability and CUDA version."""
    if capability is None:
        no_gpu = "no CUDA GPU visible"
        return [RecipeSupport("bf16", True, "")] + [
            RecipeSupport(r, False, no_gpu) for r in RECIPES[1:]]
    sm = f"sm{capability[0]}{capability[1]}"
    cuda_v = _cuda_major_minor(cuda) or (0, 0)
    out = [RecipeSupport("bf16", True, "")]
    if capability >= (9, 0):
        fp8 = (True, "")
    elif capability >= (8, 9):
        fp8 = (cuda_v >= (12, 1), "" if cuda_v >= (12, 1) else "FP8 on Ada needs CUDA 12.1+")
    else:
        fp8 = (False, f"FP8 needs compute capability 8.9+ ({sm})")
    out += [RecipeSupport("fp8/delayed", *fp8), RecipeSupport("fp8/tensorwise", *fp8)]
    if capability >= (9, 0) and cuda_v >= (12, 9):
        out.append(RecipeSupport("fp8/blockwise", True, ""))
    else:
        out.append(RecipeSupport("fp8/blockwise", False, "FP8 block scaling needs compute "
                                 f"capability 9.0+ and CUDA 12.9+ ({sm}, CUDA {cuda or '?'})"))
    if capability >= (12, 0):
        out.append(RecipeSupport("fp8/mxfp8", False, f"MXFP8 is not supported on sm120+ yet ({sm})"))
    elif capability >= (10, 0):
        out.append(RecipeSupport("fp8/mxfp8", True, ""))
    else:
        out.append(RecipeSupport("fp8/mxfp8", False, f"MXFP8 needs compute capability 10.0+ ({sm})"))
    if capability >= (10, 0):
        out.append(RecipeSupport("fp4/nvfp4", True, ""))
    else:
        out.append(RecipeSupport("fp4/nvfp4", False, f"NVFP4 needs compute capability 10.0+ ({sm})"))
    return out


def _te_support() -> list[RecipeSupport] | None:
    """TE's own answer, from whichever module this TE version keeps its checks in."""
    for module_name in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - any import failure means "ask the next one"
            continue
        checks = {"fp8/delayed": "check_fp8_support", "fp8/tensorwise": "check_fp8_support",
                  "fp8/blockwise": "check_fp8_block_scaling_support",
                  "fp8/mxfp8": "check_mxfp8_support", "fp4/nvfp4": "check_nvfp4_support"}
        out = [RecipeSupport("bf16", True, "")]
        for recipe, name in checks.items():
            check = getattr(module, name, None)
            if check is None:
                out.append(RecipeSupport(recipe, False, f"this TE has no {name}"))
                continue
            try:
                ok, reason = check()
            except Exception as exc:  # noqa: BLE001
                ok, reason = False, f"{name} failed: {type(exc).__name__}: {exc}"
            out.append(RecipeSupport(recipe, bool(ok), str(reason or "")))
        return out
    return None


def collect() -> EnvReport:
    from qaudit import __version__

    from qaudit.plan.upstream.bridge_recipes import recipe_table_for
    from qaudit.plan.upstream.target import resolve_megatron
    from qaudit.plan.upstream.te import resolve_te

    table = recipe_table_for()
    report = EnvReport(qaudit=__version__, python=platform.python_version(),
                       platform=f"{platform.system()} {platform.machine()}",
                       torch=None, torch_cuda=None, cuda_available=False,
                       megatron=resolve_megatron().to_dict(), te=resolve_te().to_dict(),
                       bridge_recipes={"origin": table.origin, "note": table.note,
                                       "recipes": sorted(table.recipes)})
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch is what this command reports
        report.te_reason = f"torch does not import: {type(exc).__name__}: {exc}"
        report.recipes = capability_support(None, None)
        report.recipes_source = "no torch"
        report.auto_reason = "torch is missing, so no runtime can run"
        report.auto_runtime = "none"
        return report
    report.torch = torch.__version__
    report.torch_cuda = torch.version.cuda
    try:
        report.cuda_available = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if report.cuda_available else 0
        for index in range(count):
            major, minor = torch.cuda.get_device_capability(index)
            report.gpus.append({"index": index, "name": torch.cuda.get_device_name(index),
                                "compute_capability": f"{major}.{minor}"})
    except Exception as exc:  # noqa: BLE001
        report.cuda_available = False
        report.te_reason = f"CUDA query failed: {type(exc).__name__}: {exc}"

    report.transformer_engine = _version("transformer_engine")
    from qaudit.runtime import te_unavailable_reason

    if importlib.util.find_spec("transformer_engine") is None:
        report.te_reason = report.te_reason or te_unavailable_reason()
    else:
        reason = te_unavailable_reason()
        report.te_usable = not reason
        report.te_reason = reason

    capability = None
    if report.gpus:
        major, minor = report.gpus[0]["compute_capability"].split(".")
        capability = (int(major), int(minor))
    te_support = _te_support() if (report.transformer_engine and report.cuda_available) else None
    if te_support is not None:
        report.recipes, report.recipes_source = te_support, "Transformer Engine's own checks"
    else:
        report.recipes = capability_support(capability, report.torch_cuda)
        report.recipes_source = ("from GPU 0's compute capability, by TE's rules" if capability
                                 else "no CUDA GPU")

    te_reason = report.te_reason or te_unavailable_reason()
    report.runtimes = {"reference": "available (pure PyTorch, CPU or CUDA)",
                       "te": "unavailable: " + te_reason if te_reason else "available"}
    report.auto_runtime = _auto_choice()
    report.auto_reason = ("auto picks te when Transformer Engine imports and CUDA is visible; "
                          "here it picks reference" if report.auto_runtime == "reference" else
                          "auto picks te: Transformer Engine and CUDA are usable")
    return report


def _auto_choice() -> str:
    from qaudit.runtime import select_runtime

    try:
        runtime = select_runtime("auto")
    except Exception as exc:  # noqa: BLE001
        return f"none ({type(exc).__name__}: {exc})"
    return getattr(runtime, "name", None) or type(runtime).__name__.replace("Runtime", "").lower()


def render_env_text(report: EnvReport, width: int = 80) -> str:
    import textwrap

    def item(label: str, text: str, indent: int = 16) -> list[str]:
        label = label.ljust(indent)
        return textwrap.wrap(text, width=width, initial_indent=label,
                             subsequent_indent=" " * len(label), break_long_words=False,
                             break_on_hyphens=False) or [label]

    torch_text = "not installed"
    if report.torch:
        torch_text = report.torch + (f" (CUDA {report.torch_cuda} build)" if report.torch_cuda
                                     else " (CPU build)")
    lines = item("qaudit", report.qaudit)
    lines += item("python", f"{report.python} ({report.platform})")
    lines += item("torch", torch_text)
    lines += item("CUDA", "available" if report.cuda_available else "not available")
    for gpu in report.gpus or []:
        lines += item(f"GPU {gpu['index']}", f"{gpu['name']}, compute capability "
                                             f"{gpu['compute_capability']}")
    if not report.gpus:
        lines += item("GPU", "none")
    # The behaviours `check` audits for, side by side.
    lines += [""] + item("", "audited for (check --megatron auto / --te auto):", indent=0)
    megatron = report.megatron
    lines += item("  Megatron", f"{megatron.get('label')}, tracking behaviour "
                  f"{megatron.get('policy')} ({megatron.get('source')}"
                  + (f": {megatron['location']}" if megatron.get("location") else "")
                  + (f"; {megatron['note']}" if megatron.get("note") else "") + ")")
    te_target = report.te or {}
    lines += item("  TE", f"{te_target.get('label')}, overwrite_main_grad "
                  f"{te_target.get('overwrite_main_grad')} ({te_target.get('source')}"
                  + (f": {te_target['location']}" if te_target.get("location") else "")
                  + (f"; {te_target['note']}" if te_target.get("note") else "") + ")")
    recipes = report.bridge_recipes or {}
    if recipes:
        lines += item("  Bridge", f"{len(recipes.get('recipes', []))} named mixed-precision "
                      f"recipes, from {recipes.get('origin')}"
                      + (f" ({recipes['note']})" if recipes.get("note") else ""))
    lines += [""]
    te = report.transformer_engine or "not installed"
    lines += item("TE", te if report.te_usable or not report.transformer_engine
                  else f"{te}, not usable: {report.te_reason}")
    if not report.transformer_engine:
        lines += item("", report.te_reason)
    lines += [""] + item("", f"quantization recipes the GPU can execute natively "
                             f"({report.recipes_source}):", indent=0)
    recipe_width = max(len(r.recipe) for r in report.recipes)
    for r in report.recipes:
        lines += item(f"  {r.recipe.ljust(recipe_width)}  {'yes' if r.supported else 'no '}  ",
                      r.reason, indent=0)
    lines += ["", "runtimes (reference fake-quantizes, so it audits every recipe anywhere):"]
    for name, text in report.runtimes.items():
        lines += item(f"  {name}", text)
    lines += item("  auto", f"-> {report.auto_runtime}"
                  + (f" ({report.auto_reason})" if report.auto_reason else ""))
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_env_json(report: EnvReport) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


if __name__ == "__main__":  # pragma: no cover - handy on a GPU machine without the CLI
    sys.stdout.write(render_env_text(collect()))
