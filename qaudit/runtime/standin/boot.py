"""The room's boot: the one way in (`enter`) for each of its three users.

What a process without a GPU needs to run the user's Transformer Engine or Megatron: TE's own
Python on the kernel stand-in (te_python.py) or qaudit's stand-in `transformer_engine`
(te_package.py) unless a real TE imports and CUDA works, pure-PyTorch stand-ins for
Megatron's CUDA-only calls, and torch.cuda's answers for a CPU process. The te runtime on a
CPU (qaudit/runtime/__init__.py) needs TE alone; the cross-check's worker enters the rest
around one upstream build (qaudit/crosscheck/build_scope.py, which undoes it afterwards);
`qaudit guard --cpu` keeps it for the life of the process (qaudit/guard/cpu.py).
Each replaced CUDA-only call is listed, with its upstream path, in docs/cross-check.md.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import os
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from qaudit.runtime.standin import gemm as standin_gemm, mamba as standin_mamba, te_package as standin_te
from qaudit.runtime.standin.environ_vars import temporarily_set
from qaudit.errors import EnvironmentProblem

if TYPE_CHECKING:
    from qaudit.runtime.standin.side import TESide

# Megatron modules that import triton unconditionally at their top and that the GPT/MoE build
# imports (their kernels are never called on the cross-check's path): replaced by empty
# modules. A fake `triton` package instead would make torch's inductor try to use it. These
# are 0.19.2's; Megatron main moved its Mamba kernels (ssm/ops/mamba2/, ssm/ops/common/), so
# any other Megatron module whose source imports triton at its top level is found by
# `_TritonKernelFinder` when imported.
TRITON_MODULES = (
    "megatron.core.transformer.moe.ops.paged_stash",
    "megatron.core.ssm.ops.ssd_bmm",
    "megatron.core.ssm.ops.ssd_chunk_scan",
    "megatron.core.ssm.ops.ssd_chunk_state",
    "megatron.core.ssm.ops.ssd_state_passing",
    "megatron.core.ssm.ops.ssd_combined",
    "megatron.core.ssm.ops.causal_conv1d_varlen",
)
_TOP_LEVEL_TRITON = re.compile(rb"^(?:import triton\b|from triton[ .])", re.MULTILINE)


class _TritonKernelFinder(importlib.abc.MetaPathFinder):
    """Serves a Megatron module whose source imports triton at its top level as a module of
    kernels that raise NotOnCPU when called (`_kernel_module`); the source is read, never run."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("megatron.") or importlib.util.find_spec("triton") is not None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not origin or not origin.endswith(".py") or spec.submodule_search_locations:
            return None
        try:
            with open(origin, "rb") as source:
                if not _TOP_LEVEL_TRITON.search(source.read()):
                    return None
        except OSError:
            return None
        return importlib.machinery.ModuleSpec(name, _KernelLoader())


class _KernelLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _kernel_module(spec.name)

    def exec_module(self, module) -> None:
        pass


@contextlib.contextmanager
def _triton_kernel_finder() -> Iterator[None]:
    finder = _TritonKernelFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def _fused_wgrad_module() -> types.ModuleType:
    module = types.ModuleType("fused_weight_gradient_mlp_cuda",
                              "qaudit's pure-PyTorch stand-in for APEX's fused wgrad kernel")
    module.wgrad_gemm_accum_fp32 = standin_gemm.wgrad_gemm_accum_fp32
    module.wgrad_gemm_accum_fp16 = standin_gemm.wgrad_gemm_accum_fp32
    module.__qaudit_standin__ = True
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)  # find_spec answers
    return module


def _kernel_module(name: str) -> types.ModuleType:
    """A module of triton kernels: any name it is asked for is a kernel that raises NotOnCPU
    when called (importing names works; only running the feature does not)."""
    module = types.ModuleType(name, "qaudit: triton kernels are not available on CPU")
    module.__qaudit_standin__ = True
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def kernel(attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return standin_te._cuda_kernel(f"{name}.{attribute}")

    module.__getattr__ = kernel
    return module


def _mamba_standins() -> dict[str, types.ModuleType]:
    """The CPU stand-ins for mamba_ssm and causal_conv1d (qaudit/runtime/standin/mamba.py),
    each package only where no real one is importable (a real one is never shadowed)."""
    entries = {}
    for top in ("mamba_ssm", "causal_conv1d"):
        if sys.modules.get(top) is standin_mamba.modules()[top] or not importable(top):
            entries.update({name: module for name, module in standin_mamba.modules().items()
                            if name == top or name.startswith(top + ".")})
    return entries


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
    old = getattr(target, name, missing)
    setattr(target, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(target, name)
        else:
            setattr(target, name, old)


@contextlib.contextmanager
def _sys_modules(entries: dict[str, types.ModuleType]) -> Iterator[None]:
    """Put `entries` into sys.modules where nothing real is there; remove them afterwards."""
    added = []
    for name, module in entries.items():
        if name not in sys.modules:
            sys.modules[name] = module
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            if sys.modules.get(name) is entries[name]:
                del sys.modules[name]


class _Stream:
    """A CUDA stream or event on a CPU process: work is already ordered, waits return."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        return None

    def wait_event(self, *args: Any) -> None:
        return None

    def record_event(self, *args: Any) -> "_Stream":
        return _Stream()

    def record(self, *args: Any) -> None:
        return None

    def wait(self, *args: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


_CURRENT_STREAM = _Stream()


def _eager(function: Any = None, **options: Any) -> Any:
    """torch.compile's signature, compiling nothing: the function runs eagerly."""
    return function if function is not None else (lambda inner: inner)


@contextlib.contextmanager
def _deterministic_without_inductor() -> Iterator[None]:
    """torch.use_deterministic_algorithms without its other half, inductor's `deterministic`
    setting: importing inductor costs most of a second, and with torch.compile eager here
    nothing is compiled for that setting to reach. Megatron calls it from validate_args under
    --deterministic-mode (megatron/training/determinism.py). The flag is put back afterwards,
    so that a build in qaudit's own process leaves its later audits as they were."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()

    def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)

    try:
        with _patched(torch, "use_deterministic_algorithms", use_deterministic_algorithms):
            yield
    finally:
        torch._C._set_deterministic_algorithms(enabled, warn_only=warn_only)


def _cpu_cuda_answers() -> contextlib.ExitStack:
    """torch.cuda questions Megatron asks while building on CPU, answered for a CPU process.
    Also under TE's CPU pose (qaudit/runtime/standin/host.py), which answers TE's questions
    but not all of Megatron's (RNG state)."""
    stack = contextlib.ExitStack()
    if _real_cuda():
        return stack
    cpu = torch.device("cpu")
    stack.enter_context(_patched(torch.cuda, "current_device", lambda: cpu))
    stack.enter_context(_patched(torch.cuda, "get_device_capability", lambda *a, **k: (10, 0)))
    stack.enter_context(_patched(torch.cuda, "device_count", lambda: 1))
    stack.enter_context(_patched(torch.cuda, "get_rng_state", lambda *a, **k: torch.get_rng_state()))
    stack.enter_context(_patched(torch.cuda, "set_rng_state", lambda *a, **k: None))
    stack.enter_context(_patched(torch.cuda, "synchronize", lambda *a, **k: None))
    stack.enter_context(_patched(torch.cuda, "Stream", _Stream))
    stack.enter_context(_patched(torch.cuda, "Event", _Stream))
    stack.enter_context(_patched(torch.cuda, "current_stream", lambda *a, **k: _CURRENT_STREAM))
    stack.enter_context(_patched(torch.cuda, "stream",
                                 lambda *a, **k: contextlib.nullcontext()))
    # Megatron's TE output layer marks its forward with NVTX ranges; the CPU build has none.
    for name in ("range_push", "range_pop"):
        stack.enter_context(_patched(torch.cuda.nvtx, name, lambda *a, **k: None))
    return stack


def _cuda_type_names() -> contextlib.ExitStack:
    """Megatron's optimizer checks tensor types by name: every gradient is
    'torch.cuda.FloatTensor' before clipping (megatron/core/optimizer/clip_grads.py), and the
    BF16/FP16 optimizers sort parameters by 'torch.cuda.{Half,BFloat16,Float}Tensor'
    (optimizer.py, distrib_optimizer.py). Under TE's CPU pose every tensor already says
    `is_cuda`; `tensor.type()` then names the CUDA type of the same dtype, so those checks see
    what they would on a GPU. A conversion (`type(dtype)`) is torch's own."""
    stack = contextlib.ExitStack()
    if _real_cuda():
        return stack
    original = torch.Tensor.type

    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False,
              **kwargs: Any) -> Any:
        if dtype is not None or kwargs:
            return original(self, dtype, non_blocking, **kwargs)
        name = original(self)
        if self.layout is torch.strided and self.device.type == "cpu" and name.startswith(
                "torch.") and name.endswith("Tensor"):
            return "torch.cuda." + name[len("torch."):]
        return name

    stack.enter_context(_patched(torch.Tensor, "type", type_))
    return stack


def _typing_override() -> contextlib.ExitStack:
    """megatron.training uses typing.override (Python 3.12); on 3.11 typing_extensions' one
    (a no-op at run time) stands in."""
    import typing

    stack = contextlib.ExitStack()
    if not hasattr(typing, "override"):
        try:
            from typing_extensions import override
        except ImportError:
            def override(method):  # the decorator only marks the method
                return method
        stack.enter_context(_patched(typing, "override", override))
    return stack


def _cpu_megatron_calls(te_on_cpu: bool) -> contextlib.ExitStack:
    """Megatron's own CUDA-only helpers that its CPU-capable paths call (docs/cross-check.md):
    activation recompute saves and restores the CUDA RNG state
    (megatron/core/tensor_parallel/random.py); on CPU the CPU generator's state stands in.
    `te_on_cpu`: so does TE's own checkpoint's (transformer_engine/pytorch/distributed.py,
    which Megatron's `te_checkpoint` calls for recompute)."""
    stack = contextlib.ExitStack()
    if _real_cuda():
        return stack
    modules = ["megatron.core.tensor_parallel.random"]
    if te_on_cpu:
        modules.append("transformer_engine.pytorch.distributed")
    for name in modules:
        module = importlib.import_module(name)
        if hasattr(module, "_get_cuda_rng_state"):
            stack.enter_context(_patched(module, "_get_cuda_rng_state",
                                         lambda *a, **k: torch.get_rng_state()))
        if hasattr(module, "_set_cuda_rng_state"):
            stack.enter_context(_patched(module, "_set_cuda_rng_state",
                                         lambda state, *a, **k: torch.set_rng_state(state)))
    return stack


ATTENTION_SWITCHES = {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"}


def unfused_attention_only(utils: types.ModuleType) -> None:
    """TE's attention backend choice (`dot_product_attention/utils.py`,
    `get_attention_backend`) made with only its unfused PyTorch backend allowed: flash and
    cuDNN fused attention are GPU kernels. A launch pinning one (`--attention-backend
    fused`: Megatron opts TE out of the other two through these switches at model build,
    LanguageModule._set_attention_backend) then still runs; core attention has no linear
    module. The switches are set only around the choice, so Megatron's own check of them at a
    later build still sees its values. For the guard's --cpu (qaudit/guard/cpu.py)."""
    choose = getattr(utils, "get_attention_backend", None)
    if choose is None or getattr(choose, "__qaudit_standin__", False):
        return

    def get_attention_backend(*args: Any, **kwargs: Any) -> Any:
        with temporarily_set(ATTENTION_SWITCHES):
            return choose(*args, **kwargs)

    get_attention_backend.__qaudit_standin__ = True
    get_attention_backend.__wrapped__ = choose
    utils.get_attention_backend = get_attention_backend


def _out_of_place_attention_mask() -> contextlib.ExitStack:
    """TE's unfused softmax (attention/dot_product_attention/softmax.py) masks its input in
    place. In BF16 that input is its own float32 copy; the cross-check runs in float32, where
    it is the FP8 attention emulation's pass-through output, which autograd refuses to write.
    The masked scores out of place are the same values (nothing reads the input afterwards);
    core attention has no linear module."""
    stack = contextlib.ExitStack()
    try:
        backends = importlib.import_module(
            "transformer_engine.pytorch.attention.dot_product_attention.backends")
    except ModuleNotFoundError:  # a TE laid out otherwise: its softmax is left as it is
        return stack
    if hasattr(backends, "attention_mask_func"):
        stack.enter_context(_patched(backends, "attention_mask_func",
                                     lambda scores, mask: scores.masked_fill(mask, -10000.0)))
    return stack


def _no_custom_factory_imports() -> contextlib.ExitStack:
    """Without --allow-import, Megatron's `_get_custom_recipe` (which imports the factory a
    recipe names) gives a stand-in CustomRecipe instead: no code the input names is run."""
    stack = contextlib.ExitStack()

    def stand_in(path: str) -> Any:
        return standin_te.CustomRecipe(qfactory=path)

    for name in ("megatron.core.fp8_utils", "megatron.core.fp4_utils"):
        module = importlib.import_module(name)
        if hasattr(module, "_get_custom_recipe"):
            stack.enter_context(_patched(module, "_get_custom_recipe", stand_in))
    return stack


def _process_stand_ins(te: "TESide", stack: contextlib.ExitStack) -> None:
    """Enter, on `stack`, what this process needs before Megatron is imported: the stand-in
    packages and modules (TE unless a real one runs, APEX's fused wgrad kernel, mamba_ssm,
    the triton-kernel modules), torch.cuda's answers for a CPU process, typing.override,
    torch.compile run eagerly, and TE on the CPU kernel stand-in booted (te-cpu).
    The guard's `--cpu` keeps them for the life of the process (qaudit/guard/cpu.py)."""
    use_real_te = te.kind == "real"
    stubs: dict[str, types.ModuleType] = {}
    if te.kind == "te-cpu":
        _boot_te_on_cpu()
    elif te.kind == "standin":
        stubs.update(standin_te.package().modules)
    if not use_real_te and importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is None:
        stubs["fused_weight_gradient_mlp_cuda"] = _fused_wgrad_module()
    stubs.update(_mamba_standins())
    stubs.update({name: _kernel_module(name) for name in TRITON_MODULES})
    os.environ["NO_VCS_VERSION"] = "1"  # package_info.py would run `git rev-parse` otherwise
    if te.kind == "te-cpu":
        # FP8 attention (fp8_dot_product_attention) has only fused GPU backends; TE's own
        # switch lets its unfused PyTorch backend emulate it (read by TE 2.14 on; 2.8 does not).
        os.environ.setdefault("NVTE_UnfusedDPA_Emulate_FP8", "1")
    stack.enter_context(_sys_modules(stubs))
    stack.enter_context(_triton_kernel_finder())
    if not use_real_te:
        stack.enter_context(_cpu_cuda_answers())
    if te.kind == "te-cpu":
        stack.enter_context(_cuda_type_names())
    stack.enter_context(_typing_override())
    if not use_real_te:
        # Megatron decorates its fused functions with torch.compile at import
        # (megatron/core/jit.py, jit_fuser), which imports dynamo and inductor
        # (seconds); on CPU they run eagerly, and the kernel fusions are off anyway.
        stack.enter_context(_patched(torch, "compile", _eager))
        stack.enter_context(_deterministic_without_inductor())


def _megatron_stand_ins(te: "TESide", stack: contextlib.ExitStack, allow_import: bool) -> None:
    """Enter, on `stack`, the stand-ins inside Megatron's (and TE's) own modules; imports them.
    `allow_import`: --allow-import, Megatron may import a recipe's custom factory."""
    stack.enter_context(_cpu_megatron_calls(te.kind == "te-cpu"))
    if te.kind == "te-cpu":
        stack.enter_context(_out_of_place_attention_mask())
    if not allow_import:
        stack.enter_context(_no_custom_factory_imports())


def _real_cuda() -> bool:
    """A CUDA device is really there (TE's CPU pose makes torch.cuda.is_available() say yes)."""
    from qaudit.runtime.standin import host

    return host.real_cuda_available()


def _boot_te_on_cpu() -> None:
    """TE's Python on qaudit's kernel stand-in, for the rest of this process: Megatron's
    `import transformer_engine` then binds TE's own package."""
    from qaudit.runtime.standin import te_python as te_cpu

    if standin_te.installed_standin():
        raise NotBooted("qaudit's stand-in TE was imported earlier in this process; run "
                        "qaudit in a fresh process")
    try:
        te_cpu.boot()
    except ImportError as exc:
        raise NotBooted(f"Transformer Engine does not import on the {te_cpu.STAND_IN}: "
                        f"{exc}") from None


class NotBooted(EnvironmentProblem):
    """What a user asked the room for does not boot here: one line, which the user words
    as its own (the cross-check's, the guard's, the te runtime's)."""


def enter(side: "TESide", stack: contextlib.ExitStack | None = None, *, megatron: bool = False,
          allow_import: bool = False,
          when_imported: Callable[[str, Callable[[Any], None]], None] | None = None) -> None:
    """The one way into the room, for each of its users.

    `side` (side.py `decide`, or the te runtime's own choice of `te-cpu`): on `te-cpu`, TE's
    own Python boots on the kernel stand-in for the rest of the process; that is all the te
    runtime needs. `megatron`: the process is also readied to import the user's Megatron
    (the cross-check's worker, the guard's --cpu): what it needs before that import is
    entered on `stack` (undone when the stack closes), and what it needs inside Megatron's own
    modules is entered now, importing them, or, given `when_imported` (an import hook taking a
    module name and a callback), once `megatron.core` has been imported.
    `allow_import`: --allow-import, Megatron may import a recipe's custom factory.
    Raises NotBooted where `side` cannot boot here."""
    if side.refusal:
        raise NotBooted(side.refusal)
    if not megatron:
        if side.kind == "te-cpu":
            _boot_te_on_cpu()
        return
    assert stack is not None, "the stand-ins for Megatron are entered on a stack"
    _process_stand_ins(side, stack)

    def inside_megatron(*_: Any) -> None:
        _megatron_stand_ins(side, stack, allow_import)

    if when_imported is None:
        inside_megatron()
    else:
        when_imported("megatron.core", inside_megatron)
