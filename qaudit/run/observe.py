"""Observing the linear modules of a live Megatron model while it trains: what each call
passed Transformer Engine, and what each backward did to the weight's `main_grad`.

Used inside the user's own run by the guard (qaudit/guard/, docs/guard.md) and inside the
cross-check's upstream run (qaudit/crosscheck/). Nothing here models TE or Megatron: every
fact is read from their own code as it runs.

- **Calls and flags.** TE's base-class `forward`s (`Linear`, `LayerNormLinear`,
  `GroupedLinear`) are wrapped while the observer is installed: Megatron's wrappers reach
  them through `super().forward(x, is_first_microbatch=...)`, so the flag recorded is the one
  TE received. Megatron's own linears (`ColumnParallelLinear`, `RowParallelLinear`: the
  usual output layer) get forward hooks.
- **Writes into `main_grad`.** TE's GEMM entry points (`general_gemm`, `general_grouped_gemm`
  and the grouped-tensor variant), wherever a loaded TE or Megatron module holds them, and
  APEX's fused wgrad kernel (Megatron's own linears) are wrapped: a call whose output is a
  watched `main_grad` is a write, with the `accumulate` TE's own backward chose. It is
  attributed to the call whose backward is running (an identity on each call's output arms
  the module just before its backward; delayed wgrad GEMMs drain that queue in order).
  Other modules' parameters' `main_grad` (a router's) are watched too: a lossy overwrite of
  one is a stray write (Megatron-LM PR #6943's shape); their other writes leave no record.
- **Loss.** An overwrite of a buffer that something wrote since the step's zeroing is lossy:
  known from the writes seen, and, where the buffer was zeroed at the step's start, from its
  contents (any non-zero value was written by someone, whatever wrote it).
- **Missing writes.** At the end of a step, a fused module's call whose backward ran (its
  output's gradient arrived) with weights that need a gradient, yet no write into their
  `main_grad` followed (no GEMM write, the buffer untouched, no `.grad`), is a gradient that
  never arrived: `Observation.missing`. Not for a module that delays its wgrad to
  `backward_dw` (TE's `delay_wgrad_compute`): its writes may come after the step's end; nor
  for a call with no rows (an expert routed no tokens): its gradient is zero, so a GEMM
  skipped for it loses nothing.
- **`numeric`.** Each write is measured: the buffer before and after, and the call's own
  weight gradient from the same GEMM on the same operands into a scratch buffer.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from qaudit.load.precision import Quant
from qaudit.model.probe import CallRecord
from qaudit.runtime.te import stored_quantized

# TE's GEMM entry points (transformer_engine/pytorch/cpp_extensions/gemm.py) and the
# argument naming the buffer each writes into.
TE_GEMMS = ("general_gemm", "general_grouped_gemm", "general_grouped_gemm_for_grouped_tensor")
TE_LINEAR_CLASSES = ("Linear", "LayerNormLinear", "GroupedLinear")
MCORE_LINEAR_CLASSES = ("ColumnParallelLinear", "RowParallelLinear")
# APEX's kernel for Megatron's own linears (megatron/core/tensor_parallel/layers.py): it always
# adds into the buffer it is given (its third argument).
APEX_WGRAD = ("wgrad_gemm_accum_fp32", "wgrad_gemm_accum_fp16")
_FLAG = "is_first_microbatch"


@dataclass(kw_only=True)
class NumericCheck:
    """One measured write into a weight's main_grad (observer with `numeric`)."""

    module: str
    step: int
    microbatch: int
    call: int | None
    decision: str  # accumulate | overwrite, as TE's backward chose
    before: float  # norm of main_grad before the write
    own: float  # norm of the call's own weight gradient
    after: float  # norm of main_grad after
    residual: float  # |after - (before + own)| / |own| for accumulate, |after - own| / |own| else
    lost: float  # norm of what the write discarded (0 when it added)


@dataclass(kw_only=True)
class StrayWrite:
    """A write into a watched buffer that no armed call explains (named by its owner)."""

    module: str
    step: int
    microbatch: int
    decision: str
    lossy: bool


@dataclass(kw_only=True)
class MissingWrite:
    """A fused call whose backward ran but whose weights' main_grad got no write in the step."""

    module: str
    step: int
    microbatch: int
    call: int
    single_grouped_weight: bool = False  # TE's GroupedLinear with one grouped parameter


@dataclass
class _Buffer:
    owner: str  # the module whose own weight it is (or the first call that used it)
    writes: int = 0  # writes since the step's zeroing (or the last drain)
    zeroed: bool = False  # zeroed at the step's start: its contents say whether it was written
    # Every watched module whose calls write it: its owner, and any module handed the weight
    # (a tied output layer writes the embedding's buffer).
    writers: list[str] = field(default_factory=list)
    # The weight of a module that is not a linear (a router's, an embedding's): no call of
    # it is armed, so a GEMM write into it is a stray; only a lossy one is worth a record.
    kind: str | None = None


@dataclass
class Observation:
    """What the observer saw: records per call (qaudit's CallRecord, as the audit's own run
    leaves them), writes nobody's call explains, numeric checks, and the module table."""

    calls: list[CallRecord] = field(default_factory=list)
    strays: list[StrayWrite] = field(default_factory=list)
    missing: list[MissingWrite] = field(default_factory=list)
    numeric: list[NumericCheck] = field(default_factory=list)
    classes: dict[str, str] = field(default_factory=dict)  # row name -> upstream class
    te_modules: list[str] = field(default_factory=list)
    overwrite_main_grad: dict[str, bool] = field(default_factory=dict)
    frozen: dict[str, bool] = field(default_factory=dict)
    # Row name -> the recipe config Megatron's construction walk bound (where observed).
    bindings: dict[str, str] = field(default_factory=dict)
    steps: int = 0

    def records(self) -> dict[str, list[CallRecord]]:
        grouped: dict[str, list[CallRecord]] = defaultdict(list)
        for record in self.calls:
            grouped[record.module].append(record)
        return dict(grouped)


def te_classes() -> tuple[type, ...]:
    """TE's linear base classes, where TE is already imported (never imported here)."""
    pytorch = sys.modules.get("transformer_engine.pytorch")
    return tuple(getattr(pytorch, name) for name in TE_LINEAR_CLASSES
                 if pytorch is not None and hasattr(pytorch, name))


def _is_mcore_linear(module: torch.nn.Module) -> bool:
    kind = type(module)
    return kind.__name__ in MCORE_LINEAR_CLASSES and kind.__module__.startswith("megatron.")


def unwrapped(chunk: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The model inside the wrappers (DDP, Float16Module, FSDP all hold it as `.module`) and
    the prefix they add to its module names."""
    prefix = ""
    inner = chunk
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module
        prefix += "module."
    return inner, prefix


def unwrapped_names(chunk: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """`named_modules()` without the wrappers' prefixes: the names recipes and rows use."""
    _, prefix = unwrapped(chunk)
    for name, module in chunk.named_modules():
        if name.startswith(prefix):
            yield name[len(prefix):], module


def weights_of(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """A TE module's weights (`weight`, a grouped module's `weight0..N-1`), or a Megatron
    linear's `weight`: the parameters whose `main_grad` its wgrad GEMM writes."""
    return [p for name, p in module.named_parameters(recurse=False) if name.startswith("weight")]


def flag_of(signature: inspect.Signature, module: Any, args: tuple, kwargs: dict) -> Any:
    """The `is_first_microbatch` a TE forward received, keyword or positional."""
    if _FLAG in kwargs:
        return kwargs[_FLAG]
    try:
        return signature.bind(module, *args, **kwargs).arguments.get(_FLAG)
    except TypeError:
        return None


def _recipe_names() -> list[tuple[str, type]]:
    recipe = sys.modules.get("transformer_engine.common.recipe")
    names = (("mxfp8", "MXFP8BlockScaling"), ("nvfp4", "NVFP4BlockScaling"),
             ("blockwise", "Float8BlockScaling"), ("tensorwise", "Float8CurrentScaling"),
             ("delayed", "DelayedScaling"))
    return [(name, getattr(recipe, cls)) for name, cls in names
            if recipe is not None and hasattr(recipe, cls)]


def executed_quant(module: Any) -> Quant | None:
    """The recipe TE's forward executed in, read from the module's own state after it ran
    (TE sets `fp8` and `fp8_meta["recipe"]` in every forward from its autocast)."""
    if not getattr(module, "fp8", False):
        return None
    recipe = getattr(module, "fp8_meta", {}).get("recipe")
    if recipe is None:
        return None
    for name, cls in _recipe_names():
        if isinstance(recipe, cls):
            if name == "nvfp4":
                return Quant("fp4", "nvfp4")
            fmt = getattr(recipe, "fp8_format", None)
            label = str(getattr(fmt, "name", "E4M3")).lower()
            return Quant("fp8", name, label if label in ("e4m3", "hybrid") else "e4m3")
    return Quant("fp8", "custom")


class LiveObserver:
    """Records the linear modules of live model chunks while `installed()` is active and
    `recording` is true. Chunks are `(row prefix, module)`: "" for a whole model,
    "stage1/" or "stage0.chunk1/" for pipeline chunks (qaudit's row names)."""

    def __init__(self, *, numeric: bool = False) -> None:
        self.numeric = numeric
        self.recording = False
        self.seen = Observation()
        self.step = -1
        self.microbatch = 0
        self._names: dict[int, str] = {}
        self._chunks: list[torch.nn.Module] = []
        self._modules: dict[str, torch.nn.Module] = {}
        # Modules that are not linears but hold parameters: a wgrad fused into their
        # main_grad through TE's GEMM (Megatron-LM PR #6943's router) is watched too.
        self._others: dict[str, torch.nn.Module] = {}
        self._buffers: dict[int, _Buffer] = {}
        self._zeroed = False
        self._armed: dict[str, deque[CallRecord]] = defaultdict(deque)
        # id(record) -> (the module, its weights needing a gradient and their main_grads'
        # version counters when its backward began), for the end-of-step check.
        self._pending: dict[int, tuple[Any, list[tuple[torch.Tensor, tuple[int, int]]]]] = {}
        self._calls: dict[tuple[str, int, int], int] = defaultdict(int)
        self._backwards: dict[tuple[str, int, int], int] = defaultdict(int)

    # -- the model ---------------------------------------------------------------------

    def watch(self, chunks: Sequence[tuple[str, torch.nn.Module]]) -> None:
        """Name every linear module of the chunks (TE's and Megatron's own)."""
        classes = te_classes()
        for prefix, chunk in chunks:
            inner, _ = unwrapped(chunk)
            self._chunks.append(inner)
            # Recorded by the guard's hook on the model's construction walk, when it was there.
            bound = inner.__dict__.get("_qaudit_bindings") or {}
            for name, module in unwrapped_names(chunk):
                is_te = bool(classes) and isinstance(module, classes)
                row = prefix + name
                if not is_te and not _is_mcore_linear(module):
                    if any(True for _ in module.parameters(recurse=False)):
                        self._others.setdefault(row, module)
                    continue
                if id(module) in self._names:
                    continue
                self._names[id(module)] = row
                self._modules[row] = module
                self.seen.classes[row] = type(module).__name__
                if name in bound:
                    self.seen.bindings[row] = bound[name]
                if is_te:
                    self.seen.te_modules.append(row)
                weights = weights_of(module)
                self.seen.overwrite_main_grad[row] = any(
                    getattr(w, "overwrite_main_grad", False) for w in weights[:1])
                self.seen.frozen[row] = bool(weights) and not any(w.requires_grad
                                                                   for w in weights)

    def modules(self) -> list[torch.nn.Module]:
        """The watched chunks' models, without their wrappers."""
        return list(self._chunks)

    def name_of(self, module: Any) -> str | None:
        return self._names.get(id(module))

    def _index_buffers(self, zeroed: bool) -> None:
        """main_grad buffers by address, each with the module whose GEMM writes it (Megatron
        FSDP may hand out new buffers per step, so this is redone at each step)."""
        self._buffers.clear()
        for row, module in self._modules.items():
            for weight in weights_of(module):
                self._register(weight, row, zeroed)
        for row, module in self._others.items():  # after the linears: a tied weight is theirs
            for weight in module.parameters(recurse=False):
                self._register(weight, row, zeroed, kind=type(module).__name__)

    def _register(self, weight: torch.Tensor, row: str, zeroed: bool,
                  kind: str | None = None) -> None:
        """`kind`: the class of a module that is not a linear; its weight's buffer is
        recorded only where no linear already writes it."""
        buffer = getattr(weight, "main_grad", None)
        if isinstance(buffer, torch.Tensor) and buffer.numel():
            entry = self._buffers.get(buffer.data_ptr())
            if kind is not None:
                if entry is None:
                    self._buffers[buffer.data_ptr()] = _Buffer(row, zeroed=zeroed,
                                                               writers=[row], kind=kind)
                return
            if entry is None or entry.kind is not None:  # a linear's now (a tied output layer)
                entry = self._buffers[buffer.data_ptr()] = _Buffer(
                    row, zeroed=entry.zeroed if entry else zeroed,
                    writes=entry.writes if entry else 0)
            if row not in entry.writers:
                entry.writers.append(row)

    # -- step and microbatch -----------------------------------------------------------

    def start_step(self, zeroed: bool = True) -> None:
        """A training step begins. `zeroed`: the gradient buffers were just zeroed (Megatron's
        DDP does at every step), so a non-zero buffer was written during this step."""
        self.step += 1
        self.seen.steps = self.step + 1
        self.microbatch = 0
        self._armed.clear()
        self._pending.clear()
        self._zeroed = zeroed
        self._index_buffers(zeroed)

    def start_microbatch(self, microbatch: int, drained: bool = False) -> None:
        """`drained`: main_grad was consumed and zeroed since the last microbatch (FSDP)."""
        self.microbatch = microbatch
        if drained:
            for entry in self._buffers.values():
                entry.writes = 0
                entry.zeroed = True

    def end_step(self) -> None:
        """The step's backwards have all run: each fused call still waiting for its write
        never got one, unless something the GEMM wrappers do not see wrote the buffer (its
        version counter moved, or it was zeroed at the step's start and is not zero now), or
        autograd holds its gradient (`.grad`: Megatron's DDP adds that into main_grad)."""
        for queue in self._armed.values():
            for record in queue:
                module, weights = self._pending.get(id(record), (None, []))
                if module is None or not weights or _delays_wgrad(module):
                    continue
                if any(self._written(weight, version) for weight, version in weights):
                    continue
                self.seen.missing.append(MissingWrite(
                    module=record.module, step=record.step, microbatch=record.microbatch,
                    call=record.call,
                    single_grouped_weight=bool(getattr(module, "single_grouped_weight", False))))
        self._armed.clear()
        self._pending.clear()

    def _written(self, weight: torch.Tensor, version: tuple[int, int]) -> bool:
        if weight.grad is not None:
            return True
        buffer = getattr(weight, "main_grad", None)
        if not isinstance(buffer, torch.Tensor):
            return True  # no buffer to miss: not this check's case
        if _version(weight) != version:
            return True
        entry = self._buffers.get(_address(buffer))
        return entry is not None and entry.zeroed and bool(buffer.detach().ne(0).any())

    # -- calls -------------------------------------------------------------------------

    def on_call(self, row: str, flag: bool | None, module: torch.nn.Module,
                quant: Quant | None) -> CallRecord:
        key = (row, self.step, self.microbatch)
        self._calls[key] += 1
        # TE keeps no weight cache for a weight it stores quantized (fp8_param): "primary";
        # what else the call did with the cache is not observed here (None).
        primary = quant is not None and any(stored_quantized(w) for w in weights_of(module))
        record = CallRecord(module=row, step=self.step, microbatch=self.microbatch,
                            call=self._calls[key], flag=flag, grad=torch.is_grad_enabled(),
                            quant=quant, training=module.training,
                            cache="primary" if primary else None)
        self.seen.calls.append(record)
        return record

    def armed_output(self, out: Any, record: CallRecord, module: torch.nn.Module,
                     fused: bool, weights: list[torch.Tensor] | None = None) -> Any:
        """`out` with an identity whose backward runs just before the module's own: a fused
        module's next write is this call's; an unfused one's weight gradient goes to autograd
        (Megatron's DDP then adds it into main_grad). `weights`: the weights this call used,
        where they are not the module's own (a tied output layer is handed the embedding's)."""
        tensor = out[0] if isinstance(out, tuple) else out
        if not isinstance(tensor, torch.Tensor) or not record.grad or not tensor.requires_grad:
            return out

        used = weights_of(module) if weights is None else weights

        def arm() -> None:
            weights = [w for w in used if w.requires_grad]
            if not weights:
                return
            if fused:
                self._armed[record.module].append(record)
                if tensor.numel():  # no rows (an expert routed no tokens): a zero gradient
                    self._pending[id(record)] = (module, [(w, _version(w)) for w in weights])
                return
            self._decide(record, "autograd")
            for weight in weights:
                entry = self._buffers.get(_address(getattr(weight, "main_grad", None)))
                if entry is not None:
                    entry.writes += 1

        # A hook on the output tensor runs when its gradient is ready, just before the
        # module's own backward node; unlike an identity Function it adds no view that
        # Megatron's in-place code (its cross entropy on the logits) would trip over.
        tensor.register_hook(lambda grad: arm())
        return out

    def _decide(self, record: CallRecord, decision: str, lossy: bool = False) -> None:
        key = (record.module, record.step, record.microbatch)
        self._backwards[key] += 1
        record.decision = decision
        record.backward_seq = self._backwards[key]
        record.lossy = record.lossy or lossy

    # -- writes ------------------------------------------------------------------------

    def _watched(self, outs: Sequence[Any]) -> list[tuple[torch.Tensor, _Buffer]]:
        found = []
        for out in outs:
            entry = self._buffers.get(_address(out))
            if entry is not None:
                found.append((out, entry))
        return found

    def on_write(self, watched: list[tuple[torch.Tensor, _Buffer]], accumulate: bool,
                 contents_before: bool) -> CallRecord | None:
        """One GEMM wrote `watched` buffers (a grouped GEMM writes one per expert)."""
        decision = "accumulate" if accumulate else "overwrite"
        first = watched[0][1]
        owner = first.owner
        lossy = not accumulate and (contents_before or any(e.writes for _, e in watched))
        for _, entry in watched:
            entry.writes += 1
        if first.kind is not None:  # not a linear's: no call to credit
            if lossy:
                self.seen.classes.setdefault(owner, first.kind)  # its row, for the verdict
                self.seen.strays.append(StrayWrite(module=owner, step=self.step,
                                                   microbatch=self.microbatch,
                                                   decision=decision, lossy=True))
            return None
        # The call whose backward is running among the modules that write this buffer (a
        # buffer shared by tied weights has several).
        for writer in first.writers or [owner]:
            queue = self._armed.get(writer)
            if queue:
                record = queue.popleft()
                self._decide(record, decision, lossy)
                return record
        self.seen.strays.append(StrayWrite(module=owner, step=self.step,
                                           microbatch=self.microbatch, decision=decision,
                                           lossy=lossy))
        return None

    def _wrap_gemm(self, original: Callable, accumulates_always: bool = False) -> Callable:
        signature = _signature(original)
        observer = self

        def observed_gemm(*args: Any, **kwargs: Any) -> Any:
            if not observer.recording or not observer._buffers:
                return original(*args, **kwargs)
            outs, accumulate = _out_and_accumulate(signature, args, kwargs, accumulates_always)
            watched = observer._watched(outs)
            if not watched:
                return original(*args, **kwargs)
            contents = (not accumulate and any(entry.zeroed for _, entry in watched)
                        and any(bool(out.detach().ne(0).any()) for out, entry in watched
                                if entry.zeroed))
            before = [out.detach().clone() for out, _ in watched] if observer.numeric else None
            result = original(*args, **kwargs)
            record = observer.on_write(watched, accumulate, contents)
            if before is not None:
                observer._measure(original, signature, args, kwargs, watched, before, accumulate,
                                  record, accumulates_always)
            return result

        observed_gemm.__wrapped__ = original
        return observed_gemm

    def _measure(self, original: Callable, signature: inspect.Signature | None, args: tuple,
                 kwargs: dict, watched: list[tuple[torch.Tensor, _Buffer]],
                 before: list[torch.Tensor], accumulate: bool, record: CallRecord | None,
                 accumulates_always: bool) -> None:
        """The write's effect against the call's own gradient: the same GEMM on the same
        operands into zeroed scratch buffers (TE's kernel, so the same rounding)."""
        scratch = [torch.zeros_like(out) for out, _ in watched]
        own_args, own_kwargs = _into(signature, args, kwargs, [o for o, _ in watched], scratch,
                                     accumulates_always)
        if own_args is None:
            return
        with torch.no_grad():
            original(*own_args, **own_kwargs)
        for (out, entry), prior, own in zip(watched, before, scratch):
            after = out.detach().float()
            prior, own = prior.float(), own.float()
            expected = prior + own if accumulate else own
            scale = max(float(own.norm()), 1e-30)
            self.seen.numeric.append(NumericCheck(
                module=record.module if record is not None else entry.owner, step=self.step,
                microbatch=self.microbatch,
                call=record.call if record is not None else None,
                decision="accumulate" if accumulate else "overwrite",
                before=float(prior.norm()), own=float(own.norm()), after=float(after.norm()),
                residual=float((after - expected).norm()) / scale,
                lost=0.0 if accumulate else float(prior.norm())))

    # -- installing --------------------------------------------------------------------

    def _observed_forward(self, forward: Callable) -> Callable:
        signature = inspect.signature(forward)
        observer = self

        def observed_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            row = observer._names.get(id(module))
            if row is None or not observer.recording or getattr(module, "_qaudit_observed_forward",
                                                                 False):
                return forward(module, *args, **kwargs)
            flag = flag_of(signature, module, args, kwargs)
            module._qaudit_observed_forward = True
            try:
                out = forward(module, *args, **kwargs)
            finally:
                module._qaudit_observed_forward = False
            record = observer.on_call(row, flag, module, executed_quant(module))
            return observer.armed_output(out, record, module,
                                         bool(getattr(module, "fuse_wgrad_accumulation", False)))

        observed_forward.__wrapped__ = forward
        return observed_forward

    def _mcore_hooks(self) -> list[Any]:
        handles = []
        observer = self
        for row, module in self._modules.items():
            if not _is_mcore_linear(module):
                continue

            def before(module: torch.nn.Module, args: Any, kwargs: Any, row: str = row) -> None:
                if not observer.recording:
                    return
                # The output layer may be handed the embedding's weight (tied embeddings, and
                # MTP's depths sharing the output layer): its write goes to that buffer.
                weight = kwargs.get("weight")
                weights = None
                if isinstance(weight, torch.Tensor):
                    observer._register(weight, row, zeroed=observer._zeroed)
                    weights = [weight]
                module._qaudit_record = (observer.on_call(row, None, module, None), weights)

            def after(module: torch.nn.Module, args: Any, kwargs: Any, out: Any) -> Any:
                record, weights = module.__dict__.pop("_qaudit_record", (None, None))
                if record is None:
                    return out
                fused = bool(getattr(module, "gradient_accumulation_fusion", False))
                return observer.armed_output(out, record, module, fused, weights)

            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(module.register_forward_hook(after, with_kwargs=True))
        return handles

    @contextlib.contextmanager
    def installed(self) -> Iterator["LiveObserver"]:
        """Wrap TE's forwards and GEMM entry points, APEX's wgrad kernel, and hook Megatron's
        own linears; everything is put back on exit."""
        restore: list[tuple[Any, str, Any]] = []
        for base in te_classes():
            forward = base.__dict__.get("forward")
            if forward is not None:
                setattr(base, "forward", self._observed_forward(forward))
                restore.append((base, "forward", forward))
        for original, owners in _gemm_holders().items():
            wrapped = self._wrap_gemm(original)
            for owner, name in owners:
                setattr(owner, name, wrapped)
                restore.append((owner, name, original))
        apex = sys.modules.get("fused_weight_gradient_mlp_cuda")
        for name in APEX_WGRAD:
            original = getattr(apex, name, None) if apex is not None else None
            if original is not None:
                setattr(apex, name, self._wrap_gemm(original, accumulates_always=True))
                restore.append((apex, name, original))
        handles = self._mcore_hooks()
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            for owner, name, original in reversed(restore):
                setattr(owner, name, original)


def _address(tensor: Any) -> int:
    return tensor.data_ptr() if isinstance(tensor, torch.Tensor) and tensor.numel() else -1


def _version(weight: torch.Tensor) -> tuple[int, int]:
    """The weight's main_grad and its version counter (every in-place torch write moves it);
    a buffer replaced since (Megatron-FSDP hands out buffers) reads as another version."""
    buffer = getattr(weight, "main_grad", None)
    return (id(buffer), buffer._version) if isinstance(buffer, torch.Tensor) else (0, -1)


def _delays_wgrad(module: Any) -> bool:
    """TE's delay_wgrad_compute: the wgrad GEMM waits for the module's `backward_dw`."""
    store = getattr(module, "wgrad_store", None)
    try:
        return bool(store is not None and store.delay_wgrad_compute())
    except Exception:  # noqa: BLE001 - a store of another shape: treat the writes as pending
        return True


def _grouped(out: Any) -> bool:
    """TE 2.19+'s GroupedTensor(Storage): a flat row-wise buffer with per-member shapes (a
    wrapper tensor subclass without storage of its own, or a plain object)."""
    return isinstance(getattr(out, "rowwise_data", None), torch.Tensor)


def _flat(out: Any) -> Any:
    """A GEMM output as the tensor written: a grouped-tensor GEMM's output is its row-wise
    buffer, which for a single grouped weight's wgrad is the weight's main_grad."""
    return out.rowwise_data if _grouped(out) else out


def _signature(function: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _gemm_holders() -> dict[Callable, list[tuple[Any, str]]]:
    """Every loaded TE or Megatron module that holds one of TE's GEMM entry points by name
    (TE's modules import them into their own namespaces): original -> (module, name)."""
    gemm = sys.modules.get("transformer_engine.pytorch.cpp_extensions.gemm") or sys.modules.get(
        "transformer_engine.pytorch.cpp_extensions")
    originals = {getattr(gemm, name) for name in TE_GEMMS if gemm is not None
                 and callable(getattr(gemm, name, None))}
    holders: dict[Callable, list[tuple[Any, str]]] = defaultdict(list)
    if not originals:
        return holders
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(("transformer_engine", "megatron")):
            continue
        for name in TE_GEMMS:
            value = getattr(module, name, None)
            if value is not None and value in originals:
                holders[value].append((module, name))
    return holders


def _out_and_accumulate(signature: inspect.Signature | None, args: tuple, kwargs: dict,
                        accumulates_always: bool) -> tuple[list[Any], bool]:
    """The buffers a GEMM call writes and whether it adds into them."""
    if accumulates_always:  # APEX: (input, grad_output, main_grad)
        out = args[2] if len(args) > 2 else kwargs.get("main_grad")
        return [out], True
    if signature is None:
        return [kwargs.get("out")], bool(kwargs.get("accumulate", False))
    try:
        bound = signature.bind(*args, **kwargs).arguments
    except TypeError:
        return [], False
    out = bound.get("out")
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return [_flat(o) for o in outs], bool(bound.get("accumulate", False))


def _into(signature: inspect.Signature | None, args: tuple, kwargs: dict, outs: list[Any],
          scratch: list[torch.Tensor], accumulates_always: bool
          ) -> tuple[tuple | None, dict]:
    """The same GEMM call writing `scratch` instead of `outs`, without accumulating; None
    where a second call would repeat a side effect (communication, a fused bias gradient
    written into the caller's tensors)."""
    replace = {id(o): s for o, s in zip(outs, scratch)}
    if accumulates_always:  # APEX adds: into zeroed scratch, that is the call's own gradient
        return (args[0], args[1], scratch[0], *args[3:]), dict(kwargs)
    if signature is None:
        return None, {}
    bound = signature.bind(*args, **kwargs)
    arguments = bound.arguments
    if arguments.get("ub") is not None or arguments.get("extra_output") is not None \
            or arguments.get("bulk_overlap") or arguments.get("use_bias"):
        return None, {}
    out = arguments.get("out")
    if any(_grouped(o) or not isinstance(o, torch.Tensor)
           for o in (out if isinstance(out, (list, tuple)) else [out])):
        return None, {}  # a grouped-tensor output: no scratch of its kind is made here
    arguments["out"] = ([replace.get(id(o), o) for o in out] if isinstance(out, (list, tuple))
                        else replace.get(id(out), out))
    if "accumulate" in arguments or "accumulate" in signature.parameters:
        arguments["accumulate"] = False
    return bound.args, bound.kwargs
