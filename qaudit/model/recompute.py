"""Activation recompute as Megatron does it: a no-grad first pass, a grad-enabled rerun in backward.

The rerun happens during backward, outside the forward's autocast, so the ambient precision
is captured at the first pass and re-entered for the rerun (Megatron and TE restore it too).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.utils.checkpoint


def checkpointed(fn: Callable[..., torch.Tensor], runtime, *inputs: torch.Tensor) -> torch.Tensor:
    ambient = runtime.current_quant()

    def rerunnable(*args: torch.Tensor) -> torch.Tensor:
        with runtime.autocast(ambient):
            return fn(*args)

    return torch.utils.checkpoint.checkpoint(rerunnable, *inputs, use_reentrant=True)
