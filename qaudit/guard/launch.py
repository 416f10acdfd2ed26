"""`qaudit guard [OPTIONS] -- COMMAND...`: run the user's launch command unchanged, with the
guard started in every Python process it runs, and exit with its exit code, except that a
stop by the guard is EXIT_STOPPED (docs/guard.md).

How the guard gets in: a private directory holding only a `sitecustomize.py` goes first on
PYTHONPATH (Python runs it at every start, torchrun's workers included, and it then runs the
sitecustomize it shadows); another holding only a link to the qaudit package goes last, so
a job whose Python lacks qaudit still finds it and nothing else. The options travel in the
environment; each rank leaves its result in the private directory, which is removed after.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qaudit.errors import EnvironmentProblem, InputError, printable
from qaudit.guard.child import ENVIRONMENT
from qaudit.guard.session import EXIT_GUARD_FAILED, EXIT_STOPPED, GuardOptions

SITE = Path(__file__).resolve().parent / "site"
PACKAGE = Path(__file__).resolve().parent.parent


@dataclass
class Outcome:
    code: int
    message: str
    report: dict | None


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
        paths = [str(SITE), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)),
                 str(package)]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env[ENVIRONMENT] = json.dumps({
            "mode": options.mode, "steps": options.steps, "numeric": options.numeric,
            "fail_on": options.fail_on, "cpu": cpu, "results": str(results),
            "report": os.path.abspath(options.report) if options.report else None})
        env["QAUDIT_GUARD_RESULTS"] = str(results)
        code = _run_child([executable, *command[1:]], env)
        return _decide(code, _read(results), options)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _run_child(argv: list[str], env: dict[str, str]) -> int:
    """The command as a child; Ctrl-C and termination reach it, qaudit waits for its end."""
    try:
        child = subprocess.Popen(argv, env=env)
    except OSError as exc:
        raise EnvironmentProblem(f"qaudit guard: cannot start {printable(argv[0])}: "
                                 f"{exc.strerror}") from None

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _read(results: Path) -> list[dict]:
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


def _decide(code: int, results: list[dict], options: GuardOptions) -> Outcome:
    report = next((r["report"] for r in results if "report" in r), None)
    failures = [r["failed"] for r in results if r.get("failed")]
    if any(r.get("stop") for r in results):
        return Outcome(EXIT_STOPPED, "the guard stopped the job before the optimizer step "
                       f"(exit {EXIT_STOPPED})", report)
    if failures and options.mode == "stop":
        return Outcome(EXIT_GUARD_FAILED, f"the guard failed: {failures[0]}", report)
    if failures:
        return Outcome(code, f"the guard failed (the job ran on, --mode warn): {failures[0]}",
                       report)
    if report is None:
        words = (f"the guard saw no completed watched step ({options.steps} asked): "
                 "nothing was checked")
        if code == 0 and options.mode == "stop":
            return Outcome(EXIT_GUARD_FAILED, words, None)
        return Outcome(code, words, None)
    verdict = "findings" if any(r.get("findings") for r in results) else "clean"
    return Outcome(code, f"the job exited {code}; the guard's verdict: {verdict}", report)
