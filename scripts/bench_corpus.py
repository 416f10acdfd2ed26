"""`scripts/bench --corpus`: every file of both shared corpora (and the bundled configs) as a
user runs it, `qaudit check FILE --format json` in a fresh process each, with the default
runtime. Per file: the process's CPU time (user + system, from wait4) and its peak RSS.

Every file runs once; then the slowest ten (and any file over a target) run until they have
`repeats` runs, and the best of those is kept. A file's single run is an upper bound on its
best of `repeats`, so "every file within the targets" holds for the files run once too.

With `reports`, each file's JSON report (stdout), its stderr and exit code are written to
that directory, one file per input (`scripts/compare-reports` compares two such directories:
the same reports before and after a change).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = (REPO.parent / "shared" / "corpus").resolve()
TARGET_CPU_S = 10.0
TARGET_PEAK_MIB = 1024.0
SLOWEST = 10


def corpus_files(shared: Path = SHARED) -> list[Path]:
    """The files the corpus tests audit: Megatron-LM's functional tests and launch scripts,
    every file of the Megatron-Bridge corpus, and the bundled configs (relative to the
    repository, where the processes run: their reports name the same path from any clone)."""
    megatron = [p for folder in ("functional_tests", "launch_scripts")
                for p in sorted((shared / "megatron" / folder).glob("*")) if p.is_file()]
    bridge = sorted(p for p in (shared / "bridge").rglob("*") if p.is_file())
    bundled = sorted(p.relative_to(REPO) for p in (REPO / "configs").glob("*.yaml"))
    return megatron + bridge + bundled


def report_name(path: Path) -> str:
    """One flat, stable file name per input (its path below the corpus or the repository)."""
    if path.is_relative_to(SHARED):
        path = path.relative_to(SHARED)
    return str(path).strip("/").replace("/", "__") + ".out"


def run_once(path: Path, env: dict[str, str]) -> dict:
    """One `qaudit check PATH --format json` process: exit code, CPU seconds, peak MiB, output.
    The child is reaped here with wait4, whose rusage is that process's alone."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-m", "qaudit", "check", str(path),
                                  "--format", "json"], cwd=REPO, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {"exit": child.returncode, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_mib": usage.ru_maxrss / 1024, "wall_s": time.perf_counter() - started,
            "stdout": stdout, "stderr": stderr}


def write_report(directory: Path, path: Path, run: dict) -> None:
    """The report as compared: exit code, stderr, then stdout (the JSON report)."""
    text = f"exit: {run['exit']}\nstderr: {run['stderr']!r}\n{run['stdout']}"
    (directory / report_name(path)).write_text(text)


def bench_corpus(files: list[Path], repeats: int = 3, reports: Path | None = None,
                 progress=print, jobs: int = 1) -> dict:
    """CPU seconds and peak MiB per file, best of `repeats` for the slowest ten and for any
    file over a target, one run for the others. `jobs` processes at a time: each one's CPU
    time and peak are its own (wait4), so they hold whatever runs beside them."""
    env = dict(os.environ)
    if reports is not None:
        reports.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {}
    done = 0

    def first_run(path: Path) -> None:
        nonlocal done
        run = run_once(path, env)
        if reports is not None:
            write_report(reports, path, run)
        runs[str(path)] = [run]
        done += 1
        progress(f"[{done}/{len(files)}] {run['cpu_s']:6.2f} s {run['peak_mib']:6.0f} MiB "
                 f"exit {run['exit']} {path}")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(first_run, files))
    runs = {str(path): runs[str(path)] for path in files}  # input order, whatever finished first

    def best(name: str) -> dict:
        return min(runs[name], key=lambda run: run["cpu_s"])

    def over(name: str) -> bool:
        run = best(name)
        return run["cpu_s"] > TARGET_CPU_S or run["peak_mib"] > TARGET_PEAK_MIB

    by_cpu = sorted(runs, key=lambda name: -best(name)["cpu_s"])
    again = list(dict.fromkeys(by_cpu[:SLOWEST] + [name for name in by_cpu if over(name)]))
    for name in again:
        while len(runs[name]) < repeats:
            runs[name].append(run_once(Path(name), env))
        progress(f"best of {len(runs[name])}: {best(name)['cpu_s']:6.2f} s {name}")
    files_out = {name: {"exit": best(name)["exit"], "cpu_s": best(name)["cpu_s"],
                        "peak_mib": max(run["peak_mib"] for run in runs[name]),
                        "runs": len(runs[name])} for name in runs}
    slowest = sorted(files_out, key=lambda name: -files_out[name]["cpu_s"])[:SLOWEST]
    return {"files": files_out, "slowest": slowest,
            "over_target": [name for name in files_out
                            if files_out[name]["cpu_s"] > TARGET_CPU_S
                            or files_out[name]["peak_mib"] > TARGET_PEAK_MIB],
            "max_cpu_s": max(f["cpu_s"] for f in files_out.values()),
            "max_peak_mib": max(f["peak_mib"] for f in files_out.values()),
            "total_cpu_s": sum(f["cpu_s"] for f in files_out.values())}


def print_corpus(result: dict, repeats: int) -> None:
    files = result["files"]
    print(f"\n{len(files)} files, `qaudit check FILE --format json` each (default runtime); CPU "
          f"seconds of the process, best of {repeats} for the slowest {SLOWEST} and any over a "
          "target (one run for the others: an upper bound)")
    print(f"{'CPU s':>7} {'peak MiB':>8} {'exit':>4}  file")
    for name in result["slowest"]:
        row = files[name]
        print(f"{row['cpu_s']:7.2f} {row['peak_mib']:8.0f} {row['exit']:4d}  {report_name(Path(name))[:-4]}")
    print(f"slowest {result['max_cpu_s']:.2f} s CPU (target {TARGET_CPU_S:.0f}), largest peak "
          f"{result['max_peak_mib']:.0f} MiB (target {TARGET_PEAK_MIB:.0f}); all files "
          f"{result['total_cpu_s']:.0f} s CPU; over a target: {len(result['over_target'])}")
