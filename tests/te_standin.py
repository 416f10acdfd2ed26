"""TE's own modules on qaudit's CPU kernel stand-in against the reference runtime.

Run as a script in a process whose sys.path holds one TE release's Python (one TE per
process: its modules cannot be unloaded): `python tests/te_standin.py OUT.json [CONFIG...]`.
It writes {"te": version, "cases": n, "differences": [...], "configs": {...}} where every
difference is one line. tests/test_te_standin.py runs it per fetched release.

Cases: module kind x recipe x (is_first_microbatch of call 1, of call 2) x (one backward
over both calls, or a backward after each) x fusion x overwrite_main_grad. Per call: the
weight-cache use (TE's: observed through the stand-in's cast kernel) and per backward the
wgrad decision (TE's: the accumulate flag of the GEMM writing main_grad), against the
reference runtime's on the same sequence.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from qaudit.load.precision import Quant  # noqa: E402
from qaudit.runtime import select_runtime  # noqa: E402
from qaudit.runtime.reference import ReferenceRuntime  # noqa: E402

RECIPES = {"bf16": None, "delayed": Quant("fp8", "delayed"), "tensorwise": Quant("fp8", "tensorwise"),
           "mxfp8": Quant("fp8", "mxfp8"), "blockwise": Quant("fp8", "blockwise"),
           "nvfp4": Quant("fp4", "nvfp4")}
FLAGS = (True, False, None)
KINDS = ("linear", "layernorm_linear", "grouped_linear")
WIDTH, ROWS, EXPERTS = 64, 64, 2


def _build(runtime, kind: str, fuse: bool, overwrite: bool) -> torch.nn.Module:
    if kind == "grouped_linear":
        module = runtime.grouped_linear(EXPERTS, WIDTH, WIDTH, fuse=fuse)
    else:
        module = getattr(runtime, kind)(WIDTH, WIDTH, fuse=fuse)
    for name, param in module.named_parameters():
        param.main_grad = torch.zeros_like(param, dtype=torch.float32)
        param.grad_added_to_main_grad = False
        if overwrite and name.startswith("weight"):
            param.overwrite_main_grad = True
    return module


def _call(module, kind: str, x: torch.Tensor, flag):
    if kind == "grouped_linear":
        return module(x, [ROWS // EXPERTS] * EXPERTS, is_first_microbatch=flag)
    return module(x, is_first_microbatch=flag)


def _cache_of_reference(module, before: int, quant) -> str | None:
    if quant is None:
        return None
    events = module.workspace_events[before:]
    if not events:
        return "fresh"
    return "reuse" if events[-1] == "reuse" else "refresh"


def run_case(runtime, kind, quant, flags, per_call_backward, fuse, overwrite) -> dict:
    torch.manual_seed(0)
    module = _build(runtime, kind, fuse, overwrite)
    decisions: list[str] = []
    caches: list[str | None] = []
    module.wgrad_listener = decisions.append
    context = runtime.autocast(quant) if quant is not None else torch.enable_grad()
    outputs = []
    with context:
        for step, flag in enumerate(flags):
            x = torch.randn(ROWS, WIDTH)
            before = len(getattr(module, "workspace_events", []))
            y = _call(module, kind, x, flag)
            if runtime.name == "te":
                caches.append(getattr(module, "observed_cache", None) if quant else None)
            else:
                caches.append(_cache_of_reference(module, before, quant))
            if per_call_backward:
                y.sum().backward()
            else:
                outputs.append(y)
            with torch.no_grad():  # an optimizer step between calls: a stale cache shows
                for name, param in module.named_parameters():
                    if name.startswith("weight"):
                        param.data.add_(0.5)  # .data: autograd keeps its saved view
    if outputs:
        sum(y.sum() * (i + 1) for i, y in enumerate(outputs)).backward()
    return {"decisions": decisions, "caches": caches}


def run_pair(runtime, kind, quant, flags, per_call_backward, fuse,
             overwrite) -> tuple[dict, dict, int]:
    """The case on two identical TE modules in a row, as two layers: the first runs TE's code,
    the second's calls are inferred from it (qaudit/runtime/te_infer.py). Both records, and
    how many modules were inferred (1, or the case proves nothing about inference)."""
    import functools

    from qaudit.model.identical import TE_MODULE_NAMES, same_structure

    torch.manual_seed(0)
    first, second = (_build(runtime, kind, fuse, overwrite) for _ in range(2))
    inference = runtime.form_classes([("first", first), ("second", second)],
                                     functools.partial(same_structure, names=TE_MODULE_NAMES))
    got = {module: {"decisions": [], "caches": []} for module in ("first", "second")}
    first.wgrad_listener = got["first"]["decisions"].append
    second.wgrad_listener = got["second"]["decisions"].append
    context = runtime.autocast(quant) if quant is not None else torch.enable_grad()
    outputs = []
    try:
        with context:
            for flag in flags:
                # Needing a gradient as the first module's output does: the same call.
                x = torch.randn(ROWS, WIDTH, requires_grad=True)
                hidden = _call(first, kind, x, flag)
                got["first"]["caches"].append(
                    getattr(first, "observed_cache", None) if quant else None)
                y = _call(second, kind, hidden, flag)
                got["second"]["caches"].append(
                    getattr(second, "observed_cache", None) if quant else None)
                if per_call_backward:
                    y.sum().backward()
                else:
                    outputs.append(y)
                with torch.no_grad():
                    for module in (first, second):
                        for name, param in module.named_parameters():
                            if name.startswith("weight"):
                                param.data.add_(0.5)
        if outputs:
            sum(y.sum() * (i + 1) for i, y in enumerate(outputs)).backward()
    finally:
        runtime.inference = None
    summary = inference.summary(["first", "second"]) or {}
    return got["first"], got["second"], summary.get("modules_inferred", 0)


def module_cases(te_runtime, behaviour) -> tuple[int, list[str], list[str], int]:
    """Every case on TE's modules against the reference runtime configured, as an audit is,
    with `behaviour` (the TE release's facts, qaudit/plan/upstream/te.py)."""
    reference = ReferenceRuntime(
        "cpu", behaviour.reads_overwrite_main_grad,
        overwrite_read_from_gemm_weight=behaviour.overwrite_read_from_gemm_weight)
    # The reference without the per-module-kind fact, to count what the fact explains.
    unaware = ReferenceRuntime("cpu", behaviour.reads_overwrite_main_grad)
    differences, not_stood_in, unexplained_before = [], [], 0
    count = 0
    for recipe, kind in itertools.product(RECIPES, KINDS):
        quant = RECIPES[recipe]
        if quant is not None:
            try:
                te_runtime.recipe_for(quant)
            except Exception as exc:  # noqa: BLE001 - named in the report
                not_stood_in.append(f"{recipe}: {str(exc).splitlines()[0]}")
                continue
        for f1, f2, per_call, fuse, overwrite in itertools.product(
                FLAGS, FLAGS, (False, True), (True, False), (False, True)):
            if overwrite and not fuse:
                continue
            case = (kind, recipe, (f1, f2), "per-call" if per_call else "one", fuse, overwrite)
            count += 1
            try:
                got, inferred, count_inferred = run_pair(te_runtime, kind, quant, (f1, f2),
                                                         per_call, fuse, overwrite)
            except NotImplementedError as exc:
                not_stood_in.append(f"{recipe} {kind}: {str(exc).splitlines()[0]}")
                break
            want = run_case(reference, kind, quant, (f1, f2), per_call, fuse, overwrite)
            if got != want:
                differences.append(f"{case}: te {got} reference {want}")
            # The second module's calls inferred from the first's: the same records.
            if inferred != want or count_inferred != 1:
                differences.append(f"{case}: inferred ({count_inferred} module) {inferred} "
                                   f"reference {want}")
            fact_applies = overwrite and quant is not None \
                and kind in behaviour.overwrite_read_from_gemm_weight
            if fact_applies:
                want = run_case(unaware, kind, quant, (f1, f2), per_call, fuse, overwrite)
            unexplained_before += got != want
    return count, differences, sorted(set(not_stood_in)), unexplained_before


def _comparable(report) -> dict:
    rows = [{k: v for k, v in vars(row).items() if k not in ("grad_rel_error",)}
            for row in report.modules]
    findings = [(f.rule, f.severity, f.module, f.message) for f in report.findings]
    return {"rows": rows, "findings": findings}


def config_differences(paths: list[str], module_rows: dict | None = None,
                       inference: dict | None = None) -> dict[str, str]:
    """Per config: "same" where --runtime te gives the reference's rows and findings.
    `module_rows` receives each audited config's (module name, upstream class) rows;
    `inference`, when given, per config whether --runtime te gives the same rows and findings
    with inference off (--no-infer) as on, and how many modules were inferred."""
    from qaudit.commands.check import audit_config, load_inputs
    from qaudit.errors import EnvironmentProblem, InputError
    from qaudit.run.options import AuditOptions

    out = {}
    for path in paths:
        try:
            config, recipe = load_inputs(path)
            ref = audit_config(config, recipe, AuditOptions(steps=1, microbatches=2,
                                                              runtime="reference"))
            te = audit_config(config, recipe, AuditOptions(steps=1, microbatches=2, runtime="te"))
            off = (audit_config(config, recipe, AuditOptions(steps=1, microbatches=2, runtime="te",
                                                              te_infer=False))
                   if inference is not None else None)
        except InputError as exc:
            out[path] = f"refused: {str(exc).splitlines()[0]}"
            continue
        except EnvironmentProblem as exc:  # the te runtime cannot run it here: said why
            out[path] = f"not run on te: {str(exc).splitlines()[0]}"
            continue
        except Exception as exc:  # noqa: BLE001 - reported as a difference
            out[path] = f"DIFFERENCE: te crashed: {type(exc).__name__}: {exc}"
            continue
        if module_rows is not None:
            module_rows[path] = [(row.name, row.type) for row in ref.modules]
        a, b = _comparable(ref), _comparable(te)
        if off is not None:
            # TE's code for every module against one per class (qaudit/runtime/te_infer.py).
            same = _comparable(off) == b
            inferred = (te.te_inference or {}).get("modules_inferred", 0)
            inference[path] = ("same" if same else "DIFFERENCE: inference on and off differ") \
                + f"; {inferred} modules inferred"
        if a == b:
            out[path] = "same"
        else:
            diffs = [f"{x} != {y}" for x, y in zip(a["rows"], b["rows"]) if x != y][:3]
            diffs += [f"findings {sorted(set(a['findings']) ^ set(b['findings']))[:3]}"]
            out[path] = "DIFFERENCE: " + "; ".join(diffs)
    return out


SHAPE_RECIPES = (Quant("fp8", "delayed"), Quant("fp8", "tensorwise"), Quant("fp8", "mxfp8"),
                 Quant("fp8", "blockwise"), Quant("fp4", "nvfp4"))
# Hand-made shapes (M, K, N), most of them bad for some recipe: rows % 8 / 16 / 32, columns
# % 16 / 32, out_features % 8 / 16 / 32, and DeepSeek-V3's 576-wide kv_down_proj.
BAD_SHAPES = ((4096, 1024, 1024), (4100, 1024, 1024), (4104, 1024, 1024), (4112, 1024, 1024),
              (4096, 1000, 1024), (4096, 1032, 1024), (4096, 1040, 1024), (4096, 1024, 1004),
              (4096, 1024, 1000), (4096, 1024, 1048), (4112, 1048, 1032), (4096, 7168, 576),
              (2050, 7168, 4608))


def shape_cases(runtime, version: str, module_rows: dict[str, list[tuple[str, str]]]) -> dict:
    """TE's own Python shape checks against qaudit's table (issue 24): every TE module of each
    config in `module_rows` (path -> its audit's (name, upstream class) rows) at its real
    widths on one rank, in every recipe, and BAD_SHAPES for each module kind; the
    disagreements, how many answers TE gave and how many were refusals."""
    from qaudit.commands.check import load_inputs
    from qaudit.plan.shapes import (COLUMN, GemmShape, Parallel, check_gemm_shape, gemm_shape,
                                    parallel_of)
    from qaudit.plan.te_alignment import GROUPED, LAYERNORM_LINEAR, LINEAR
    from qaudit.runtime.te_shapes import shape_checks_for

    checks = shape_checks_for(runtime)
    cases = []  # (config, shape, parallel)
    for path, rows in module_rows.items():
        config = load_inputs(path)[0]
        parallel = parallel_of(config)
        if parallel is None:
            continue
        for name, upstream_class in rows:
            shape = gemm_shape(config, name, upstream_class, parallel)
            if shape is not None:
                cases.append((config, shape, parallel))
    plain = load_inputs(str(REPO / "configs" / "gpt-small-bf16.yaml"))[0]
    for (m, k, n), kind in itertools.product(BAD_SHAPES, (LINEAR, LAYERNORM_LINEAR, GROUPED)):
        cases.append((plain, GemmShape("hand-made", kind, COLUMN, m, m, k, n), Parallel()))
        if kind == GROUPED:
            cases.append((plain, GemmShape("hand-made", kind, COLUMN, None, None, k, n,
                                           per_expert=True), Parallel()))
    answers = refusals = 0
    disagreements = set()
    for (config, shape, parallel), quant, backward in itertools.product(
            cases, SHAPE_RECIPES, (True, False)):
        problems = check_gemm_shape(config, shape, quant, version, parallel, backward=backward)
        found = checks.answers(shape, quant, backward)
        answers += len(found)
        refusals += sum(bool(a.refused) for a in found)
        for line in checks.disagreements(shape, quant, backward, problems):
            disagreements.add(f"{shape.kind} {shape.text()} {quant.recipe}: {line}")
    return {"shapes": len(cases), "answers": answers, "refusals": refusals,
            "checks": sorted({a.check for (_, s, _), q in itertools.product(cases, SHAPE_RECIPES)
                              for a in checks.answers(s, q, True)}),
            "disagreements": sorted(disagreements)}


def main(argv: list[str]) -> int:
    # --infer-both: each config also on --runtime te with inference off (one or two releases
    # in CI, not every one: the off runs are the slow ones).
    both = "--infer-both" in argv
    argv = [a for a in argv if a != "--infer-both"]
    out_path, configs = argv[0], argv[1:]
    runtime = select_runtime("te", "cpu")
    version = runtime.api.version
    from qaudit.plan.upstream.te import te_behaviour

    count, differences, not_stood_in, before = module_cases(runtime, te_behaviour(version))
    rows: dict[str, list[tuple[str, str]]] = {}
    inference: dict[str, str] | None = {} if both else None
    compared = config_differences(configs, rows, inference) if configs else {}
    bundled = {path: found for path, found in rows.items() if Path(path).parent == REPO / "configs"}
    result = {"te": version, "runtime": runtime.description, "cases": count,
              "differences": differences, "not_stood_in": not_stood_in,
              "differences_without_module_kind_fact": before, "configs": compared,
              "inference": inference,
              "shape_checks": shape_cases(runtime, version, bundled)}
    Path(out_path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
