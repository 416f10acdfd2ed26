"""Counting the aten ops a piece of code dispatches (work counted, never timed)."""

from torch.utils._python_dispatch import TorchDispatchMode


class _CountOps(TorchDispatchMode):
    """Counts the aten ops named in OPS dispatched inside it."""

    OPS: frozenset[str] = frozenset()

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class CountProducts(_CountOps):
    """The matrix products (mm, bmm, addmm, matmul)."""

    OPS = frozenset({"mm", "bmm", "addmm", "matmul"})

    @property
    def products(self) -> int:
        return self.count


class CountWrites(_CountOps):
    """The ops that write every element of a new buffer (zeroing, filling): what a value-free
    run should not pay for."""

    OPS = frozenset({"zero_", "zeros_like", "fill_", "zeros"})

    @property
    def writes(self) -> int:
        return self.count
