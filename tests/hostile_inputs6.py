"""Generator of multi-process guard jobs for `scripts/fuzz` (family `guardjobs`, issue 44 item
"What a user can do" 3): `qaudit guard` around a job of several Python processes, in
sequence and in parallel (a bash script, or one process alone), with the same or different
RANK/LOCAL_RANK, retry wrappers, a second phase, sweeps without `set -e` and chains that
stop at the first failure, crashes, deaths by signal, exits with various codes, processes
that never import Megatron, processes whose guard cannot start (a torch-less Python that
imports Megatron), processes that leave the guard's verdict (clean, findings, a stop for
lost gradients, the guard's own failure), rarely a real guarded training step on a tiny
Megatron-shaped stack (torch, the real guard, QA001 on a repeated module) and torchrun with
1-2 such ranks, and sometimes the same job on two "nodes" (one `qaudit guard` each, the
second without rank 0).

The oracle computes the expected exit code, verdict word and report from the job's
description alone: which processes run (bash's rules for `;`, `|| exit`, retries and
parallel groups, simulated here), each one's exit code and what it leaves, and the rules of
docs/guard.md (a stop anywhere: 10; the guard's failure in stop mode: 3; a job that exited 0
with nothing watched in stop mode: 3; else the job's own code; findings survive later
processes). Nothing of the guard's code is used to compute it. Also checked: no deadlock
(a deadline), nothing left running (every process writes its pid; each must have ended),
no traceback from qaudit, the report only where a rank-0 verdict exists, both nodes agree.

Most processes are plain Pythons that import neither torch nor Megatron (tens of ms): a
"simulated" watched process writes the result file the guard's child writes
(qaudit/guard/verdict.py's format, created exclusively) and exits as the guard would make it
exit; the real guard runs in the `startfail`, `train` and `torchrun` processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hostile_inputs import Result

PY = sys.executable
STOP, WARN = "stop", "warn"

# --- the processes ----------------------------------------------------------------------------

PROC = r'''
import json, os, signal, sys
spec = json.loads(sys.argv[1])
here = spec["dir"]
open(os.path.join(here, "pids", str(os.getpid())), "w").close()
with open(os.path.join(here, "ran.log"), "a") as log:
    log.write(spec["id"] + "\n")
kind, mode = spec["kind"], spec["mode"]
rank = int(os.environ.get("RANK", "0") or 0)

def leave(data):
    """The file the guard's child leaves (qaudit/guard/verdict.py: rank, pid, counter)."""
    results = os.environ.get("QAUDIT_GUARD_RESULTS")
    if not results:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    name = f"result-rank{rank}-pid{os.getpid()}-0.json"
    with os.fdopen(os.open(os.path.join(results, name), flags, 0o600), "w") as out:
        json.dump(data, out)

if kind == "sim":
    verdict = spec["verdict"]
    if verdict == "failed":
        leave({"rank": rank, "failed": "RuntimeError: simulated", "stop": False,
               "peer_lost": False})
        if mode == "stop":
            os._exit(3)
    else:
        findings = verdict == "findings"
        data = {"rank": rank, "stop": findings and mode == "stop", "findings": findings,
                "steps": 1}
        if rank == 0:
            data["report"] = {"simulated": True, "exit_code": 10 if data["stop"] else 0}
            data["said"] = "qaudit guard: simulated verdict"
        leave(data)
        if data["stop"]:
            os._exit(10)
elif kind == "startfail":
    sys.path[:0] = [spec["notorch"], spec["stack"]]
    import megatron  # the guard's start imports torch here, and cannot
elif kind == "train":
    sys.path[:0] = [spec["stack"]]
    exec(open(spec["trainer"]).read())
elif kind == "crash":
    raise RuntimeError("planted crash")
elif kind == "killself":
    os.kill(os.getpid(), spec["signal"])
sys.exit(spec["code"])
'''

TRAINER = r'''
import megatron  # the guard starts here
from megatron.core.pipeline_parallel import schedules
import torch
import transformer_engine.pytorch as te
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    torch.distributed.init_process_group("gloo")
repeated = spec["repeated"]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer, self.other = te.Linear(4), te.Linear(4)

    def forward(self, x, first):
        x = self.layer(x, is_first_microbatch=first)
        if repeated:  # one module called twice, the first call armed: QA001
            return self.layer(x, is_first_microbatch=False)
        return self.other(x, is_first_microbatch=first)


if spec.get("broken") == int(os.environ.get("RANK", "0") or 0):
    class Model(Model):  # this rank's guard fails at its first watched step
        def named_modules(self, *args, **kwargs):
            raise RuntimeError("planted: this rank's guard cannot walk the model")


torch.manual_seed(0)
model = Model()
for step in range(spec["steps"]):
    schedules.forward_backward_no_pipelining(
        forward_step_func=lambda data, chunks, microbatch: chunks[0](torch.randn(3, 4),
                                                                     microbatch == 0),
        data_iterator=None, model=[model], num_microbatches=2)
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
'''

# A Megatron- and TE-shaped stack: the schedule the guard wraps, TE's Linear and GEMM entry
# point as the observer looks for them (as tests/test_guard.py's fake_te, on disk).
STACK = {
    "megatron/__init__.py": "",
    "megatron/core/__init__.py": "",
    "megatron/core/pipeline_parallel/__init__.py": "",
    "megatron/core/pipeline_parallel/schedules.py": '''
def forward_step(forward_step_func, data_iterator, model, num_microbatches, input_tensor,
                 forward_data_store, config, current_microbatch=None):
    return forward_step_func(data_iterator, model, current_microbatch), None


def backward_step(input_tensor, output_tensor, output_tensor_grad, model_type, config):
    output_tensor.sum().backward()


def forward_backward_no_pipelining(*, forward_step_func, data_iterator, model,
                                   num_microbatches, forward_only=False, **kwargs):
    for microbatch in range(num_microbatches):
        output, _ = forward_step(forward_step_func, data_iterator, model, num_microbatches,
                                 None, [], None, current_microbatch=microbatch)
        if not forward_only:
            backward_step(None, output, None, None, None)
    return []
''',
    "transformer_engine/__init__.py": "",
    "transformer_engine/pytorch/cpp_extensions/__init__.py":
        "from transformer_engine.pytorch.cpp_extensions.gemm import general_gemm\n",
    "transformer_engine/pytorch/cpp_extensions/gemm.py": '''
def general_gemm(a, b, out_dtype=None, accumulate=False, layout="TN", out=None, grad=False):
    product = b.t() @ a
    if out is None:
        return product, None
    if accumulate:
        out.add_(product)
    else:
        out.copy_(product)
    return out, None
''',
    "transformer_engine/pytorch/module/__init__.py": "",
    "transformer_engine/pytorch/module/linear.py":
        "from transformer_engine.pytorch.cpp_extensions.gemm import general_gemm\n",
    "transformer_engine/pytorch/__init__.py": '''
import sys
import torch
import transformer_engine.pytorch.module.linear  # noqa: F401


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, flag):
        ctx.save_for_backward(x)
        ctx.weight, ctx.flag = weight, flag
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        accumulate = not ctx.flag if ctx.flag is not None else True
        gemm = sys.modules["transformer_engine.pytorch.module.linear"].general_gemm
        gemm(x, grad, accumulate=accumulate, layout="NT", out=ctx.weight.main_grad, grad=True)
        return grad @ ctx.weight, None, None


class Linear(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, width))
        self.weight.main_grad = torch.zeros(width, width)
        self.fuse_wgrad_accumulation = True

    def forward(self, x, is_first_microbatch=None):
        return _LinearFunction.apply(x, self.weight, is_first_microbatch)
''',
}


@dataclass
class Proc:
    """One Python process of the job. kind: plain | crash | killself | sim | startfail | train
    | torchrun (a torchrun of `ranks` train processes)."""
    id: str
    kind: str
    code: int = 0
    rank: int = 0
    verdict: str = "clean"  # sim: clean | findings | failed
    signal: int = 0
    repeated: bool = False  # train: a module called twice, the first call armed
    steps: int = 1  # train: steps it runs
    ranks: int = 1  # torchrun
    broken: int = -1  # torchrun: the rank whose guard fails at its first watched step


@dataclass
class Stage:
    """`single` (one process), `parallel` (all at once, the status the first non-zero one's) or
    `retry` (each in turn until one exits 0); `strict`: the script exits on its failure."""
    form: str
    procs: list[Proc]
    strict: bool = False


@dataclass
class GuardJob:
    family: str
    mode: str
    steps: int  # --steps
    stages: list[Stage]
    direct: bool  # one process, the launch command itself (no shell)
    nodes: int = 1
    report: bool = True
    seconds: float = 600.0
    argv: list[str] = field(default_factory=list)
    note: str = ""

    def describe(self) -> str:
        parts = []
        for stage in self.stages:
            procs = ",".join(_proc_words(p) for p in stage.procs)
            parts.append(f"{stage.form}{'!' if stage.strict else ''}[{procs}]")
        return (f"{self.family}: mode={self.mode} steps={self.steps} nodes={self.nodes} "
                f"{'direct ' if self.direct else ''}{' ; '.join(parts)}")

    def run(self, folder: Path) -> Result:
        return run_case(self, folder)


def _proc_words(p: Proc) -> str:
    extra = {"sim": p.verdict, "killself": f"sig{p.signal}",
             "train": f"{'rep' if p.repeated else 'ok'}x{p.steps}",
             "torchrun": f"{p.ranks}x{'rep' if p.repeated else 'ok'}x{p.steps}"
                         + (f"/broken{p.broken}" if p.broken >= 0 else "")}.get(p.kind, "")
    return f"{p.id}:{p.kind}{'/' + extra if extra else ''}/r{p.rank}/c{p.code}"


# --- the generator ------------------------------------------------------------------------------

CODES = (0, 0, 0, 0, 1, 2, 3, 7, 10, 42)


def _proc(r: random.Random, pid: str, rank: int, heavy: bool) -> Proc:
    draw = r.random()
    code = r.choice(CODES)
    if heavy and draw < 0.5:
        return Proc(pid, "train", code=r.choice((0, 0, 5)), rank=rank, repeated=r.random() < 0.5,
                    steps=r.choice((1, 2, 3)))
    if draw < 0.30:
        return Proc(pid, "plain", code=code, rank=rank)
    if draw < 0.36:
        return Proc(pid, "crash", code=code, rank=rank)
    if draw < 0.41:
        return Proc(pid, "killself", code=code, rank=rank,
                    signal=int(r.choice((signal.SIGTERM, signal.SIGKILL))))
    if draw < 0.49:
        return Proc(pid, "startfail", code=code, rank=rank)
    verdict = r.choice(("clean", "clean", "findings", "findings", "failed"))
    return Proc(pid, "sim", code=code, rank=rank, verdict=verdict)


def gen_guardjobs(r: random.Random, folder: Path) -> GuardJob:
    mode = r.choice((STOP, WARN))
    steps = r.choice((1, 1, 2))
    heavy_left = 1 if r.random() < 0.06 else 0  # a real guarded step, torch and all
    torchrun = r.random() < 0.015
    direct = r.random() < 0.15 and not torchrun
    counter = iter(range(1000))
    same_rank = r.random() < 0.5  # every process rank 0 (a retry, a second phase) or not
    stages = []
    for _ in range(1 if direct else r.randint(1, 4)):
        form = "single" if direct else r.choice(("single", "single", "parallel", "retry"))
        count = 1 if form == "single" else r.randint(2, 3)
        procs = []
        for index in range(count):
            rank = 0 if same_rank else (index if form == "parallel" else r.randint(0, 3))
            heavy = heavy_left > 0 and r.random() < 0.5
            proc = _proc(r, f"p{next(counter)}", rank, heavy)
            if proc.kind == "train":
                heavy_left -= 1
            procs.append(proc)
        stages.append(Stage(form, procs, strict=not direct and r.random() < 0.4))
    if torchrun:
        stages.insert(r.randint(0, len(stages)), Stage("single", [Proc(
            f"p{next(counter)}", "torchrun", ranks=r.choice((1, 2)), repeated=r.random() < 0.5,
            steps=r.choice((1, 2)), code=r.choice((0, 0, 4)))], strict=r.random() < 0.4))
    heavy = any(p.kind in ("train", "torchrun") for s in stages for p in s.procs)
    nodes = 2 if not heavy and not direct and r.random() < 0.1 else 1
    job = GuardJob("guardjobs", mode, steps, stages, direct, nodes=nodes,
                   report=r.random() < 0.7)
    _write_support(folder)
    return job


def _write_support(folder: Path) -> None:
    (folder / "proc.py").write_text(PROC)
    (folder / "trainer.py").write_text(TRAINER)
    (folder / "pids").mkdir()
    for name, text in STACK.items():
        (folder / "stack" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "stack" / name).write_text(text)
    (folder / "notorch").mkdir()
    (folder / "notorch" / "torch.py").write_text("raise ImportError('no torch here')\n")


# --- the launch command ---------------------------------------------------------------------------

def _spec(job: GuardJob, proc: Proc, folder: Path) -> str:
    kind = "train" if proc.kind == "torchrun" else proc.kind  # what each of its ranks runs
    return json.dumps({"dir": str(folder), "id": proc.id, "kind": kind, "mode": job.mode,
                       "code": proc.code, "verdict": proc.verdict, "signal": proc.signal,
                       "repeated": proc.repeated, "steps": proc.steps, "broken": proc.broken,
                       "stack": str(folder / "stack"), "notorch": str(folder / "notorch"),
                       "trainer": str(folder / "trainer.py")})


def _command(job: GuardJob, proc: Proc, folder: Path) -> str:
    spec = shlex.quote(_spec(job, proc, folder))
    if proc.kind == "torchrun":
        return (f"{shlex.quote(PY)} -m torch.distributed.run --standalone --nproc-per-node "
                f"{proc.ranks} {shlex.quote(str(folder / 'proc.py'))} {spec}")
    rank = f"$((QA_NODE_BASE + {proc.rank}))"
    return (f"RANK={rank} LOCAL_RANK={proc.rank} {shlex.quote(PY)} "
            f"{shlex.quote(str(folder / 'proc.py'))} {spec}")


def launch_command(job: GuardJob, folder: Path) -> list[str]:
    if job.direct:
        proc = job.stages[0].procs[0]
        # `env` execs the Python: it is still the launch command's first process
        return ["env", f"RANK={proc.rank}", f"LOCAL_RANK={proc.rank}", PY,
                str(folder / "proc.py"), _spec(job, proc, folder)]
    lines = []
    for number, stage in enumerate(job.stages):
        commands = [_command(job, p, folder) for p in stage.procs]
        if stage.form == "single":
            line = commands[0]
        elif stage.form == "parallel":
            started = " ".join(f"{c} & a{number}_{i}=$!;" for i, c in enumerate(commands))
            waited = " ".join(f"wait $a{number}_{i}; s{number}_{i}=$?;"
                              for i in range(len(commands)))
            first = "0"
            for i in reversed(range(len(commands))):
                first = f"(s{number}_{i} != 0 ? s{number}_{i} : {first})"
            line = f"{{ {started} {waited} (exit $(( {first} ))); }}"
        else:
            cases = " ".join(f"{i + 1}) {c};;" for i, c in enumerate(commands))
            tries = " ".join(str(i + 1) for i in range(len(commands)))
            line = f"for try in {tries}; do case $try in {cases} esac && break; done"
        lines.append(line + (" || exit $?" if stage.strict else ""))
    return ["bash", "-c", "\n".join(lines)]


# --- the oracle (the job's description and docs/guard.md only) -------------------------------

@dataclass
class Ran:
    proc: Proc
    code: int  # as bash (or qaudit, for the launch command itself) sees it
    leaves: list[str]  # per process of it: stop | findings | clean | failed
    rank0_verdict: bool  # a rank 0 left a verdict (the report comes from it)


def _outcome(job: GuardJob, p: Proc) -> Ran:
    stop = job.mode == STOP
    if p.kind == "plain":
        return Ran(p, p.code, [], False)
    if p.kind == "crash":
        return Ran(p, 1, [], False)
    if p.kind == "killself":
        return Ran(p, 128 + p.signal, [], False)
    if p.kind == "startfail":
        return Ran(p, 3 if stop else p.code, ["failed"], False)
    if p.kind == "sim":
        if p.verdict == "failed":
            return Ran(p, 3 if stop else p.code, ["failed"], False)
        if p.verdict == "findings":
            return Ran(p, 10 if stop else p.code, ["stop" if stop else "findings"], p.rank == 0)
        return Ran(p, p.code, ["clean"], p.rank == 0)
    if p.kind == "torchrun" and p.broken >= 0:
        return _broken_torchrun(job, p)
    # train / torchrun: a verdict only when the process runs the watched steps
    watched = p.steps >= job.steps
    if not watched:
        leaves = []
        worker = p.code
    elif p.repeated:
        leaves = ["stop" if stop else "findings"]
        worker = 10 if stop else p.code
    else:
        leaves = ["clean"]
        worker = p.code
    if p.kind == "train":
        return Ran(p, worker, leaves, bool(leaves) and p.rank == 0)
    # torchrun: each rank leaves the agreed verdict; its own code 1 when a worker failed
    return Ran(p, 0 if worker == 0 else 1, leaves * p.ranks, bool(leaves))


def _broken_torchrun(job: GuardJob, p: Proc) -> Ran:
    """One rank's guard fails at its first watched step. stop: that rank ends (3), the others
    lose it in the gather (or never get there): the guard's failure, torchrun's 1. warn: the
    failed rank still joins the gather at the end of the watched steps; the other ranks'
    verdict stands and everyone trains on (no deadlock); rank 0 speaks only if it is not the
    failed one."""
    if job.mode == STOP:
        return Ran(p, 1, ["failed"], False)
    watched = p.steps >= job.steps
    leaves = ["failed"]
    if watched and p.ranks > 1:
        leaves += ["findings" if p.repeated else "clean"] * (p.ranks - 1)
    return Ran(p, 0 if p.code == 0 else 1, leaves, bool(leaves[1:]) and p.broken != 0)


def job_status(job: GuardJob) -> tuple[int, list[Ran]]:
    """The launch command's own exit code (bash's rules) and the processes that ran."""
    ran: list[Ran] = []
    status = 0
    for stage in job.stages:
        if stage.form == "retry":
            for p in stage.procs:
                outcome = _outcome(job, p)
                ran.append(outcome)
                if outcome.code == 0:
                    break
            status = outcome.code
        else:
            outcomes = [_outcome(job, p) for p in stage.procs]
            ran.extend(outcomes)
            status = next((o.code for o in outcomes if o.code != 0), 0)
        if stage.strict and status != 0:
            break
    return status, ran


def expected(job: GuardJob) -> tuple[int, list[Ran], str]:
    """(exit code, the processes that ran, the verdict word: stop|failed|findings|clean|none)."""
    job_code, ran = job_status(job)
    leaves = [leaf for r in ran for leaf in r.leaves]
    if "stop" in leaves:
        return 10, ran, "stop"
    if "failed" in leaves:
        return (3 if job.mode == STOP else job_code), ran, "failed"
    if not leaves:
        unvouched = job_code == 0 and job.mode == STOP
        return (3 if unvouched else job_code), ran, "none"
    return job_code, ran, ("findings" if "findings" in leaves else "clean")


# --- the run ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def _job_output_to(path: Path):
    """The job's own output (it inherits file descriptors 1 and 2) into a file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def run_case(job: GuardJob, folder: Path) -> Result:
    from hostile_inputs import _deadline
    from mutations import run_cli

    start = time.perf_counter()
    want, ran, word = expected(job)
    problems: list[str] = []
    codes, outs, errs = [], [], []
    previous_base = os.environ.get("QA_NODE_BASE")
    for node in range(job.nodes):
        report = folder / f"report-node{node}.json"
        job.argv = ["guard", "--mode", job.mode, "--steps", str(job.steps),
                    *(["--report", str(report)] if job.report else []), "--",
                    *launch_command(job, folder)]
        # Node 1 holds ranks 4.. (no rank 0): its launcher decides from the verdict alone.
        os.environ["QA_NODE_BASE"] = str(4 * node)
        try:
            with _deadline(job.seconds), _job_output_to(folder / f"job-output-{node}.txt"):
                code, out, err = run_cli(job.argv)
        except TimeoutError as exc:
            code, out, err = -1, "", f"deadlock? {exc}"
        codes.append(code)
        outs.append(out)
        errs.append(err)
        problems += _check_node(job, folder, node, code, err, want, ran, word, report)
    if previous_base is None:
        os.environ.pop("QA_NODE_BASE", None)
    else:
        os.environ["QA_NODE_BASE"] = previous_base
    if len(set(codes)) > 1:
        problems.append(f"the nodes disagree: {codes}")
    left = [int(p.name) for p in (folder / "pids").iterdir() if _alive(int(p.name))]
    if left:
        problems.append(f"left running: {left}")
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    seconds = time.perf_counter() - start
    return Result(codes[0], "\n".join(outs), "\n".join(errs), seconds, problems)


def _check_node(job: GuardJob, folder: Path, node: int, code: int, err: str, want: int,
                ran: list[Ran], word: str, report: Path) -> list[str]:
    problems = []
    if code == -1:
        return [err]
    if code != want:
        problems.append(f"node {node}: exit {code}, the oracle says {want} ({word})")
    if "Traceback" in err or "internal error" in err:
        problems.append(f"node {node}: traceback or internal error from qaudit")
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if word in ("findings", "clean") and f"verdict: {word}" not in last \
            and "interrupted" not in last:
        problems.append(f"node {node}: last line {last!r}, the oracle's verdict {word}")
    if word == "none" and "nothing was checked" not in last:
        problems.append(f"node {node}: last line {last!r}, but nothing was watched")
    has_report = node == 0 and any(r.rank0_verdict for r in ran)
    if job.report and report.exists() != has_report:
        problems.append(f"node {node}: report {'written' if report.exists() else 'missing'}, "
                        f"the oracle says {'one' if has_report else 'none'}")
    if job.report and report.exists():
        try:
            written = json.loads(report.read_text())["exit_code"]
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"node {node}: report unreadable: {exc}")
        else:
            if written != code:
                problems.append(f"node {node}: report exit_code {written}, exit {code}")
    logged = (folder / "ran.log").read_text().split() if (folder / "ran.log").exists() else []
    # Which processes ran (torchrun's ranks log one line each).
    expected_ids = sorted(r.proc.id for r in ran for _ in range(
        r.proc.ranks if r.proc.kind == "torchrun" else 1))
    if sorted(logged) != expected_ids:
        problems.append(f"node {node}: processes ran {sorted(logged)}, the oracle says "
                        f"{expected_ids}")
    (folder / "ran.log").unlink(missing_ok=True)
    return problems


def gen_guardjobs_torchrun(r: random.Random, folder: Path) -> GuardJob:
    """Only torchrun jobs (1-2 real ranks), most with one rank whose guard fails, between
    simulated processes: the family the mix draws rarely, on its own (not in the mix)."""
    mode = r.choice((STOP, WARN))
    ranks = r.choice((1, 2, 2))
    run = Proc("p0", "torchrun", ranks=ranks, repeated=r.random() < 0.5,
               steps=r.choice((1, 2)), code=r.choice((0, 0, 4)),
               broken=r.randrange(ranks) if r.random() < 0.7 else -1)
    stages = [Stage("single", [run], strict=r.random() < 0.4)]
    if r.random() < 0.5:
        verdict = r.choice(("clean", "findings", "failed"))
        stages.insert(r.randint(0, 1), Stage("single", [Proc("p1", "sim", verdict=verdict,
                                                             code=r.choice(CODES))]))
    job = GuardJob("guardjobs_torchrun", mode, r.choice((1, 1, 2)), stages, False,
                   report=r.random() < 0.7)
    _write_support(folder)
    return job


FAMILIES6 = {"guardjobs": gen_guardjobs, "guardjobs_torchrun": gen_guardjobs_torchrun}


def main() -> None:  # one input by hand: python tests/hostile_inputs6.py SEED
    r = random.Random(sys.argv[1])
    with tempfile.TemporaryDirectory() as work:
        job = gen_guardjobs(r, Path(work))
        print(job.describe())
        print(expected(job)[0], expected(job)[2])
        print(run_case(job, Path(work)))


if __name__ == "__main__":
    main()
