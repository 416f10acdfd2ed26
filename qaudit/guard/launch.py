"""`qaudit guard [OPTIONS] -- COMMAND...`: run the user's launch command unchanged, with the
guard started in every Python process that imports Megatron or TE, and exit with its exit
code, except that a stop by the guard is EXIT_STOPPED (docs/guard.md).

How the guard gets in: a private directory holding only a `sitecustomize.py` goes first on
PYTHONPATH (Python runs it at every start, torchrun's workers included; it only arms an import
hook, then runs the job's own sitecustomize); another holding only a link to the qaudit
package goes last, so a job whose Python lacks qaudit still finds it and nothing else. The
options travel in the environment; each watched process leaves its result in the private
directory under a name of its own, which is removed after.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qaudit.errors import InputError, printable
from qaudit.guard.child import ENVIRONMENT
from qaudit.guard.job import run_job
from qaudit.guard.codes import EXIT_GUARD_FAILED, EXIT_STOPPED
from qaudit.guard.options import GuardOptions

SITE = Path(__file__).resolve().parent / "site"
PACKAGE = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
    code: int
    message: str
    report: dict | None
    said: str = ""  # rank 0's verdict, as it printed it: said again after the job's output


def run(command: list[str], options: GuardOptions, cpu: bool = False) -> Outcome:
    if not command:
        raise InputError("qaudit guard: give the launch command after --, e.g. "
                         "qaudit guard -- torchrun --nproc-per-node 8 pretrain_gpt.py ...")
    executable = shutil.which(command[0])
    if executable is None:
        raise InputError(f"qaudit guard: cannot run {printable(command[0])!r}: no such "
                         "command or file")
    private = Path(tempfile.mkdtemp(prefix="qaudit-guard-"))
    try:
        results = private / "results"
        package = private / "package"
        results.mkdir(mode=0o700)
        package.mkdir(mode=0o700)
        (package / "qaudit").symlink_to(PACKAGE, target_is_directory=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = job_pythonpath(env.get("PYTHONPATH"), str(SITE), str(package))
        env[ENVIRONMENT] = json.dumps({
            "mode": options.mode, "steps": options.steps, "numeric": options.numeric,
            "fail_on": options.fail_on, "cpu": cpu, "results": str(results),
            "report": os.path.abspath(options.report) if options.report else None})
        env["QAUDIT_GUARD_RESULTS"] = str(results)
        code = run_job([executable, *command[1:]], env)
        outcome = decide(code, read_results(results), options)
        if options.report and outcome.report is not None:
            _write_report(options.report, outcome)
        return outcome
    finally:
        shutil.rmtree(private, ignore_errors=True)


def job_pythonpath(current: str | None, site: str, package: str) -> str:
    """The guard's site directory first, qaudit's package link last, and every entry the job
    had in between as it had it: an empty entry (the working directory, as
    `export PYTHONPATH=$PYTHONPATH:/opt/x` leaves it) included."""
    entries = current.split(os.pathsep) if current else []
    return os.pathsep.join([site, *entries, package])


def read_results(results: Path) -> list[dict]:
    found = []
    for path in sorted(results.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.name.startswith("start-failed-"):
            found.append({"failed": text, "start": True})
            continue
        try:
            found.append(json.loads(text))
        except json.JSONDecodeError:
            found.append({"failed": f"unreadable result {path.name}"})
    return found


def decide(code: int, results: list[dict], options: GuardOptions) -> Outcome:
    """The exit code and the last line, from the job's code and every watched process's
    result. Each rank of a watched step leaves the verdict all ranks agreed on, so a node
    whose ranks do not include rank 0 decides as rank 0's node does."""
    report = next((r["report"] for r in results if "report" in r), None)
    said = next((r["said"] for r in results if r.get("said")), "")
    watched = [r for r in results if "findings" in r]
    # A guard that lost its peers in the gather because a rank of the job died: the job's
    # crash, reported as the job's exit code.
    failures = [r["failed"] for r in results if r.get("failed")
                and not (r.get("peer_lost") and code != 0)]
    interrupted = _signal_name(code)
    if any(r.get("stop") for r in results):
        return Outcome(EXIT_STOPPED, "the guard stopped the job before the optimizer step "
                       f"(exit {EXIT_STOPPED})", report, said)
    if failures and options.mode == "stop":
        return Outcome(EXIT_GUARD_FAILED, f"the guard failed: {failures[0]}", report, said)
    if failures:
        return Outcome(code, f"the guard failed (the job ran on, --mode warn): {failures[0]}",
                       report, said)
    if not watched:
        words = (f"the guard saw no completed watched step ({options.steps} asked): "
                 "nothing was checked")
        if interrupted:
            return Outcome(code, f"the job was interrupted ({interrupted}, exit {code}); "
                           + words, None, said)
        if code == 0 and options.mode == "stop":
            return Outcome(EXIT_GUARD_FAILED, words, None, said)
        return Outcome(code, words, None, said)
    verdict = "findings" if any(r.get("findings") for r in watched) else "clean"
    steps = max((int(r.get("steps", 0) or 0) for r in watched), default=0)
    ranks = len({r.get("rank") for r in watched})
    seen = f"{steps} watched step(s) on {ranks} rank(s) here" if steps else \
        f"{ranks} rank(s) here"
    if interrupted:
        return Outcome(code, f"the job was interrupted ({interrupted}, exit {code}) after "
                       f"the guard's verdict ({verdict}: {seen})", report, said)
    return Outcome(code, f"the job exited {code}; the guard's verdict: {verdict} ({seen})",
                   report, said)


def _signal_name(code: int) -> str:
    if code <= 128:
        return ""
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return ""


def _write_report(path: str, outcome: Outcome) -> None:
    """Rank 0's report, with the exit code this process exits with."""
    from qaudit.files.outputs import write_file

    document = {**outcome.report, "exit_code": outcome.code}
    write_file(path, json.dumps(document, indent=2) + "\n")
