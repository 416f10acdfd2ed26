"""Probes: a record of every call of every audited module, forward and backward.

The recorder knows the step and microbatch, numbers each module's calls within a microbatch,
and learns each backward's wgrad decision from the runtime. An overwrite of `main_grad` that
lands after something was already written to it since the last zeroing is marked lossy: that
is the gradient loss the audit exists to find.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from qaudit.load.precision import Quant


@dataclass(kw_only=True)
class CallRecord:
    module: str
    step: int
    microbatch: int
    call: int  # 1-based, per module and microbatch
    flag: bool | None  # is_first_microbatch as passed to the module
    grad: bool  # grad-enabled forward: its backward will produce a weight gradient
    quant: Quant | None  # executed precision (None: high precision)
    training: bool
    ambient: Quant | None = None  # the context around the module, before its own recipe
    decision: str | None = None  # backward: accumulate | overwrite | autograd
    backward_seq: int | None = None  # 1-based order among this module's backwards in the mb
    lossy: bool = False
    # What TE did with the quantized weight (qaudit.runtime.te_rules.weight_cache_use):
    # primary | fresh | refresh | reuse; None in high precision.
    cache: str | None = None
    graph: bool = False  # replayed from a per-layer CUDA graph (qaudit/plan/graphs.py)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[CallRecord] = []
        self.step = -1
        self.microbatch = -1
        self._calls_in_mb: dict[str, int] = defaultdict(int)
        self._backwards_in_mb: dict[str, int] = defaultdict(int)
        self._writes_since_zero: dict[str, int] = defaultdict(int)

    def start_step(self) -> None:
        """Called when the gradient buffers are zeroed."""
        self.step += 1
        self.microbatch = -1
        self._writes_since_zero.clear()

    def start_microbatch(self, buffers_drained: bool = False) -> None:
        """`buffers_drained`: main_grad was consumed after the previous microbatch (FSDP)."""
        self.microbatch += 1
        self._calls_in_mb.clear()
        self._backwards_in_mb.clear()
        if buffers_drained:
            self._writes_since_zero.clear()

    def on_forward(self, module: str, flag: bool | None, grad: bool, quant: Quant | None,
                   training: bool, ambient: Quant | None = None, cache: str | None = None,
                   graph: bool = False) -> CallRecord:
        self._calls_in_mb[module] += 1
        record = CallRecord(module=module, step=self.step, microbatch=self.microbatch,
                            call=self._calls_in_mb[module], flag=flag, grad=grad, quant=quant,
                            training=training, ambient=ambient,
                            cache=cache if quant is not None else None, graph=graph)
        self.calls.append(record)
        return record

    def listener_for(self, record: CallRecord) -> Callable[[str], None]:
        return lambda decision: self.on_backward(record, decision)

    def on_backward(self, record: CallRecord, decision: str) -> None:
        module = record.module
        self._backwards_in_mb[module] += 1
        record.decision = decision
        record.backward_seq = self._backwards_in_mb[module]
        if decision == "overwrite" and self._writes_since_zero[module] > 0:
            record.lossy = True
        if decision != "autograd":
            self._writes_since_zero[module] += 1
