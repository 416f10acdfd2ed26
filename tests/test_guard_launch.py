"""`qaudit guard`'s launcher around a real launch, without Megatron: which processes the guard
touches (only those that import megatron or transformer_engine), the job's PYTHONPATH and
sitecustomize as the job had them, its options against the job's, signals, and how the
results of every process of the job decide the exit code. Each subprocess is a plain Python;
synchronisation is by files the job writes (never by sleeping)."""

from __future__ import annotations

import json
import os
import py_compile
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qaudit.guard import launch, verdict
from qaudit.guard.session import EXIT_GUARD_FAILED, EXIT_STOPPED, GuardOptions

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def _qaudit(*args: str, cwd: Path | None = None, env: dict | None = None,
            **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "qaudit", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=300, **kwargs)


def _script(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def _fake_megatron(root: Path) -> Path:
    """A package named megatron that does nothing: importing it is what starts the guard."""
    (root / "megatron").mkdir(parents=True)
    (root / "megatron" / "__init__.py").write_text("")
    return root


def _no_torch(root: Path) -> Path:
    """A directory that makes `import torch` fail, as in a Python without torch."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "torch.py").write_text("raise ImportError('no torch in this Python')\n")
    return root


# --- which processes the guard touches (issue 43 items 1 and 7) ----------------------------

def test_a_process_that_never_imports_megatron_imports_nothing_of_the_guard(tmp_path):
    probe = ("import sys, json; print(json.dumps(sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('torch', 'qaudit'))))")
    done = _qaudit("guard", "--mode", "warn", "--", PY, "-c", probe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: 1 thread is the default")
def test_the_threads_a_script_sets_before_importing_torch_are_honoured(tmp_path):
    wanted = 1  # torch's default is one per core (torch caps a larger value at the cores)
    probe = (f"import os; os.environ['OMP_NUM_THREADS'] = '{wanted}'; import torch; "
             "print(torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = _qaudit("guard", "--mode", "warn", "--", PY, "-c", probe, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip().splitlines()[-1]) == wanted


def test_a_torch_less_helper_python_is_not_touched_and_the_jobs_code_is_returned(tmp_path):
    """Megatron's dataset Makefile runs `python3 -m pybind11 --includes`; a python3 without
    torch used to fail the guard's start there and turn the run into exit 3."""
    notorch = _no_torch(tmp_path / "notorch")
    job = (f"PYTHONPATH={notorch}:$PYTHONPATH {PY} -c 'import sys; print(sys.version)' && "
           f"PYTHONPATH={notorch}:$PYTHONPATH {PY} -m json.tool <<< '{{}}' && exit 7")
    done = _qaudit("guard", "--", "bash", "-c", job, cwd=tmp_path)
    assert done.returncode == 7, done.stderr
    assert "could not start" not in done.stderr and "failed" not in done.stderr


def test_a_start_failure_counts_only_in_a_process_that_imports_megatron(tmp_path):
    """The same torch-less Python importing Megatron: there the guard cannot start, and that
    is the guard's failure (exit 3), said once, the process ended before anything trains."""
    notorch, fake = _no_torch(tmp_path / "notorch"), _fake_megatron(tmp_path / "fake")
    job = (f"PYTHONPATH={notorch}:{fake}:$PYTHONPATH {PY} -c "
           "'import megatron; print(\"trained\")'; exit 0")
    done = _qaudit("guard", "--", "bash", "-c", job, cwd=tmp_path)
    assert done.returncode == EXIT_GUARD_FAILED, done.stderr
    assert "trained" not in done.stdout
    assert done.stderr.count("could not start") == 1 and "Traceback" not in done.stderr
    # In warn mode the process runs on, unguarded, and the job's code is kept.
    done = _qaudit("guard", "--mode", "warn", "--", "bash", "-c", job, cwd=tmp_path)
    assert done.returncode == 0 and "trained" in done.stdout


def test_cpu_without_transformer_engine_is_one_line_naming_fetch_te(tmp_path):
    fake = _fake_megatron(tmp_path / "fake")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    job = f"PYTHONPATH=$PYTHONPATH:{fake} {PY} -c 'import megatron'"
    done = _qaudit("guard", "--cpu", "--", "bash", "-c", job, cwd=tmp_path, env=env)
    if "a CUDA device is present" in done.stderr:
        pytest.skip("a CUDA device is visible: --cpu refuses for that reason instead")
    assert done.returncode == EXIT_GUARD_FAILED, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "scripts/fetch-te" in lines[0], done.stderr


# --- the job's PYTHONPATH and sitecustomize (issue 44 items 7 and 12) --------------------------

def test_empty_pythonpath_entries_are_kept():
    assert launch.job_pythonpath(":/opt/x", "S", "P") == os.pathsep.join(["S", "", "/opt/x", "P"])
    assert launch.job_pythonpath("/a::/b", "S", "P") == os.pathsep.join(["S", "/a", "", "/b", "P"])
    assert launch.job_pythonpath("", "S", "P") == launch.job_pythonpath(None, "S", "P") == \
        os.pathsep.join(["S", "P"])


def test_the_working_directory_an_empty_entry_means_stays_on_the_jobs_path(tmp_path):
    (tmp_path / "localmod.py").write_text("WHERE = 'cwd'\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = _script(elsewhere / "job.py", "import localmod; print(localmod.WHERE)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep + str(tmp_path / "nothing")}
    done = _qaudit("guard", "--mode", "warn", "--", PY, script, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "cwd"


def _with_site(site: Path, code: str) -> list[str]:
    """The job's own sitecustomize directory on the job's PYTHONPATH only (qaudit's own
    process must not run it)."""
    return ["bash", "-c", f"PYTHONPATH=$PYTHONPATH:{site} exec {PY} -c '{code}'"]


PROBE = ("import sys, sitecustomize as s; print(s.RUNS, s.__spec__.origin == s.__file__, "
         "s.__name__, sys.modules[\"sitecustomize\"] is s)")


@pytest.mark.parametrize("form", ["source", "package", "pyc"])
def test_the_jobs_own_sitecustomize_runs_once_as_python_runs_it(tmp_path, form):
    site = tmp_path / "site"
    site.mkdir()
    body = ("import builtins\nbuiltins.QA_RUNS = getattr(builtins, 'QA_RUNS', 0) + 1\n"
            "RUNS = builtins.QA_RUNS\n")
    if form == "package":
        (site / "sitecustomize").mkdir()
        (site / "sitecustomize" / "__init__.py").write_text(body)
    elif form == "source":
        (site / "sitecustomize.py").write_text(body)
    else:
        source = tmp_path / "sitecustomize.py"
        source.write_text(body)
        py_compile.compile(str(source), cfile=str(site / "sitecustomize.pyc"), doraise=True)
    done = _qaudit("guard", "--mode", "warn", "--", *_with_site(site, PROBE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "1 True sitecustomize True"


def test_a_jobs_sitecustomize_that_exits_behaves_as_without_the_guard(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise SystemExit(5)\n")
    command = _with_site(site, "print(1)")
    without = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path,
                             timeout=300)
    done = _qaudit("guard", "--mode", "warn", "--", *command, cwd=tmp_path)
    assert done.returncode == without.returncode
    assert ("1" in done.stdout.split()) == ("1" in without.stdout.split())


# --- qaudit's options and the job's (issue 43 item 6) -----------------------------------------

def test_a_mistyped_option_is_one_line_with_the_option_meant():
    done = _qaudit("guard", "--step", "2", "--", PY, "-c", "pass")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "did you mean --steps" in lines[0]
    done = _qaudit("guard", "--steps", "0", "--", PY, "-c", "pass")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_from_the_command_on_every_word_is_the_jobs(tmp_path):
    probe = "import sys, json; print(json.dumps(sys.argv[1:]))"
    done = _qaudit("guard", "--mode", "warn", PY, "-c", probe, "--steps", "3", "--report",
                   "x.json", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["--steps", "3", "--report",
                                                                 "x.json", "--help"]
    assert not (tmp_path / "x.json").exists()


# --- signals (issue 43 item 5) -------------------------------------------------------------

INTERRUPTIBLE = """
import os, signal, sys, time
here = sys.argv[1]
def counted(signum, frame):
    with open(os.path.join(here, "sigint-count"), "a") as f:
        f.write("x")
    raise KeyboardInterrupt
signal.signal(signal.SIGINT, counted)
def terminated(signum, frame):
    open(os.path.join(here, "terminated"), "w").close()
    sys.exit(128 + signum)
if len(sys.argv) > 2:
    signal.signal(signal.SIGTERM, terminated)
with open(os.path.join(here, "ready.tmp"), "w") as f:
    f.write(f"{os.getpid()} {os.getpgrp()}")
os.rename(os.path.join(here, "ready.tmp"), os.path.join(here, "ready"))
try:
    while True:
        signal.pause()
except KeyboardInterrupt:
    # The job's own handler (a checkpoint on interrupt): it must not be interrupted again.
    open(os.path.join(here, "handled"), "w").close()
    while not os.path.exists(os.path.join(here, "release")):
        time.sleep(0.01)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
"""


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


@pytest.fixture
def started():
    """Whatever a failing signal test left running is ended at teardown (by its own pid)."""
    processes: list = []
    yield processes
    for item in processes:
        if isinstance(item, int):
            try:
                os.kill(item, signal.SIGKILL)
            except OSError:
                pass
        elif item.poll() is None:
            item.kill()
            item.communicate()


def _as_a_terminal_starts_it() -> None:
    """An interactive shell starts a command with SIGINT and SIGQUIT at their defaults. A
    pytest started in the background of a non-interactive shell (`pytest &`, a CI step)
    ignores both, and qaudit rightly keeps an ignored signal ignored (nohup): the Ctrl-C sent
    here would never reach the job, and the test would wait out its deadline."""
    for signum in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


def _start_guarded(tmp_path: Path, started: list, *job_args: str
                   ) -> tuple[subprocess.Popen, int, int]:
    script = _script(tmp_path / "job.py", INTERRUPTIBLE)
    guarded = subprocess.Popen([PY, "-m", "qaudit", "guard", "--mode", "warn", "--", PY,
                                script, str(tmp_path), *job_args], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True,  # its own group: a terminal's
                               preexec_fn=_as_a_terminal_starts_it)
    started.append(guarded)
    _wait_for(tmp_path / "ready", guarded)
    pid, group = map(int, (tmp_path / "ready").read_text().split())
    started.append(pid)
    return guarded, pid, group


def test_ctrl_c_to_the_group_reaches_the_job_once_and_exits_130(tmp_path, started):
    guarded, _, group = _start_guarded(tmp_path, started)
    assert group != os.getpgid(guarded.pid)  # the group's signal reaches qaudit only
    os.killpg(guarded.pid, signal.SIGINT)  # what the terminal's Ctrl-C does
    _wait_for(tmp_path / "handled", guarded)
    (tmp_path / "release").touch()
    _, stderr = guarded.communicate(timeout=120)
    assert guarded.returncode == 130, stderr
    assert (tmp_path / "sigint-count").read_text() == "x"
    assert "Fatal Python error" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("qaudit guard: the job was interrupted (SIGINT, exit 130)")


def test_sigterm_gives_143_and_a_killed_job_137(tmp_path, started):
    guarded, _, _ = _start_guarded(tmp_path, started)
    guarded.send_signal(signal.SIGTERM)
    _, stderr = guarded.communicate(timeout=120)
    assert guarded.returncode == 143, stderr
    assert "interrupted (SIGTERM, exit 143)" in stderr
    for name in ("ready", "sigint-count"):
        (tmp_path / name).unlink(missing_ok=True)
    guarded, pid, _ = _start_guarded(tmp_path, started)
    os.kill(pid, signal.SIGKILL)
    _, stderr = guarded.communicate(timeout=120)
    assert guarded.returncode == 137, stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_killing_qaudit_ends_the_job(tmp_path, started):
    guarded, pid, _ = _start_guarded(tmp_path, started, "--handle-term")
    guarded.kill()
    guarded.communicate(timeout=120)
    deadline = time.monotonic() + 120
    while not (tmp_path / "terminated").exists():
        assert time.monotonic() < deadline, "the job was left running"
        time.sleep(0.01)


# --- every process's result decides (issue 44 items 4, 5, 13) -------------------------------

def _results(tmp_path: Path, *parts: dict) -> list[dict]:
    """Each part written as the process with its rank would write it."""
    options = GuardOptions(results=str(tmp_path))
    for part in parts:
        original = verdict._rank
        verdict._rank = lambda part=part: part.get("rank", 0)
        try:
            verdict._write_file(options, part)
        finally:
            verdict._rank = original
    return launch.read_results(tmp_path)


def test_a_later_process_with_the_same_rank_does_not_erase_a_stop(tmp_path):
    stopped = {"rank": 0, "stop": True, "findings": True, "steps": 1, "report": {}}
    clean = {"rank": 0, "stop": False, "findings": False, "steps": 1, "report": {}}
    results = _results(tmp_path, stopped, clean)
    assert len(results) == 2
    assert launch.decide(0, results, GuardOptions()).code == EXIT_STOPPED
    warned = {**stopped, "stop": False}
    (tmp_path / "warn").mkdir()
    results = _results(tmp_path / "warn", warned, clean)
    outcome = launch.decide(0, results, GuardOptions(mode="warn"))
    assert outcome.code == 0 and "findings" in outcome.message


def test_a_node_without_rank_0_gives_the_verdict_of_the_ranks_it_watched():
    """torchrun --nnodes 2: the second node's launcher sees ranks 2 and 3 only. Every rank
    leaves the verdict all ranks agreed on in the gather, so both nodes decide alike."""
    node0 = [{"rank": 0, "stop": False, "findings": False, "steps": 1, "report": {}},
             {"rank": 1, "stop": False, "findings": False, "steps": 1}]
    node1 = [{"rank": 2, "stop": False, "findings": False, "steps": 1},
             {"rank": 3, "stop": False, "findings": False, "steps": 1}]
    assert [launch.decide(0, node, GuardOptions()).code for node in (node0, node1)] == [0, 0]
    stopped = [{**r, "stop": True, "findings": True} for r in node1]
    assert launch.decide(1, stopped, GuardOptions()).code == EXIT_STOPPED
    assert "verdict: clean" in launch.decide(0, node1, GuardOptions()).message


def test_a_rank_crash_is_the_jobs_exit_code_not_the_guards_failure():
    lost = [{"rank": 0, "failed": "PeerLost: the ranks' gather failed", "stop": False,
             "peer_lost": True}]
    assert launch.decide(1, lost, GuardOptions()).code == 1
    # A lost peer while the job says it succeeded: nothing explains it but the guard.
    assert launch.decide(0, lost, GuardOptions()).code == EXIT_GUARD_FAILED
    own = [{"rank": 0, "failed": "RuntimeError: boom", "stop": False, "peer_lost": False}]
    assert launch.decide(1, own, GuardOptions()).code == EXIT_GUARD_FAILED


def test_a_gather_that_loses_a_peer_is_reported_as_such(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)

    def closed(tensors, tensor):
        raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:29500")

    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "all_gather", closed)
    with pytest.raises(verdict.PeerLost, match="another rank of the job ended first"):
        verdict.gather({"rank": 0})


def test_the_launcher_never_imports_torch(tmp_path):
    """`qaudit guard`'s own process only starts the job and reads its results: torch (most of
    a second or two of CPU per launch) is imported in the job's processes, never in it."""
    probe = ("import sys\nfrom qaudit.cli import main\n"
             "sys.argv = ['qaudit', 'guard', '--mode', 'warn', '--', sys.executable, '-c', 'pass']\n"
             "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
             "print(code, 'torch' in sys.modules)\n")
    done = subprocess.run([PY, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["0", "False"], done.stderr[-2000:]
