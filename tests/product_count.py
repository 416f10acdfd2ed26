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
