"""The guard inside a real Megatron training run on this CPU: megatron-core 0.19.2's GPTModel,
its DistributedDataParallel (main_grad buffers), its optimizer and the schedule
get_forward_backward_func() returns, on TE's own Python (the newest fetched release) with
qaudit's CPU kernel stand-in and gloo (`qaudit guard --cpu`). The training script is
scripts/guard-demo, which knows nothing of qaudit. Slow; needs QAUDIT_TEST_TE_DIRS and
QAUDIT_TEST_MEGATRON_CORE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qaudit.guard.session import EXIT_GUARD_FAILED, EXIT_STOPPED

REPO = Path(__file__).resolve().parent.parent
TE_DIRS = [Path(p) for p in os.environ.get("QAUDIT_TEST_TE_DIRS", "").split(":") if p]
MEGATRON = os.environ.get("QAUDIT_TEST_MEGATRON_CORE", "")
DEMO = REPO / "scripts" / "guard-demo"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not TE_DIRS or not MEGATRON,
    reason="QAUDIT_TEST_TE_DIRS and QAUDIT_TEST_MEGATRON_CORE not both set")]


def _env(extra_path: list[str] = ()) -> dict[str, str]:
    env = dict(os.environ)
    te = TE_DIRS[-1]
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(REPO), MEGATRON, str(te),
                                         str(te.parent / "te-deps")])
    return env


def _guard(tmp_path: Path, guard_flags: list[str], demo_flags: list[str],
           launcher: list[str] | None = None, extra_path: list[str] = ()) -> tuple:
    """`qaudit guard --cpu --report R [flags] -- python scripts/guard-demo [demo flags]`, run
    in an empty directory; returns (exit code, stdout, stderr, report or None)."""
    report = tmp_path / "guard.json"
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    command = [*(launcher or [sys.executable]), str(DEMO), *demo_flags]
    done = subprocess.run([sys.executable, "-m", "qaudit", "guard", "--cpu", "--report",
                           str(report), *guard_flags, "--", *command], cwd=work,
                          env=_env(list(extra_path)), capture_output=True, text=True,
                          timeout=1800)
    assert "Traceback" not in done.stderr.split("qaudit guard:")[-1]
    document = json.loads(report.read_text()) if report.exists() else None
    return done.returncode, done.stdout, done.stderr, document


def _valid(report: dict) -> dict:
    """The report is `qaudit check`'s JSON schema's."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "qaudit" / "schemas" / "report-v1.schema.json").read_text())
    jsonschema.validate(report, schema)
    return report


def _guard_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("qaudit guard:")]


def _steps_trained(stdout: str) -> int:
    return sum(1 for line in stdout.splitlines() if line.startswith("step "))


@pytest.mark.parametrize("precision", [["--bf16"], ["--fp8", "tensorwise"]], ids=["bf16", "fp8"])
def test_a_repeated_mtp_layer_is_stopped_before_the_first_update(tmp_path, precision):
    code, stdout, stderr, report = _guard(tmp_path, [], ["--mtp-layers", "2", "--repeated-mtp",
                                                         *precision])
    assert code == EXIT_STOPPED, stderr[-3000:]
    assert _steps_trained(stdout) == 0  # the script prints a step after optimizer.step()
    _valid(report)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors and {f["rule"] for f in errors} == {"QA001"}
    assert all(f["module"].startswith("mtp.layers.0.") for f in errors)
    assert any(f["module"] == "mtp.layers.0.eh_proj" for f in errors)
    lines = _guard_lines(stderr)
    # Grouped as `qaudit check`'s verdict, with the fix and the rule's explanation, after the
    # job's own output; the one-line summary last.
    assert f"qaudit guard:   QA001 error  {len(errors)} modules: mtp.layers.0." in stderr
    assert "qaudit guard: explain: qaudit explain QA001" in lines
    fix = " ".join(line.removeprefix("qaudit guard:").strip() for line in lines
                   if line.startswith("qaudit guard:  "))
    assert "fix: " in fix and "set mtp_use_repeated_layer: false" in fix
    assert lines[-1] == "qaudit guard: the guard stopped the job before the optimizer step " \
        "(exit 10)"
    assert stderr.strip().splitlines()[-1] == lines[-1]
    assert report["guard"]["steps_watched"] == 1 and report["exit_code"] == EXIT_STOPPED
    assert report["te"]["version"] == TE_DIRS[-1].name.removeprefix("te-")
    rows = {row["name"]: row for row in report["modules"]}
    assert rows["mtp.layers.0.eh_proj"]["calls_per_microbatch"] == 2
    assert rows["output_layer"]["calls_per_microbatch"] == 3  # the main head and two depths
    # The label is honest: BF16 parameters (Megatron's BF16 optimizer built on this CPU).
    assert ("parameters bfloat16\n" in stdout) == ("--bf16" in precision)
    # Only its report was written: the job's directory is as it was.
    assert list((tmp_path / "work").iterdir()) == []


def test_one_mtp_layer_per_depth_runs_on(tmp_path):
    code, stdout, stderr, report = _guard(tmp_path, [], ["--mtp-layers", "2", "--steps", "3"])
    assert code == 0, stderr[-3000:]
    assert _steps_trained(stdout) == 3
    assert report["exit_code"] == 0
    # BF16 modules still tracked are noted (QA003, info), as `qaudit check` notes them.
    assert {(f["rule"], f["severity"]) for f in report["findings"]} == {("QA003", "info")}
    assert report["guard"]["modules_observed"] == 19
    rows = {row["name"]: row for row in report["modules"]}
    assert rows["mtp.layers.1.eh_proj"]["calls_per_microbatch"] == 1
    assert rows["decoder.layers.0.mlp.linear_fc1"]["accumulation"] == "overwrite-first"


def test_numeric_shows_the_lost_gradient(tmp_path):
    code, _, stderr, report = _guard(tmp_path, ["--numeric"],
                                     ["--mtp-layers", "2", "--repeated-mtp"])
    assert code == EXIT_STOPPED, stderr[-3000:]
    checks = _valid(report)["guard"]["numeric"]
    lost = [c for c in checks if c["lost"] > 0]
    assert lost and all(c["module"].startswith("mtp.layers.0.") for c in lost)
    assert all(c["decision"] == "overwrite" and c["microbatch"] == 0 for c in lost)
    # TE's own kernels wrote exactly what the call's own gradient plus the buffer predict.
    assert max(c["residual"] for c in checks) < 1e-5
    assert all(f["evidence"] == "confirmed" for f in report["findings"] if f["rule"] == "QA001")


def test_warn_mode_reports_and_runs_on(tmp_path):
    code, stdout, stderr, report = _guard(tmp_path, ["--mode", "warn"],
                                          ["--mtp-layers", "2", "--repeated-mtp"])
    assert code == 0, stderr[-3000:]
    assert _steps_trained(stdout) == 3
    # The process's exit code (the job's), the findings in the report and on stderr.
    assert report["exit_code"] == 0 and report["guard"]["mode"] == "warn"
    assert any(f["rule"] == "QA001" for f in report["findings"])


def test_two_watched_steps_observe_the_flag_is_never_rearmed(tmp_path):
    """megatron-core 0.19.2 re-arms only for FP8/FP4 configs: a BF16 run's second step gets
    no True, which two watched steps see for themselves (stale)."""
    code, _, stderr, report = _guard(tmp_path, ["--steps", "2"],
                                     ["--mtp-layers", "2", "--repeated-mtp"])
    assert code == EXIT_STOPPED, stderr[-3000:]
    rows = {row["name"]: row for row in report["modules"]}
    assert rows["decoder.layers.0.mlp.linear_fc1"]["tracked"] == "stale"
    assert report["guard"]["steps_watched"] == 2
    qa001 = [f for f in report["findings"] if f["rule"] == "QA001"]
    assert all("watched step(s) 1 of 2" in f["message"] for f in qa001)


def test_torchrun_ranks_are_guarded_and_give_one_verdict(tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    code, _, stderr, report = _guard(tmp_path, [], ["--mtp-layers", "2", "--repeated-mtp"],
                                     launcher=launcher)
    assert code == EXIT_STOPPED, stderr[-3000:]
    assert report["guard"]["ranks"] == 2
    lines = _guard_lines(stderr)
    # Rank 0 speaks for both: one line at the step, the verdict once after the job's end.
    assert sum("the findings follow when the job has ended" in line for line in lines) == 1
    assert sum(line.startswith("qaudit guard: verdict:") for line in lines) == 1


def test_rank_zero_writes_its_report_even_when_another_rank_is_done_first(tmp_path):
    """The job's sitecustomize holds rank 0 back until rank 1 has left its result and then
    either ended (torchrun ends the other workers when one exits with the stop code) or is
    waiting in the ranks' barrier (what the guard does): every rank waits for rank 0 to have
    spoken, so the report is still written. Both waits are on things rank 1 leaves, not on
    time: a marker file it writes on reaching the barrier, and its pid gone."""
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "rank1-at-barrier"
    (site / "sitecustomize.py").write_text(
        "import os, re, time\n"
        "import qaudit.guard.verdict as v\n"
        f"MARKER = {str(marker)!r}\n"
        "spoken, waited = v._speak, v._wait_for_every_rank\n"
        "def at_barrier():\n"
        "    if os.environ.get('RANK') == '1':\n"
        "        open(MARKER, 'w').close()\n"
        "    return waited()\n"
        "def gone(pid):\n"
        "    try:\n"
        "        os.kill(pid, 0)\n"
        "    except ProcessLookupError:\n"
        "        return True\n"
        "    return False\n"
        "def late(report, stop, options):\n"
        "    pid = None\n"
        "    for _ in range(12000):  # a deadline for a broken run, not the synchronisation\n"
        "        for name in os.listdir(options.results):\n"
        "            found = re.match(r'result-rank1-pid(\\d+)-', name)\n"
        "            pid = int(found.group(1)) if found else pid\n"
        "        if pid is not None and (os.path.exists(MARKER) or gone(pid)):\n"
        "            break\n"
        "        time.sleep(0.005)\n"
        "    return spoken(report, stop, options)\n"
        "v._speak, v._wait_for_every_rank = late, at_barrier\n")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    code, _, stderr, report = _guard(tmp_path, [], ["--mtp-layers", "2", "--repeated-mtp"],
                                     launcher=launcher, extra_path=[str(site)])
    assert code == EXIT_STOPPED, stderr[-3000:]
    assert marker.exists()  # rank 1 waited in the barrier while rank 0 spoke
    assert report is not None and report["guard"]["ranks"] == 2


def test_a_failing_guard_never_passes_and_never_kills_a_warned_job(tmp_path):
    """The job's own sitecustomize (run after the guard's) breaks the guard's verdict."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import qaudit.guard.verdict as v\n"
        "def broken(*a, **k):\n    raise RuntimeError('planted failure')\n"
        "v.build_report = broken\n")
    code, stdout, stderr, _ = _guard(tmp_path, [], ["--mtp-layers", "2", "--repeated-mtp"],
                                     extra_path=[str(site)])
    assert code == EXIT_GUARD_FAILED and _steps_trained(stdout) == 0
    assert "planted failure" in stderr
    code, stdout, stderr, _ = _guard(tmp_path, ["--mode", "warn"],
                                     ["--mtp-layers", "2", "--repeated-mtp"],
                                     extra_path=[str(site)])
    assert code == 0 and _steps_trained(stdout) == 3
    assert "runs on unguarded" in stderr


def test_the_python_api_guards_a_script_that_calls_it(tmp_path):
    """`guard()` from Python, before the training script runs (as a Bridge recipe script
    would call it before `pretrain`): the same stop and the same report, no launcher."""
    report = tmp_path / "api.json"
    program = (
        "import sys, runpy\n"
        "from qaudit.guard import cpu, guard\n"
        "cpu.arm()  # what --cpu does: TE's Python on the CPU kernel stand-in\n"
        f"guard(report={str(report)!r})\n"
        f"sys.argv = [{str(DEMO)!r}, '--mtp-layers', '2', '--repeated-mtp']\n"
        f"runpy.run_path({str(DEMO)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == EXIT_STOPPED, done.stderr[-3000:]
    assert _steps_trained(done.stdout) == 0
    document = json.loads(report.read_text())
    failing = {f["rule"] for f in document["findings"] if f["severity"] != "info"}
    assert failing == {"QA001"}


DELAYED = """
import json, torch
from qaudit.runtime.standin import te_python as te_cpu
te_cpu.boot()
import transformer_engine.pytorch as te
from qaudit.run.observe import LiveObserver
torch.manual_seed(0)
layer = te.Linear(8, 8, bias=False, fuse_wgrad_accumulation=True, delay_wgrad_compute=True,
                  params_dtype=torch.float32)
layer.weight.main_grad = torch.zeros(8, 8)
observer = LiveObserver(numeric=True)
observer.watch([("", torch.nn.ModuleDict({"layer": layer}))])
with observer.installed():
    observer.recording = True
    observer.start_step(zeroed=True)
    x = torch.randn(4, 8)
    # One module called twice in a microbatch, the first call armed (a repeated MTP layer).
    layer(layer(x, is_first_microbatch=True), is_first_microbatch=False).sum().backward()
    untouched = bool(layer.weight.main_grad.eq(0).all())  # nothing written before backward_dw
    layer.backward_dw()
    layer.backward_dw()
    observer.recording = False
print(json.dumps({"untouched": untouched, "records": [
    [r.call, r.flag, r.decision, r.backward_seq, r.lossy] for r in observer.seen.calls],
    "lost": [c.lost for c in observer.seen.numeric]}))
"""


def test_delayed_wgrad_writes_are_attributed_to_their_calls():
    """TE's delay_wgrad_compute: the backward stores the wgrad GEMM, `backward_dw` runs it
    later; the writes still go to the calls whose backwards stored them, in order."""
    done = subprocess.run([sys.executable, "-c", DELAYED], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["untouched"]
    assert seen["records"] == [[1, True, "overwrite", 2, True], [2, False, "accumulate", 1, False]]
    assert seen["lost"][0] == 0 and seen["lost"][1] > 0


def test_the_prediction_and_the_observation_agree_row_by_row(tmp_path):
    """`qaudit diff check.json guard.json`: scripts/guard-demo's run against the same model
    written as a config: no module differs and no finding is only on one side."""
    config = tmp_path / "demo.yaml"
    config.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
                      "vocab_size: 128\nmtp_num_layers: 2\nmtp_use_repeated_layer: true\n")
    check = subprocess.run([sys.executable, "-m", "qaudit", "check", str(config), "--format",
                            "json", "--megatron", "0.19.2"], capture_output=True, text=True,
                           cwd=REPO, timeout=600)
    assert check.returncode == 1, check.stderr
    predicted = tmp_path / "check.json"
    predicted.write_text(check.stdout)
    code, _, stderr, _ = _guard(tmp_path, [], ["--mtp-layers", "2", "--repeated-mtp"])
    assert code == EXIT_STOPPED, stderr[-3000:]
    diff = subprocess.run([sys.executable, "-m", "qaudit", "diff", str(predicted),
                           str(tmp_path / "guard.json"), "--format", "json"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert diff.returncode == 0, diff.stderr
    document = json.loads(diff.stdout)
    assert document["modules"] == []
    assert all(not entries for entries in document["findings"].values())
    assert document["base"]["summary"] == document["head"]["summary"]


def test_a_torch_less_helper_python_in_the_launch_leaves_the_jobs_code(tmp_path):
    """Megatron-LM's start-up runs `make` in megatron/core/datasets, whose Makefile runs
    `python3 -m pybind11 --includes`; where that python3 has no torch, the guard used to fail
    its start there and turn a clean, watched run into exit 3."""
    notorch = tmp_path / "notorch"
    notorch.mkdir()
    (notorch / "torch.py").write_text("raise ImportError('no torch in this Python')\n")
    launch = ["bash", "-c", f"PYTHONPATH={notorch}:$PYTHONPATH {sys.executable} -c pass && "
              f'exec {sys.executable} "$@"', "job"]
    code, stdout, stderr, report = _guard(tmp_path, [], ["--mtp-layers", "2"], launcher=launch)
    assert code == 0, stderr[-3000:]
    assert _steps_trained(stdout) == 3 and report["exit_code"] == 0


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("repeated, expected", [(False, 0), (True, EXIT_STOPPED)],
                         ids=["per-depth", "repeated"])
def test_two_nodes_give_one_verdict_each_and_agree(tmp_path, repeated, expected):
    """`torchrun --nnodes 2 --node-rank {0,1}` under two `qaudit guard`s (localhost, a static
    rendezvous): the second node's ranks are not rank 0 and used to make it exit 3."""
    for attempt in range(3):
        port, nodes = _free_port(), []
        folder = tmp_path / f"try{attempt}"
        for node in (0, 1):
            work = folder / f"node{node}"
            work.mkdir(parents=True)
            command = [sys.executable, "-m", "qaudit", "guard", "--cpu", "--report",
                       str(work / "guard.json"), "--", sys.executable, "-m",
                       "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                       "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                       str(port), str(DEMO), "--mtp-layers", "2",
                       *(["--repeated-mtp"] if repeated else [])]
            nodes.append(subprocess.Popen(command, cwd=work, env=_env(), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outputs = [node.communicate(timeout=1800) for node in nodes]
        # The port was free when asked for and another process on the machine may have bound
        # it before node 0's store did: that launch is repeated on another port, not judged.
        if not any("eaddrinuse" in err.lower() or "address already in use" in err.lower()
                   for _, err in outputs):
            break
    codes = [node.returncode for node in nodes]
    assert codes == [expected, expected], [err[-2000:] for _, err in outputs]
    report = json.loads((folder / "node0" / "guard.json").read_text())
    assert report["guard"]["ranks"] == 2 and report["exit_code"] == expected
    assert not (folder / "node1" / "guard.json").exists()  # rank 0's node writes it


def test_a_guard_failing_on_one_rank_in_warn_mode_does_not_hang_the_others(tmp_path):
    """Rank 1's guard fails at the first watched step; rank 0 reaches the ranks' gather at the
    step's end and used to wait there for ever. Rank 1 now still joins it, and the job trains."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    import qaudit.guard.session as s\n"
        "    def broken(self, model):\n"
        "        raise RuntimeError('planted failure on rank 1')\n"
        "    s.GuardSession._begin_step = broken\n")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    code, stdout, stderr, report = _guard(tmp_path, ["--mode", "warn"],
                                          ["--mtp-layers", "2", "--repeated-mtp"],
                                          launcher=launcher, extra_path=[str(site)])
    assert code == 0, stderr[-3000:]
    assert _steps_trained(stdout) == 3
    assert "planted failure on rank 1" in stderr and "runs on unguarded" in stderr
    assert report is not None and report["guard"]["failed"]


def test_a_script_that_imports_transformer_engine_first_is_guarded(tmp_path):
    """Under --cpu the guard's start boots TE itself, inside the job's first `import
    transformer_engine`: the job must get that module, not a second run of TE's __init__
    (which lacked its submodules, and Megatron's TE wrappers failed on `te.common`)."""
    first = tmp_path / "te_first.py"
    first.write_text("import runpy, sys\nimport transformer_engine\n"
                     "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    # Stopped before the optimizer: guard-demo asks torch.cuda before importing Megatron,
    # and with TE imported first (the CPU pose on) it would clip gradients, which asserts
    # CUDA tensors on a CPU (a --cpu limit of its own, not this test's subject).
    code, stdout, stderr, report = _guard(tmp_path, [], ["--mtp-layers", "2", "--repeated-mtp"],
                                          launcher=[sys.executable, str(first)])
    assert code == EXIT_STOPPED, stderr[-3000:]
    assert "has no attribute 'common'" not in stderr
    assert {f["module"] for f in report["findings"] if f["rule"] == "QA001"} >= {
        "mtp.layers.0.eh_proj"}
