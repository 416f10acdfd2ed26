"""The audited run: a few steps of a few microbatches, the way Megatron trains.

Each step zeroes the gradient buffers, re-arms the flags at the first microbatch (through the
policy), runs forward and backward per microbatch, then updates the weights from `main_grad`.
Every parameter carries a `main_grad` buffer and `grad_added_to_main_grad`, and a hook adds
autograd gradients into `main_grad` as Megatron's DDP does (docs/semantics.md §1.3). With delayed
weight gradients the hook is the module's wgrad hook, run by `backward_dw`, and every queued
GEMM runs after the microbatch's backward; `--freeze-all-layers` trains forward-only
(docs/te-settings.md).
"""

from __future__ import annotations

import functools
from typing import Callable, Collection

import torch

from qaudit.model.gpt import GPTModel
from qaudit.model.probe import Recorder
from qaudit.run.fsdp import NO_FSDP, FsdpGrads
from qaudit.runtime.value_free import value_free_tensor

LEARNING_RATE = 0.05


def _ddp_hook(param: torch.nn.Parameter) -> None:
    if param.grad is None:
        return
    if not param.grad_added_to_main_grad or getattr(param, "zero_out_wgrad", False):
        param.main_grad.add_(param.grad)
    param.grad = None


def _drop_grad(param: torch.nn.Parameter) -> None:
    """The DDP hook of a run whose values nobody reads: the gradient is released, not added."""
    param.grad = None


def delayed_wgrad_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules that queue their weight gradients for `backward_dw` (TE need_backward_dw)."""
    return [m for m in model.modules()
            if callable(getattr(m, "need_backward_dw", None)) and m.need_backward_dw()]


def run_backward_dw(model: torch.nn.Module,
                    modules: list[torch.nn.Module] | None = None) -> None:
    """Run every queued weight-gradient GEMM, one `backward_dw` per queued backward, as
    Megatron's overlap schedule calls it per layer node and microbatch. `modules`: the
    model's `delayed_wgrad_modules`, when the caller has them already."""
    for module in delayed_wgrad_modules(model) if modules is None else modules:
        while len(module.wgrad_store):
            module.backward_dw()


def attach_grad_buffers(model: torch.nn.Module, fsdp: FsdpGrads = NO_FSDP,
                        delayed: list[torch.nn.Module] | None = None,
                        values: bool = True, unwritten: bool = False,
                        unrun: Collection[int] = ()) -> list[torch.nn.Parameter]:
    """`fsdp`: what Megatron-FSDP sets on the parameters (qaudit/run/fsdp.py). `delayed`: the
    model's `delayed_wgrad_modules`, when the caller has them already. `values` False (a run
    whose values nobody reads, as in `run_training`): the buffers are allocated, not zeroed,
    and the hooks add nothing into them. What reads a buffer then is its shape, dtype and
    identity only; the first touch of every page was most of the cost (0.6 s of DeepSeek-V3's
    upstream cross-check build). `unwritten` too (qaudit's own value-free run, whose
    reference runtime writes no buffer): each buffer holds one stored element
    (qaudit/runtime/value_free.py), where upstream's stand-in kernels still write theirs.
    `unrun`: ids of parameters left out (run_training's)."""
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in unrun]
    new_buffer = (torch.zeros_like if values
                  else _value_free_buffer if unwritten else torch.empty_like)
    hook = _ddp_hook if values else _drop_grad
    # Megatron DDP (distributed_data_parallel.py): a parameter TE marked
    # skip_backward_post_hook gets the hook through its module's wgrad hooks instead.
    hooked_by_module: set[int] = set()
    for module in delayed_wgrad_modules(model) if delayed is None else delayed:
        for param in module.parameters():
            if param.requires_grad and getattr(param, "skip_backward_post_hook", False) \
                    and id(param) not in unrun:
                module.register_wgrad_accumulation_and_reduce_hooks(
                    lambda param=param: hook(param))
                hooked_by_module.add(id(param))
    for param in params:
        param.main_grad = new_buffer(param)
        param.grad_added_to_main_grad = False
        if id(param) not in hooked_by_module:
            param.register_post_accumulate_grad_hook(hook)
        if fsdp.fsdp_params:
            param.__fsdp_param__ = True
            param.get_main_grad = functools.partial(getattr, param, "main_grad")
        if fsdp.overwrite_main_grad:
            param.overwrite_main_grad = True
        if fsdp.drained_each_backward:
            # Reduce-scattered into the sharded gradient after every microbatch.
            param.sharded_grad = new_buffer(param)
    return params


def _value_free_buffer(param: torch.Tensor) -> torch.Tensor:
    """A buffer nothing writes or reads the values of: its shape, dtype and identity over one
    stored element (qaudit/runtime/value_free.py)."""
    return value_free_tensor(like=param)


def zero_grad_buffer(params: list[torch.nn.Parameter], values: bool = True) -> None:
    """A new step: the flags reset, and with `values` the buffers zeroed (one foreach call:
    a call per parameter was a measurable share of a 2,000-parameter audit)."""
    if values:
        _zero_all([param.main_grad for param in params])
        _zero_all([param.sharded_grad for param in params if hasattr(param, "sharded_grad")])
    for param in params:
        param.grad_added_to_main_grad = False
        param.grad = None


def _zero_all(tensors: list[torch.Tensor]) -> None:
    if tensors:  # the foreach kernels refuse an empty list
        torch._foreach_zero_(tensors)


def step_gradient(param: torch.nn.Parameter) -> torch.Tensor:
    """The gradient the optimizer uses: main_grad, or FSDP's per-step reduced gradient."""
    return param.sharded_grad if hasattr(param, "sharded_grad") else param.main_grad


def make_batches(model: GPTModel, count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    dims = model.dims
    shape = (dims.micro_batch_size, dims.seq_length + 1)
    batches = []
    for _ in range(count):
        tokens = torch.randint(0, dims.vocab, shape, generator=generator)  # same on every device
        tokens = tokens.to(model.device)
        batches.append((tokens[:, :-1], tokens[:, 1:]))
    return batches


# One microbatch's forward and backward: the whole model in one process, or one pipeline
# stage's share with its neighbours (qaudit.run.stage_runner).
MicrobatchStep = Callable[[torch.Tensor, torch.Tensor], None]


def _whole_model(model: GPTModel) -> MicrobatchStep:
    return lambda tokens, labels: model(tokens, labels).backward()


def run_training(model: GPTModel, recorder: Recorder, steps: int, microbatches: int,
                 seed: int = 0, before_step: Callable[[int], None] | None = None,
                 microbatch_step: MicrobatchStep | None = None,
                 before_update: Callable[[list[torch.nn.Parameter]], None] | None = None,
                 values: bool = True, unrun: Collection[int] = ()) -> None:
    """`before_update` sees the step's gradients before the weights change (a pipeline's
    embedding copies sum theirs there). `values` False, for a run whose values nobody reads
    (the reference runtime without --verify: every call, flag, workspace event and wgrad
    decision is the same either way): no buffer is zeroed, drained or summed, no weight
    updated.
    `unrun`: ids of parameters whose modules are inferred, never run (docs/observed-once.md):
    no buffer or hook for them."""
    config = model.config
    fsdp = FsdpGrads.of(config.use_megatron_fsdp, config.data_parallel_sharding_strategy)
    # Which modules delay their wgrad is fixed when they are built: walk the model once,
    # not after every microbatch.
    delayed = delayed_wgrad_modules(model)
    params = attach_grad_buffers(model, fsdp, delayed=delayed, values=values,
                                 unwritten=not values, unrun=unrun)
    microbatch_step = microbatch_step or _whole_model(model)
    batches = make_batches(model, microbatches, seed)
    model.train()
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        zero_grad_buffer(params, values)
        recorder.start_step()
        for index, (tokens, labels) in enumerate(batches):
            recorder.start_microbatch(buffers_drained=fsdp.drained_each_backward)
            if index == 0:
                model.set_is_first_microbatch()
            microbatch_step(tokens, labels)
            run_backward_dw(model, delayed)
            if fsdp.drained_each_backward and values:
                drain_into_sharded_grads(params)
        if before_update is not None and values:
            # Summing gradients (a pipeline's embedding copies) reads and writes values: a
            # value-free run's buffers hold one element (every rank skips it alike).
            before_update(params)
        if values:
            apply_update(params)


def drain_into_sharded_grads(params: list[torch.nn.Parameter]) -> None:
    """Megatron-FSDP's reduce-scatter after a microbatch: main_grad moves into the sharded
    gradient and the bucket starts again from zero."""
    if not params:
        return
    main_grads = [param.main_grad for param in params]
    torch._foreach_add_([param.sharded_grad for param in params], main_grads)
    torch._foreach_zero_(main_grads)


def apply_update(params: list[torch.nn.Parameter]) -> None:
    """Plain SGD from each parameter's step gradient (one foreach call, as for zeroing)."""
    if not params:
        return
    with torch.no_grad():
        torch._foreach_add_(params, [step_gradient(param) for param in params],
                            alpha=-LEARNING_RATE)


def run_evaluation(model: GPTModel, recorder: Recorder, steps: int, microbatches: int,
                   seed: int = 0, forward: Callable[[torch.Tensor, torch.Tensor], object] | None = None,
                   frozen_training: bool = False) -> None:
    """Forward-only evaluation: modules in eval mode (evaluation recipes), flags re-armed at
    each evaluation's first microbatch, no backward.

    `frozen_training`: Megatron's --freeze-all-layers instead (training.py
    `_freeze_all_model_chunks`, `_forward_backward_grad_context`): every parameter has
    requires_grad=False and each step runs forward-only under no_grad, in training mode."""
    batches = make_batches(model, microbatches, seed)
    if frozen_training:
        model.requires_grad_(False)
    model.train(frozen_training)
    with torch.no_grad():
        for _ in range(steps):
            recorder.start_step()
            for index, (tokens, labels) in enumerate(batches):
                recorder.start_microbatch()
                if index == 0:
                    model.set_is_first_microbatch()
                (forward or model)(tokens, labels)
