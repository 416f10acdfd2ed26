"""Make a CPU-only torch look enough like a CUDA build for Transformer Engine's Python.

TE's pure-Python module code asks torch about the GPU (capability, streams, device index),
checks `tensor.is_cuda`, and allocates with `device="cuda"` or a device index. On a CPU-only
torch every one of those fails. `pose_as_cuda` answers them once, for this process only
(docs/te-runtime.md lists each patch and why TE needs it). The original answers stay
reachable through `real_cuda_available`, so qaudit itself never mistakes the pose for a GPU.
"""

from __future__ import annotations

import contextlib
import types

import torch

# Blackwell (B200): every recipe TE knows is available there, and TE picks its non-TN FP8
# layouts (one FP8 buffer serves row- and column-wise use).
POSED_CAPABILITY = (10, 0)
POSED_CUDA_VERSION = "13.0"

_real_is_available = torch.cuda.is_available
_posing = False


def real_cuda_available() -> bool:
    """Whether a real CUDA device is visible, whatever the pose says."""
    return bool(_real_is_available())


def posing() -> bool:
    return _posing


_CPU = torch.device("cpu")


def _is_cuda_device(device) -> bool:
    # Called on every allocation TE makes: the common cases first, by exact type.
    kind = type(device)
    if kind is torch.device:
        return device.type == "cuda"
    if kind is str:
        return device.startswith("cuda")
    if kind is int:
        return True
    return False


# torch functions TE calls with device="cuda" (or a device index): wrapped to allocate on
# the CPU. Wrapping these few, rather than a TorchFunctionMode over every torch call, costs
# nothing elsewhere and also holds inside autograd's backward, where a mode is not active.
_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "as_tensor", "arange", "rand", "randn",
              "randint", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
              "randn_like", "empty_strided", "eye", "linspace")
_TENSOR_FACTORIES = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor")


def _on_cpu(fn):
    def wrapper(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            kwargs["device"] = _CPU
        return fn(*args, **kwargs)

    wrapper.__name__ = getattr(fn, "__name__", "factory")
    wrapper.__wrapped__ = fn
    return wrapper


def _to_on_cpu(to):
    def wrapper(self, *args, **kwargs):
        moved = False
        if args and _is_cuda_device(args[0]):
            args, moved = (_CPU, *args[1:]), True
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            kwargs["device"], moved = _CPU, True
        # A move "to CUDA" and nothing else is already done: every tensor is on the CPU. TE's
        # quantized tensors dequantize inside their own `to` (TE 2.20's MXFP8 dequantize moves
        # a CPU tensor to CUDA first, which would recurse).
        if moved and len(args) <= 1 and set(kwargs) <= {"device", "non_blocking"} \
                and self.device.type == "cpu":
            return self
        return to(self, *args, **kwargs)

    return wrapper


class _Properties:
    name = "qaudit CPU stand-in"
    major, minor = POSED_CAPABILITY
    multi_processor_count = 132
    total_memory = 80 << 30


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        self.cuda_stream = 0

    def wait_stream(self, *args) -> None:
        pass

    def wait_event(self, *args) -> None:
        pass

    def record_event(self, event=None):
        return event or _Event()

    def synchronize(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class _Event:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args) -> None:
        pass

    def wait(self, *args) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        return 0.0


class _OnPosedDevice(torch.Tensor):
    """A host tensor that answers `.device` with the posed CUDA device."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)


def on_posed_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as TE's checks of `.device.type == "cuda"` take it: TE 2.19+'s grouped-tensor
    GroupedLinear refuses split sizes that are not on the GPU (where a caller on a GPU keeps
    them, for CUDA-graph safety). Only that attribute differs; its data stays on the CPU."""
    return tensor.as_subclass(_OnPosedDevice)


def _nothing():
    """A fresh do-nothing function per patched name (torch's dynamo refuses one object
    registered under two torch names)."""
    return lambda *args, **kwargs: None


def pose_as_cuda() -> None:
    """Apply the pose (idempotent). Never undone: it lasts as long as the audit process."""
    global _posing
    if _posing:
        return
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.get_device_capability = lambda device=None: POSED_CAPABILITY
    cuda.get_device_properties = lambda device=None: _Properties()
    cuda.get_device_name = lambda device=None: _Properties.name
    cuda.synchronize = _nothing()
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.current_stream = lambda device=None: _Stream()
    cuda.default_stream = lambda device=None: _Stream()
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.is_current_stream_capturing = lambda: False
    cuda.set_device = _nothing()
    cuda.device = lambda device=None: contextlib.nullcontext()  # TE 2.8 enters it in forward
    cuda.nvtx = types.SimpleNamespace(range_push=_nothing(), range_pop=_nothing(), mark=_nothing(),
                                      range=lambda *a, **k: contextlib.nullcontext())
    torch.version.cuda = POSED_CUDA_VERSION  # TE parses it for Float8 block-scaling support
    torch.Tensor.is_cuda = property(lambda self: True)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    # Every tensor claims CUDA, so Megatron keeps a device-to-host copy's source alive on the
    # posed stream (moe_utils.maybe_move_tensor_to_cpu); CPU memory has no stream to order.
    torch.Tensor.record_stream = lambda self, stream: None
    # TE 2.8's quantized tensors pass device=torch.cuda.current_device() to the subclass maker.
    make_wrapper = torch.Tensor._make_wrapper_subclass

    def _make_wrapper_subclass(cls, *args, **kwargs):
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
        return make_wrapper(cls, *args, **kwargs)

    torch.Tensor._make_wrapper_subclass = staticmethod(_make_wrapper_subclass)
    for name in _FACTORIES:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    for name in _TENSOR_FACTORIES:
        setattr(torch.Tensor, name, _on_cpu(getattr(torch.Tensor, name)))
    torch.Tensor.to = _to_on_cpu(torch.Tensor.to)
    _posing = True
