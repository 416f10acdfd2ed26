"""Counting the matrix products a piece of code dispatches (work counted, never timed)."""

from torch.utils._python_dispatch import TorchDispatchMode


class CountProducts(TorchDispatchMode):
    """Counts the aten matrix products (mm, bmm, addmm, matmul) dispatched inside it."""

    PRODUCTS = {"mm", "bmm", "addmm", "matmul"}

    def __init__(self):
        super().__init__()
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.PRODUCTS:
            self.products += 1
        return func(*args, **(kwargs or {}))


class CountWrites(TorchDispatchMode):
    """Counts the aten ops inside it that write every element of a new buffer (zeroing,
    filling): what a value-free run should not pay for."""

    WRITES = {"zero_", "zeros_like", "fill_", "zeros"}

    def __init__(self):
        super().__init__()
        self.writes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.WRITES:
            self.writes += 1
        return func(*args, **(kwargs or {}))
