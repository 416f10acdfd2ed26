"""Runtime parity: the same config audited by two runtimes must give the same table.

Used by tests/test_gpu.py and scripts/gpu-check. A "side" is one runtime on one device:
`reference-cpu`, `reference-cuda` or `te`. Compared per module: every table column (precision,
recipe, tracked, accumulation, calls, verdict) and, with --verify, the gradient outcome; plus
the findings (rule, severity, module) and the exit code.

Gradient outcome, from --verify's grad_rel_error against float64 autograd (the reference
runtime with fake quantization): `lost` for a QA001 module whose error is above verify's
CONFIRM_THRESHOLD (the finding is "confirmed"), `kept` for any module at or below it, `noisy`
for a module without QA001 above it. Quantized configs are noisy on the reference runtime
itself: a float32 run and its float64 reference round differently at FP8 boundaries and the
differences grow with depth (measured on the bundled configs: median 4% for DeepSeek-V3
blockwise, 18% for the 126-layer Llama-3.1-405B tensorwise). So sides differ when a QA001
module is `lost` on one and not the other, or when a module `kept` on one side has an error
above LOST_THRESHOLD on the other; `noisy` against `noisy` or `kept` below that is not a
difference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from qaudit.errors import EnvironmentProblem

ROW_FIELDS = ("precision", "recipe", "tracked", "accumulation", "calls_per_microbatch",
              "nograd_calls_per_microbatch", "verdict")
LOST_THRESHOLD = 0.1
SIDES = {"reference-cpu": ("reference", "cpu"), "reference-cuda": ("reference", "cuda"),
         "te": ("te", None)}


@dataclass
class Side:
    name: str
    runtime: str = ""  # the report's runtime description
    exit_code: int | None = None
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[tuple[str, str, str | None]] = field(default_factory=list)
    outcomes: dict[str, str | None] = field(default_factory=dict)
    errors: dict[str, float | None] = field(default_factory=dict)
    seconds: float = 0.0
    unavailable: str | None = None  # EnvironmentProblem message: this side could not run

    def summary(self) -> str:
        if self.unavailable is not None:
            return "n/a"
        rules = sorted({rule for rule, severity, _ in self.findings if severity != "info"})
        lost = sum(1 for o in self.outcomes.values() if o == "lost")
        text = f"exit {self.exit_code}" + (f" {','.join(rules)}" if rules else "")
        return text + (f" lost:{lost}" if self.outcomes else "")

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "exit_code": self.exit_code, "seconds": round(self.seconds, 2),
                "unavailable": self.unavailable, "rows": self.rows,
                "findings": [list(f) for f in self.findings], "grad_rel_error": self.errors,
                "gradient_outcome": self.outcomes}


def outcome(error: float | None, qa001: bool) -> str | None:
    from qaudit.judge.verify import CONFIRM_THRESHOLD

    if error is None:
        return None
    if error <= CONFIRM_THRESHOLD:
        return "kept"
    return "lost" if qa001 else "noisy"


def _gradients_differ(a: Side, b: Side, name: str) -> bool:
    oa, ob = a.outcomes.get(name), b.outcomes.get(name)
    if oa is None or ob is None:
        return oa != ob
    if "lost" in (oa, ob):
        return oa != ob
    if oa == "kept" and ob != "kept":
        return (b.errors.get(name) or 0.0) > LOST_THRESHOLD
    if ob == "kept" and oa != "kept":
        return (a.errors.get(name) or 0.0) > LOST_THRESHOLD
    return False


def audit_side(config: str, side: str, *, verify: bool = True, steps: int = 2,
               microbatches: int = 2, policy: str = "config") -> Side:
    """Audit `config` on one side; an EnvironmentProblem (e.g. a recipe this GPU cannot run)
    makes the side unavailable instead of failing."""
    from qaudit.run.options import AuditOptions
    from qaudit.commands.check import audit_files

    runtime, device = SIDES[side]
    options = AuditOptions(runtime=runtime, device=device, verify=verify, steps=steps,
                           microbatches=microbatches, policy=policy)
    result = Side(side)
    if runtime == "te":
        # A setting only the reference runtime models (CUDA graphs, primary quantized weights)
        # is refused by --runtime te with exit 2: there is no te side to compare with.
        from qaudit.commands.inputs import load_inputs
        from qaudit.run.audit import reference_only_settings

        settings = reference_only_settings(*load_inputs(config))
        if settings:
            result.unavailable = (f"--runtime te does not model {', '.join(settings)} "
                                  "(reference runtime only)")
            return result
    start = time.perf_counter()
    try:
        report = audit_files(config, options=options)
    except EnvironmentProblem as exc:
        result.unavailable = str(exc)
        return result
    finally:
        result.seconds = time.perf_counter() - start
    result.runtime = report.runtime
    result.exit_code = report.exit_code()
    result.findings = sorted({(f.rule, f.severity, f.module) for f in report.findings},
                             key=lambda f: (f[0], f[1], f[2] or ""))
    qa001 = {f.module for f in report.findings if f.rule == "QA001"}
    for row in report.modules:
        result.rows[row.name] = {name: getattr(row, name) for name in ROW_FIELDS}
        if verify:
            result.errors[row.name] = row.grad_rel_error
            result.outcomes[row.name] = outcome(row.grad_rel_error, row.name in qa001)
    return result


def differences(a: Side, b: Side, limit: int = 20) -> list[str]:
    """Human-readable differences between two sides that both ran; [] means parity."""
    if a.unavailable is not None or b.unavailable is not None:
        return []
    out: list[str] = []
    if a.exit_code != b.exit_code:
        out.append(f"exit code: {a.name} {a.exit_code}, {b.name} {b.exit_code}")
    for name in sorted(set(a.rows) ^ set(b.rows)):
        out.append(f"{name}: only on {a.name if name in a.rows else b.name}")
    for name, row in a.rows.items():
        other = b.rows.get(name)
        if other is None:
            continue
        for column in ROW_FIELDS:
            if row[column] != other[column]:
                out.append(f"{name}: {column} {a.name}={row[column]!r} {b.name}={other[column]!r}")
        if a.outcomes and b.outcomes and _gradients_differ(a, b, name):
            out.append(f"{name}: gradient {a.name}={a.outcomes.get(name)} "
                       f"(grad_rel_error {a.errors.get(name)}) {b.name}={b.outcomes.get(name)} "
                       f"(grad_rel_error {b.errors.get(name)})")
    only_a = sorted(set(a.findings) - set(b.findings), key=str)
    only_b = sorted(set(b.findings) - set(a.findings), key=str)
    out += [f"finding only on {a.name}: {f}" for f in only_a]
    out += [f"finding only on {b.name}: {f}" for f in only_b]
    if len(out) > limit:
        out = out[:limit] + [f"... and {len(out) - limit} more"]
    return out


# -- scripts/gpu-check ------------------------------------------------------------------------

def environment() -> dict[str, Any]:
    import torch

    from qaudit.runtime import te_unavailable_reason

    env: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                           "cuda_available": torch.cuda.is_available(), "gpu": None,
                           "compute_capability": None, "transformer_engine": None, "te_reason": ""}
    if env["cuda_available"]:
        major, minor = torch.cuda.get_device_capability()
        env["gpu"], env["compute_capability"] = torch.cuda.get_device_name(), f"{major}.{minor}"
    env["te_reason"] = te_unavailable_reason()
    if not env["te_reason"]:
        import transformer_engine

        env["transformer_engine"] = str(getattr(transformer_engine, "__version__", "?"))
    return env


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(
        prog="gpu-check", description="Audit every bundled config on the te runtime and the "
        "reference runtime (CPU and CUDA); print a parity table; exit 1 on any difference, "
        "3 when CUDA or Transformer Engine is missing.")
    parser.add_argument("configs", nargs="*", help="configs to audit (default: configs/*.yaml)")
    parser.add_argument("--sides", default="reference-cpu,reference-cuda,te",
                        help="comma-separated: reference-cpu, reference-cuda, te "
                             "(default: all three; the first reference one is the baseline)")
    parser.add_argument("--no-verify", action="store_true", help="skip --verify (faster)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--json", help="write results here (default: $OUT/gpu-check.json "
                        "when OUT is set)")
    args = parser.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        parser.error(f"unknown side(s) {unknown}; choose from {', '.join(SIDES)}")
    configs = args.configs or sorted(str(p.relative_to(repo)) if p.is_relative_to(repo) else str(p)
                                     for p in (repo / "configs").glob("*.yaml"))
    json_path = args.json or (os.path.join(os.environ["OUT"], "gpu-check.json")
                              if os.environ.get("OUT") else None)

    env = environment()
    result: dict[str, Any] = {"schema": "qaudit-gpu-check/1", "env": env, "sides": sides,
                              "verify": not args.no_verify, "wgrad_rule": None, "configs": [],
                              "problems": [], "exit_code": 0}
    print(f"torch {env['torch']} (CUDA build {env['torch_cuda']}); GPU: "
          f"{env['gpu'] or 'none'}{' sm' + env['compute_capability'] if env['gpu'] else ''}; "
          f"Transformer Engine: {env['transformer_engine'] or 'unavailable: ' + env['te_reason']}")
    if not env["cuda_available"] and any(s != "reference-cpu" for s in sides):
        result["problems"] = ["no CUDA device is visible"]
        if "te" in sides and env["te_reason"]:
            result["problems"].append(f"te: {env['te_reason']}")
        result["exit_code"] = 3
        print("cannot check: " + "; ".join(result["problems"]))
        _write(json_path, result)
        return 3
    if "te" in sides and env["te_reason"]:
        # Still check what can be checked (reference on CUDA against CPU); exit 3 at the end.
        result["problems"].append(f"te not checked: {env['te_reason']}")
        sides = [s for s in sides if s != "te"]
        result["sides"] = sides
        print(result["problems"][-1])
        if not sides:
            result["exit_code"] = 3
            _write(json_path, result)
            return 3

    code = 0
    if "te" in sides:
        from qaudit.runtime.te import MODULE_KINDS, TERuntime

        runtime = TERuntime()
        diffs = runtime.wgrad_rule_differences()
        result["wgrad_rule"] = {
            "kinds": {kind: {f"fuse={k[0]} flag={k[1]} overwrite={k[2]}": v
                             for k, v in runtime.wgrad_rule(kind).items()} for kind in MODULE_KINDS},
            "differences": diffs}
        lines = [f"{kind}: {line}" for kind, found in diffs.items() for line in found]
        # overwrite_main_grad exists since TE 2.9 (docs/semantics.md §1.3): an older TE ignoring it
        # is expected, and only matters for Megatron-FSDP configs; reported, not a failure.
        bad = [line for line in lines if "overwrite_main_grad=True" not in line]
        print("TE wgrad rule, measured on Linear/LayerNormLinear/GroupedLinear: "
              + ("as documented (docs/semantics.md §1.2-1.3)" if not lines else
                 "DIFFERS from docs/semantics.md" if bad else
                 "as documented, except overwrite_main_grad (honoured by TE 2.9+ only)"))
        for line in lines:
            print(f"  {line}")
        if bad:
            code = 1

    baseline = next((s for s in sides if s.startswith("reference")), sides[0])
    table = []
    for config in configs:
        results = {}
        for name in sides:
            results[name] = audit_side(config, name, verify=not args.no_verify, steps=args.steps,
                                       microbatches=args.microbatches)
            print(f"  {config} [{name}] {results[name].summary()} in {results[name].seconds:.1f}s",
                  flush=True)
        entry: dict[str, Any] = {"config": config, "sides": {n: r.to_dict() for n, r in results.items()},
                                 "differences": {}, "status": "ok"}
        notes = []
        for name in sides:
            if name == baseline:
                continue
            found = differences(results[baseline], results[name])
            if found:
                entry["differences"][name] = found
                entry["status"] = "DIFF"
            if results[name].unavailable is not None:
                notes.append(f"{name} n/a")
        if results[baseline].unavailable is not None:
            entry["status"] = "ERROR"
            notes.append(f"{baseline}: {results[baseline].unavailable}")
        if entry["status"] != "ok":
            code = 1
        result["configs"].append(entry)
        table.append([Path(config).stem] + [results[n].summary() for n in sides]
                     + [entry["status"] + (f" ({', '.join(notes)})" if notes else "")])
    print()
    print(_table(table, ["config"] + sides + ["parity"]))
    for entry in result["configs"]:
        for name, found in entry["differences"].items():
            print(f"\n{entry['config']}: {baseline} vs {name}")
            for line in found:
                print(f"  {line}")
        for name, side in entry["sides"].items():
            if side["unavailable"]:
                print(f"\n{entry['config']} [{name}] not run: {side['unavailable']}")
    if code == 0 and result["problems"]:
        code = 3
    result["exit_code"] = code
    _write(json_path, result)
    verdict = ("DIFFERENCES found" if code == 1 else
               "parity on every config checked, but " + "; ".join(result["problems"]) if code == 3
               else "parity on every config")
    print(f"\ngpu-check: {verdict}" + (f"; results in {json_path}" if json_path else ""))
    return code


def _write(path: str | None, result: dict[str, Any]) -> None:
    if not path:
        return
    import json
    import os

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2, default=str)


if __name__ == "__main__":
    raise SystemExit(main())
