"""`qaudit guard` killed outright (SIGKILL: no handler of qaudit's runs) while a torchrun
job runs under it: nothing of the job is left running, torchrun's agent and its workers
included, whether torchrun is the launch command or a shell wrapper starts it (issue 44).
Synchronised by the files the workers write; every wait is a counted number of polls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

PY = sys.executable
POLLS = 12_000  # polls of 10 ms: a generous cap on a loaded machine, never a synchroniser

WORKER = """
import os, signal, sys
here = sys.argv[1]
rank = os.environ["RANK"]
agent = os.getppid()  # torchrun's agent
tmp = os.path.join(here, f"ready-{rank}.tmp")
with open(tmp, "w") as f:
    f.write(f"{os.getpid()} {agent}")
os.rename(tmp, os.path.join(here, f"ready-{rank}"))
while True:
    signal.pause()
"""


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), None once it has ended: a zombie
    has ended (it runs nothing), and a reused pid has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _poll(condition, what: str) -> None:
    for _ in range(POLLS):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"{what} after {POLLS} polls")


@pytest.fixture
def leftovers():
    """Whatever a failing test leaves running is killed at teardown, by its own pid."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.slow  # torchrun and its ranks: processes importing torch (CI runs it)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("wrapped", [False, True], ids=["torchrun", "shell-wrapped"])
def test_killing_qaudit_ends_torchrun_and_its_workers(tmp_path, leftovers, wrapped):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(script), str(tmp_path)]
    # A wrapper that is no exec: the shell stays the job's first process, torchrun its child.
    job = (["bash", "-c", " ".join(torchrun) + "; echo done"] if wrapped else torchrun)
    guarded = subprocess.Popen([PY, "-m", "qaudit", "guard", "--mode", "warn", "--", *job],
                               cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    leftovers.append(guarded.pid)
    ready = [tmp_path / f"ready-{rank}" for rank in (0, 1)]
    _poll(lambda: all(path.exists() for path in ready) or guarded.poll() is not None,
          "the workers never started")
    assert guarded.poll() is None, "qaudit guard ended before its workers started"
    pids = sorted({int(word) for path in ready for word in path.read_text().split()})
    assert len(pids) == 3  # two workers and torchrun's agent, their parent
    leftovers.extend(pids)
    started = {pid: _start_time(pid) for pid in pids}
    assert None not in started.values()
    guarded.kill()
    guarded.wait()
    _poll(lambda: all(_start_time(pid) != started[pid] for pid in pids),
          "torchrun or a worker is still running")
