"""The guard's verdict: the watched steps' records from every rank, as rows and the judge's
own rules, in qaudit's report. Every rank computes the same verdict from the same gathered
data; rank 0 speaks (stderr, the report, the launcher's result file)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import pickle
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

from qaudit.errors import printable
from qaudit.judge.report import Finding, Report
from qaudit.judge.rules import judge
from qaudit.run.observe import NumericCheck, Observation
from qaudit.run.observed import GUARD_RULES, facts_of

# One file per watched process, never reused: a later process of the job with the same rank
# (a retry, a second phase) leaves its own next to it, and every verdict counts.
RESULT_FILE = "result-rank{rank}-pid{pid}-{n}.json"


class PeerLost(RuntimeError):
    """The ranks' gather failed: another rank of the job is gone (it crashed, or was ended)."""


@dataclass
class Outcome:
    stop: bool
    report: Report


def merged_observation(parts: list[dict[str, Any]]) -> Observation:
    """Every rank's observation as one. A module several ranks hold (data- or tensor-parallel
    replicas) keeps one rank's records: the lowest rank that saw it lose gradient, else the
    lowest rank that has it."""
    lost = [{r.module for r in part["observation"].calls if r.lossy}
            | {s.module for s in part["observation"].strays if s.lossy}
            | {m.module for m in part["observation"].missing} for part in parts]
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
        merged.missing.extend(m for m in seen.missing if m.module in mine)
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
    failed = [p["failed"] for p in parts if p.get("failed")]
    parts = [p for p in parts if p.get("observation") is not None]  # a failed rank has none
    if not parts:
        raise RuntimeError("the guard failed on every rank: " + "; ".join(failed))
    seen = merged_observation(parts)
    first = parts[0]
    facts = facts_of(seen, first["config"], first.get("rearms"), first.get("policy"))
    _launch_syntax(first["config"], first.get("launch"))
    findings = judge(facts, only=GUARD_RULES)
    findings = _with_numbers(findings, seen.numeric)
    from qaudit.commands.check import _sorted_findings, _with_verdicts

    findings = _sorted_findings(findings, facts.rows)
    report = Report(runtime=f"guard ({first.get('te', 'TE')})", policy=facts.policy.name,
                    config="<live run>", recipe=None, steps=seen.steps,
                    microbatches=_microbatches(seen), modules=_with_verdicts(facts.rows, findings),
                    findings=findings, megatron=first.get("megatron"),
                    te=_te_entry(first))
    report.guard = {
        "mode": options.mode, "steps_watched": seen.steps, "ranks": len(parts),
        "modules_observed": len(seen.classes), "calls_observed": len(seen.calls),
        "notes": sorted({note for part in parts for note in part.get("notes", [])}),
        **({"numeric": [asdict(n) for n in seen.numeric]} if options.numeric else {}),
        **({"failed": failed} if failed else {}),
    }
    return report


def _te_entry(part: dict[str, Any]) -> dict[str, Any]:
    """The TE the run imported (its own `__version__`), as `qaudit check`'s `te` says one."""
    return {"source": "installed", "version": part.get("te_version") or "none imported",
            "label": part.get("te", "")}


def _launch_syntax(config: Any, launch: str | None) -> None:
    """The fix line in the launch's own syntax: Megatron-LM's flags where its argument parser
    ran, a Bridge `a.b=c` override where Bridge ran, else the config field by name."""
    if launch not in ("flags", "bridge") or config.source is not None:
        return
    from pathlib import Path

    from qaudit.load.config import ConfigSource
    from qaudit.load.yamlio import YamlMap

    config.source = ConfigSource(file="<live run>", path=Path("<live run>"), mapping=YamlMap(),
                                 argv=[] if launch == "flags" else None,
                                 origin="bridge" if launch == "bridge" else None)


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
    """Every rank's part, by rank. Only the collectives' own failures are a lost peer: a
    local failure (pickling this rank's part) is the guard's own, said as such."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [part]
    payload = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
    parts = [pickle.loads(data) for data in _all_gather_bytes(payload)]
    return sorted(parts, key=lambda p: p["rank"])


def _all_gather_bytes(payload: bytes) -> list[bytes]:
    """torch.distributed.all_gather_object without numpy (it decodes with `Tensor.numpy()`,
    and torch does not require numpy: a job without it failed every rank's gather, which
    was reported as another rank having ended): sizes first, then the padded bytes."""
    dist = torch.distributed
    world = dist.get_world_size()
    device = _collective_device()
    mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else \
        torch.empty(0, dtype=torch.uint8)
    try:
        sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64, device=device))
        longest = max(int(size.item()) for size in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8, device=device)
        padded[:len(payload)] = mine.to(device)
        gathered = [torch.zeros(longest, dtype=torch.uint8, device=device)
                    for _ in range(world)]
        dist.all_gather(gathered, padded)
    except Exception as exc:  # noqa: BLE001 - whatever the backend raises for a lost peer
        raise PeerLost(f"the ranks' gather failed ({type(exc).__name__}: "
                       f"{' '.join(str(exc).split())[:300]}): another rank of the job ended "
                       "first") from None
    return [_bytes_of(tensor.cpu(), int(size.item())) for tensor, size in zip(gathered, sizes)]


def _bytes_of(tensor: Any, size: int) -> bytes:
    contiguous = tensor.contiguous()
    return ctypes.string_at(contiguous.data_ptr(), size) if size else b""


def _collective_device() -> Any:
    """Where the default group's backend takes its tensors: NCCL only CUDA ones."""
    dist = torch.distributed
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def several_ranks() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _failed_part(failed: str | None) -> dict[str, Any]:
    return {"rank": _rank(), "failed": failed or "the guard failed on this rank"}


def join_failed(session: Any) -> None:
    """A rank whose guard failed before the ranks' gather (--mode warn) still takes its part in
    it, and in the barrier after: the other ranks wait there and would wait forever."""
    session.gathered = True
    gather(_failed_part(session.failed))
    _wait_for_every_rank()


def conclude(session: Any) -> Outcome:
    own: Exception | None = None
    try:
        part = summary(session)
    except Exception as exc:  # noqa: BLE001 - raised below, after the gather the others wait in
        own, part = exc, _failed_part(printable(f"{type(exc).__name__}: {exc}"))
    session.gathered = True
    parts = gather(part)
    if own is not None:
        _wait_for_every_rank()
        raise own
    report = build_report(parts, session.options)
    stop = bool(report.exit_code(session.options.fail_on))
    try:
        said = _speak(report, stop, session.options) if _rank() == 0 else []
        _write_result(session.options, report, stop, said)
    finally:
        _wait_for_every_rank()  # also when speaking failed: no rank is left waiting
    return Outcome(stop=stop, report=report)


def _wait_for_every_rank() -> None:
    """No rank leaves before rank 0 has spoken and written the report: a launcher such as
    torchrun ends the other workers as soon as one exits with the stop code, which would cut
    rank 0 off mid-write."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except Exception as exc:  # noqa: BLE001 - a lost peer, as in gather()
            raise PeerLost(f"the ranks' barrier failed ({type(exc).__name__}): another rank "
                           "of the job ended first") from None


def record_failure(session: Any) -> None:
    """The guard failed on this rank: say so, and leave the launcher a result saying it."""
    print(f"qaudit guard: the guard itself failed on rank {_rank()}: {session.failed}; "
          + ("the job is stopped (--mode stop cannot vouch for this step)"
             if session.options.mode == "stop" else "the job runs on unguarded (--mode warn)"),
          file=sys.stderr)
    _write_file(session.options, {"rank": _rank(), "failed": session.failed, "stop": False,
                                  "peer_lost": bool(getattr(session, "peer_lost", False))})


WIDTH = 100


def verdict_text(report: Report, stop: bool, options: Any) -> list[str]:
    """The stop's (or the clean run's) words: the findings grouped as `qaudit check`'s verdict
    groups them, each with its fix in the launch's own syntax, the rule's explanation, and a
    last line that sums it up."""
    from qaudit.render.common import group_findings, summary_counts
    from qaudit.render.table import verdict_lines

    watched = (f"{report.guard['steps_watched']} watched step(s), "
               f"{report.guard['modules_observed']} modules observed on "
               f"{report.guard['ranks']} rank(s)")
    lines = []
    failing = [f for f in report.findings if f.severity != "info"]
    if failing:
        lines += [line.replace("--show-info prints them", "the --report lists them")
                  for line in verdict_lines(group_findings(report.findings),
                                            summary_counts(report), WIDTH, show_info=False)]
        rules = sorted({f.rule for f in failing})
        lines.append("explain: " + "; ".join(f"qaudit explain {rule}" for rule in rules))
    if stop and options.mode == "stop":
        lines.append(f"stopped before the optimizer step: {summary_counts(report)} in {watched}")
    elif stop:
        lines.append(f"{summary_counts(report)} in {watched}; running on (--mode warn)")
    else:
        lines.append(f"clean: {summary_counts(report)} in {watched}")
    return [f"qaudit guard: {printable(line)}" for line in lines]


def _speak(report: Report, stop: bool, options: Any) -> list[str]:
    """Rank 0's words. Under `qaudit guard` they are said again after the job's own output
    ends (the launcher prints them last), so here the process says one line; from the Python
    API it says all of them, and writes the report."""
    lines = verdict_text(report, stop, options)
    if options.results:
        print(lines[-1] + "; the findings follow when the job has ended"
              if len(lines) > 1 else lines[-1], file=sys.stderr)
    else:
        print("\n".join(lines), file=sys.stderr)
        if options.report:
            from qaudit.files.outputs import write_file

            stopped = stop and options.mode == "stop"
            write_file(options.report, json.dumps(report_dict(report, stopped), indent=2)
                       + "\n")
    return lines


def report_dict(report: Report, stopped: bool = False) -> dict[str, Any]:
    """`exit_code`: the process's (EXIT_STOPPED on a stop; the launcher sets the job's)."""
    from qaudit.guard.codes import EXIT_STOPPED

    return {**report.to_dict(), "exit_code": EXIT_STOPPED if stopped else report.exit_code()}


def _write_result(options: Any, report: Report, stop: bool, said: list[str]) -> None:
    """Every rank's result carries the verdict all ranks agreed on (a node without rank 0
    decides from it); rank 0's also the report and its words."""
    data: dict[str, Any] = {"rank": _rank(), "stop": stop and options.mode == "stop",
                            "findings": stop, "steps": report.guard["steps_watched"]}
    if _rank() == 0:
        data["report"] = report_dict(report, data["stop"])
        data["said"] = "\n".join(said or [])
    _write_file(options, data)


def _write_file(options: Any, data: dict[str, Any]) -> None:
    """Into the launcher's private directory (absent when the guard runs from Python), under
    a name no other process has used (O_EXCL): nothing a later process writes replaces it."""
    if not options.results:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for n in range(1000):
        path = os.path.join(options.results,
                            RESULT_FILE.format(rank=_rank(), pid=os.getpid(), n=n))
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        return
    raise OSError(f"no free result file name in {options.results}")


def _rank() -> int:
    from qaudit.guard.context import rank

    return rank()
