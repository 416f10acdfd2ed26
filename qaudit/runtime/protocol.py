"""The runtime seam (docs/design.md): what the model's wrappers ask of a runtime. Two
implementations: `reference` (pure PyTorch, CPU or CUDA) and `te` (Transformer Engine, CUDA).
A new runtime implements `Runtime`; the wrappers and the run never name a runtime class."""

from __future__ import annotations

from typing import Callable, ContextManager, Protocol, runtime_checkable

import torch

from qaudit.load.precision import Quant

WgradListener = Callable[[str], None]


@runtime_checkable
class Runtime(Protocol):
    name: str
    device: str

    @property
    def description(self) -> str:
        """The report's `runtime:` line, e.g. "reference (CPU)"."""

    # TE's three module classes, built with TE's keywords; each takes `is_first_microbatch`.
    def linear(self, in_features: int, out_features: int, *, fuse: bool) -> torch.nn.Module: ...

    def layernorm_linear(self, in_features: int, out_features: int, *,
                         fuse: bool) -> torch.nn.Module: ...

    def grouped_linear(self, num_gemms: int, in_features: int, out_features: int, *,
                       fuse: bool) -> torch.nn.Module: ...

    def autocast(self, quant: Quant | None) -> ContextManager[None]:
        """Enter quantized execution with `quant`, or force high precision (None)."""

    def current_quant(self) -> Quant | None:
        """The innermost active autocast's quantization; None in high precision."""

    def plain_gemm(self, x: torch.Tensor, weight: torch.Tensor, *, fuse: bool,
                   listener: WgradListener | None) -> torch.Tensor:
        """Megatron's own (non-TE) linear: high precision, no is_first_microbatch."""


@runtime_checkable
class GraphEmulating(Runtime, Protocol):
    """A runtime that replays CUDA graphs captured with TE's skip flag (the reference; graphed
    configs are refused on the te runtime before the build)."""

    def graph_replay(self, skip_weight_update: bool | None) -> ContextManager[None]: ...
