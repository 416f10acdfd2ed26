"""The multi-process guard-job generator of the fuzz campaign (tests/hostile_inputs6.py,
`scripts/fuzz --family guardjobs`): its oracle's reading of the launch command agrees with
bash itself, a slice of the campaign breaks no rule, and the oracle catches a launcher that
forgets an earlier process's stop (the round-five bug)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hostile_inputs6 as jobs  # noqa: E402

LIGHT = ("plain", "crash", "killself", "sim", "startfail")


def _light_jobs(count: int, seed: str, kinds: tuple[str, ...] = LIGHT) -> list[str]:
    """Seeds whose jobs hold only processes of these kinds (no torch: milliseconds each)."""
    found, index = [], 0
    while len(found) < count:
        name = f"{seed}:{index}"
        index += 1
        job = _generate(random.Random(name), Path("/nonexistent"))
        if all(p.kind in kinds for s in job.stages for p in s.procs):
            found.append(name)
    return found


def _generate(r: random.Random, folder: Path):
    saved = jobs._write_support
    jobs._write_support = lambda folder: None
    try:
        return jobs.gen_guardjobs(r, folder)
    finally:
        jobs._write_support = saved


# startfail is left out: without the guard nothing fails to start.
@pytest.mark.parametrize("seed", _light_jobs(12, "bash", ("plain", "crash", "killself", "sim")))
def test_the_oracles_job_code_and_processes_are_bashs(tmp_path, seed):
    """The launch command run by bash without qaudit: the exit code and the processes that
    ran are what the oracle computed from the description alone."""
    job = jobs.gen_guardjobs(random.Random(seed), tmp_path)
    env = {**os.environ, "QA_NODE_BASE": "0"}
    env.pop("QAUDIT_GUARD_RESULTS", None)
    done = subprocess.run(jobs.launch_command(job, tmp_path), env=env, capture_output=True,
                          text=True, timeout=600)
    code, ran = jobs.job_status(job)
    returned = 128 - done.returncode if done.returncode < 0 else done.returncode  # a shell's
    assert returned == code, (job.describe(), done.stderr[-2000:])
    logged = (tmp_path / "ran.log").read_text().split()
    assert sorted(logged) == sorted(r.proc.id for r in ran), job.describe()


@pytest.mark.parametrize("seed", _light_jobs(8, "campaign"))
def test_a_slice_of_the_campaign_breaks_no_rule(tmp_path, seed):
    job = jobs.gen_guardjobs(random.Random(seed), tmp_path)
    result = jobs.run_case(job, tmp_path)
    assert result.problems == [], (job.describe(), result.stderr[-2000:])


def test_the_oracle_catches_a_launcher_that_keeps_one_result_per_rank(tmp_path, monkeypatch):
    """Round five's bug 4: a later process with the same rank replaced an earlier verdict.
    A launcher that reads only the newest result per rank must be caught."""
    from qaudit.guard import launch

    original = launch.read_results

    def newest_per_rank(results):
        paths = sorted(results.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        kept = {}
        for path in paths:
            kept[path.name.split("-pid")[0]] = path
        for path in set(paths) - set(kept.values()):
            path.unlink()
        return original(results)

    monkeypatch.setattr(launch, "read_results", newest_per_rank)
    stop = jobs.Proc("p0", "sim", verdict="findings")
    later = jobs.Proc("p1", "sim", verdict="clean")
    job = jobs.GuardJob("guardjobs", jobs.STOP, 1, [jobs.Stage("single", [stop]),
                                                    jobs.Stage("single", [later])], False)
    jobs._write_support(tmp_path)
    assert jobs.expected(job)[0] == 10
    result = jobs.run_case(job, tmp_path)
    assert any("the oracle says 10" in problem for problem in result.problems), result.problems
    monkeypatch.setattr(launch, "read_results", original)
    (tmp_path / "pids").mkdir(exist_ok=True)
    assert jobs.run_case(job, tmp_path).problems == []


@pytest.mark.slow
@pytest.mark.parametrize("mode, broken", [(jobs.WARN, 1), (jobs.WARN, 0), (jobs.STOP, 1)])
def test_torchrun_with_one_rank_whose_guard_fails_keeps_the_oracles_verdict(tmp_path, mode,
                                                                             broken):
    """Two real gloo ranks on the tiny stack, one whose guard fails at its first watched step:
    in warn mode the other rank's verdict stands and nobody waits for ever; in stop mode the
    guard's failure is exit 3, not torchrun's 1."""
    run = jobs.Proc("p0", "torchrun", ranks=2, repeated=True, steps=1, broken=broken)
    job = jobs.GuardJob("guardjobs_torchrun", mode, 1, [jobs.Stage("single", [run])], False)
    jobs._write_support(tmp_path)
    result = jobs.run_case(job, tmp_path)
    assert result.problems == [], (result.problems, result.stderr[-2000:])
    assert result.code == jobs.expected(job)[0] == (3 if mode == jobs.STOP else 0)
