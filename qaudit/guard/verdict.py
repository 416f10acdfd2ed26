"""The guard's verdict: the watched steps' records from every rank, as rows and the judge's
own rules, in qaudit's report. Every rank computes the same verdict from the same gathered
data; rank 0 speaks (stderr, the report, the launcher's result file)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

from qaudit.errors import printable
from qaudit.judge.report import Finding, Report
from qaudit.judge.rules import judge
from qaudit.run.observe import NumericCheck, Observation
from qaudit.run.observed import GUARD_RULES, facts_of

RESULT_FILE = "result-rank{rank}.json"


@dataclass
class Outcome:
    stop: bool
    report: Report


def merged_observation(parts: list[dict[str, Any]]) -> Observation:
    """Every rank's observation as one. A module several ranks hold (data- or tensor-parallel
    replicas) keeps one rank's records: the lowest rank that saw it lose gradient, else the
    lowest rank that has it."""
    lost = [{r.module for r in part["observation"].calls if r.lossy}
            | {s.module for s in part["observation"].strays if s.lossy} for part in parts]
    owner: dict[str, int] = {}
    for index, part in enumerate(parts):
        for name in part["observation"].classes:
            if name not in owner or (name in lost[index] and name not in lost[owner[name]]):
                owner[name] = index
    merged = Observation()
    for index, part in enumerate(parts):
        seen = part["observation"]
        mine = {name for name in seen.classes if owner[name] == index}
        merged.calls.extend(r for r in seen.calls if r.module in mine)
        merged.strays.extend(s for s in seen.strays if s.module in mine)
        merged.numeric.extend(n for n in seen.numeric if n.module in mine)
        merged.steps = max(merged.steps, seen.steps)
    first = {}
    for part in parts:  # model order: the first rank's, then what only later ranks hold
        seen = part["observation"]
        for name in seen.classes:
            first.setdefault(name, seen)
    for name, seen in first.items():
        chosen = parts[owner[name]]["observation"]
        merged.classes[name] = chosen.classes[name]
        merged.frozen[name] = chosen.frozen.get(name, False)
        merged.overwrite_main_grad[name] = chosen.overwrite_main_grad.get(name, False)
        if name in chosen.bindings:
            merged.bindings[name] = chosen.bindings[name]
        if name in chosen.te_modules:
            merged.te_modules.append(name)
    return merged


def build_report(parts: list[dict[str, Any]], options: Any) -> Report:
    seen = merged_observation(parts)
    first = parts[0]
    facts = facts_of(seen, first["config"], first.get("rearms"), first.get("policy"))
    findings = judge(facts, only=GUARD_RULES)
    findings = _with_numbers(findings, seen.numeric)
    from qaudit.commands.check import _sorted_findings, _with_verdicts

    findings = _sorted_findings(findings, facts.rows)
    report = Report(runtime=f"guard ({first.get('te', 'TE')})", policy=facts.policy.name,
                    config="<live run>", recipe=None, steps=seen.steps,
                    microbatches=_microbatches(seen), modules=_with_verdicts(facts.rows, findings),
                    findings=findings, megatron=first.get("megatron"), te=None)
    report.guard = {
        "mode": options.mode, "steps_watched": seen.steps, "ranks": len(parts),
        "modules_observed": len(seen.classes), "calls_observed": len(seen.calls),
        "notes": sorted({note for part in parts for note in part.get("notes", [])}),
        **({"numeric": [asdict(n) for n in seen.numeric]} if options.numeric else {}),
        **({"failed": [p["failed"] for p in parts if p.get("failed")]}
           if any(p.get("failed") for p in parts) else {}),
    }
    return report


def _microbatches(seen: Observation) -> int:
    return max((r.microbatch for r in seen.calls), default=-1) + 1


def _with_numbers(findings: list[Finding], numeric: list[NumericCheck]) -> list[Finding]:
    """--numeric: each loss finding states what the overwriting write discarded."""
    if not numeric:
        return findings
    lost: dict[str, list[NumericCheck]] = {}
    for check in numeric:
        if check.decision == "overwrite" and check.lost > 0:
            lost.setdefault(check.module, []).append(check)
    out = []
    for finding in findings:
        checks = lost.get(finding.module or "")
        if checks and finding.rule in ("QA001", "QA007"):
            worst = max(checks, key=lambda c: c.lost)
            finding = dataclasses.replace(
                finding, evidence="confirmed",
                message=finding.message + (
                    f"; measured (--numeric): in step {worst.step + 1}, microbatch "
                    f"{worst.microbatch}, call {worst.call}'s backward discarded a main_grad of "
                    f"norm {worst.lost:.4g} and left only its own gradient, of norm "
                    f"{worst.own:.4g} (residual {worst.residual:.1e})"))
        out.append(finding)
    return out


def summary(session: Any) -> dict[str, Any]:
    """This rank's part: plain data and qaudit's own dataclasses."""
    from qaudit.guard import context

    return {"rank": _rank(), "observation": session.observer.seen, "notes": list(session.notes),
            "failed": session.failed, **context.describe(session)}


def gather(part: dict[str, Any]) -> list[dict[str, Any]]:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [part]
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    return sorted(parts, key=lambda p: p["rank"])


def conclude(session: Any) -> Outcome:
    parts = gather(summary(session))
    report = build_report(parts, session.options)
    stop = bool(report.exit_code(session.options.fail_on))
    try:
        if _rank() == 0:
            _speak(report, stop, session.options)
        _write_result(session.options, report, stop)
    finally:
        _wait_for_every_rank()  # also when speaking failed: no rank is left waiting
    return Outcome(stop=stop, report=report)


def _wait_for_every_rank() -> None:
    """No rank leaves before rank 0 has spoken and written the report: a launcher such as
    torchrun ends the other workers as soon as one exits with the stop code, which would cut
    rank 0 off mid-write."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def record_failure(session: Any) -> None:
    """The guard failed on this rank: say so, and leave the launcher a result saying it."""
    print(f"qaudit guard: the guard itself failed on rank {_rank()}: {session.failed}; "
          + ("the job is stopped (--mode stop cannot vouch for this step)"
             if session.options.mode == "stop" else "the job runs on unguarded (--mode warn)"),
          file=sys.stderr)
    _write_file(session.options, {"rank": _rank(), "failed": session.failed, "stop": False})


def _speak(report: Report, stop: bool, options: Any) -> None:
    counts = report.counts()
    what = (f"{counts.get('error', 0)} error(s), {counts.get('warning', 0)} warning(s) in "
            f"{report.guard['steps_watched']} watched step(s), {report.guard['modules_observed']} "
            "modules observed")
    for finding in report.findings:
        if finding.severity == "info":
            continue
        line = printable(f"{finding.rule} {finding.severity} {finding.message}")
        print(f"qaudit guard: {' '.join(line.split())}", file=sys.stderr)
    if stop and options.mode == "stop":
        print(f"qaudit guard: stopped before the optimizer step: {what}", file=sys.stderr)
    elif stop:
        print(f"qaudit guard: {what}; running on (--mode warn)", file=sys.stderr)
    else:
        print(f"qaudit guard: clean: {what}", file=sys.stderr)
    if options.report:
        from qaudit.files.outputs import write_file

        write_file(options.report, json.dumps(report_dict(report), indent=2) + "\n")


def report_dict(report: Report) -> dict[str, Any]:
    return {**report.to_dict(), "exit_code": report.exit_code()}


def _write_result(options: Any, report: Report, stop: bool) -> None:
    data: dict[str, Any] = {"rank": _rank(), "stop": stop and options.mode == "stop",
                            "findings": stop}
    if _rank() == 0:
        data["report"] = report_dict(report)
    _write_file(options, data)


def _write_file(options: Any, data: dict[str, Any]) -> None:
    """Into the launcher's private directory (absent when the guard runs from Python)."""
    if not options.results:
        return
    path = os.path.join(options.results, RESULT_FILE.format(rank=_rank()))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path, flags, 0o600), "w") as handle:
        json.dump(data, handle)


def _rank() -> int:
    from qaudit.guard.context import rank

    return rank()
