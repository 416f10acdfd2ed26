"""torchrun: one pipeline stage per process.

Under `torchrun --nproc-per-node P --no-python qaudit check ...` each process builds the model,
keeps its own pipeline stage and trains it with its neighbours over point-to-point messages (gloo
for CPU tensors, NCCL for CUDA ones). The ranks then exchange what their probes saw, so that every
rank judges the same merged facts and reaches the same exit code; rank 0 prints.

Input errors must also end every rank the same way: a rank that failed alone would leave the
others waiting for its messages, so each phase that can fail on bad input is agreed on.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, TypeVar

from qaudit.errors import EnvironmentProblem, InputError

T = TypeVar("T")
# Long enough for a large stage's build on a busy machine; a rank that crashes is torn down by
# torchrun well before this.
TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class World:
    rank: int
    size: int

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise EnvironmentProblem(f"environment variable {name}={value!r} is not an integer "
                                 "(qaudit reads torchrun's RANK and WORLD_SIZE)") from None


def world_from_environment() -> World | None:
    """The torchrun world this process belongs to; None for a plain single process."""
    size, rank = _env_int("WORLD_SIZE"), _env_int("RANK")
    if size is None or size <= 1:
        return None
    if rank is None or not 0 <= rank < size:
        raise EnvironmentProblem(f"WORLD_SIZE={size} but RANK={os.environ.get('RANK')!r}: "
                                 "start qaudit under torchrun, which sets both")
    return World(rank, size)


def processes_on_this_machine(world: World | None) -> int:
    if world is None:
        return 1
    return _env_int("LOCAL_WORLD_SIZE") or 1


def join(world: World) -> None:
    """Join the process group: gloo for CPU tensors, plus NCCL for CUDA ones when a GPU is
    visible (whichever runtime and device the audit then picks)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "gloo"
    if torch.cuda.is_available():
        local = _env_int("LOCAL_RANK") or 0
        torch.cuda.set_device(local)
        backend = "cpu:gloo,cuda:nccl"
    try:
        dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=TIMEOUT)
    except (RuntimeError, ValueError) as exc:
        raise EnvironmentProblem(f"could not join the torchrun process group ({backend}): {exc}") \
            from None


def exit_together(code: int) -> None:
    """End this process with the highest code any rank reached, at the same moment as the
    others: torchrun kills the remaining workers as soon as one exits non-zero, which would
    replace their codes with a signal."""
    import torch.distributed as dist

    code = max(all_gather(code))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def all_gather(value: object) -> list:
    """Every rank's `value`, in rank order, on every rank. Our own pickle-over-bytes, not
    torch's all_gather_object: that one needs numpy, which qaudit does not depend on. The
    bytes come from this job's own processes, as with torch's."""
    import torch
    import torch.distributed as dist

    data = pickle.dumps(value)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = max(int(s) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    received = [torch.empty(longest, dtype=torch.uint8) for _ in sizes]
    dist.all_gather(received, mine)
    return [pickle.loads(ctypes.string_at(chunk.data_ptr(), int(n)))
            for chunk, n in zip(received, sizes)]


def agreed(world: World | None, phase: Callable[[], T]) -> T:
    """Run `phase` on every rank; if it failed on bad input anywhere, fail the same way on
    every rank (the lowest failing rank's error, named by rank when it is not this one)."""
    if world is None:
        return phase()
    failure: InputError | EnvironmentProblem | None = None
    result = None
    try:
        result = phase()
    except (InputError, EnvironmentProblem) as exc:
        failure = exc
    outcomes = all_gather(None if failure is None else (type(failure).__name__, str(failure)))
    for rank, outcome in enumerate(outcomes):
        if outcome is None:
            continue
        if rank == world.rank and failure is not None:
            raise failure
        kind, message = outcome
        error = InputError if kind == InputError.__name__ else EnvironmentProblem
        raise error(f"rank {rank}: {message}")
    return result  # type: ignore[return-value]
