"""Tensors of a run whose values nobody reads (the reference runtime without --verify): the
shape, dtype and identity of a weight or a `main_grad` buffer, over one element of storage.

Such a tensor reads as zeros everywhere (what value-free weights held before, allocated in
full), costs no memory per element, and refuses an in-place write (torch rejects writing
through overlapping elements), so a value-free run that wrote one would fail loudly rather
than compute on it. A model with sequential experts holds tens of thousands of weights: in
full, they and their gradient buffers were most of its memory (docs/performance.md).
"""

from __future__ import annotations

import torch


def value_free_tensor(*shape: int, like: torch.Tensor | None = None) -> torch.Tensor:
    """Zeros of `shape` (or of `like`'s shape, dtype and device) over one stored element."""
    if like is not None:
        return like.new_zeros(()).expand(like.shape)
    return torch.zeros(()).expand(*shape)


def value_free_weight(*shape: int) -> torch.nn.Parameter:
    return torch.nn.Parameter(value_free_tensor(*shape))
