"""The multi-tensor kernels an optimizer step calls, in PyTorch, for the CPU kernel stand-in.

Megatron's optimizer reaches TE's compiled extension through `multi_tensor_applier`
(megatron/core/optimizer/clip_grads.py: the gradient norm and clipping; TE's FusedAdam in
transformer_engine/pytorch/optimizers/fused_adam.py: the update). A training script on TE's
own Python on a CPU (the guard's `--cpu`, docs/guard.md) therefore needs them to take a step.
They decide nothing qaudit reports: each computes what TE's kernel computes, on the CPU,
without the chunking (`chunk_size`) or the overflow flag's early exit.
"""

from __future__ import annotations

import torch


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor, *rest):
    """The L2 norm of every tensor of the first list together (float32, shape [1]), and each
    tensor's own norm when `per_tensor`."""
    tensors = tensor_lists[0]
    norms = torch.stack([t.detach().float().norm() for t in tensors]) if tensors \
        else torch.zeros(0)
    total = norms.norm().reshape(1) if tensors else torch.zeros(1)
    return total, (norms if per_tensor else torch.zeros(0))


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale, *rest):
    """dst = src * scale, tensor by tensor (`tensor_lists` is [sources, destinations])."""
    factor = float(scale) if not torch.is_tensor(scale) else scale.float()
    for source, destination in zip(tensor_lists[0], tensor_lists[1]):
        destination.copy_(source.float() * factor)


def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step,
                      mode, bias_correction, weight_decay, *rest):
    """One Adam step over [grads, params, exp_avgs, exp_avg_sqs(, master params)]. `mode` 1
    is AdamW (decoupled weight decay), 0 adds the decay to the gradient, as TE's kernel."""
    grads, params, averages, squares = tensor_lists[:4]
    masters = tensor_lists[4] if len(tensor_lists) > 4 else None
    first = 1 - beta1 ** step if bias_correction else 1.0
    second = 1 - beta2 ** step if bias_correction else 1.0
    for index, (grad, param, average, square) in enumerate(zip(grads, params, averages,
                                                               squares)):
        target = masters[index] if masters is not None else param
        value = target.detach().float()
        gradient = grad.detach().float()
        if mode == 0 and weight_decay:
            gradient = gradient + weight_decay * value
        average.mul_(beta1).add_(gradient, alpha=1 - beta1)
        square.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
        update = (average / first) / ((square / second).sqrt() + eps)
        if mode == 1 and weight_decay:
            update = update + weight_decay * value
        value = value - lr * update
        target.detach().copy_(value)
        if masters is not None:
            param.detach().copy_(value)


ENTRY_POINTS = {
    "multi_tensor_l2norm": multi_tensor_l2norm,
    "multi_tensor_scale": multi_tensor_scale,
    "multi_tensor_scale_tensor": multi_tensor_scale,
    "multi_tensor_adam": multi_tensor_adam,
}
