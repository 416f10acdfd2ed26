"""A training job for the guard: TE's own GroupedLinear with one grouped weight parameter
(`single_grouped_weight=True`, TE issue #3234), trained through megatron-core's own pieces:
its DistributedDataParallel (the main_grad buffers, zeroed each step) and the schedule
get_forward_backward_func() returns; the update is plain SGD from main_grad (Megatron's
Float16 optimizer refuses the grouped parameter's tensor type on the CPU pose). It knows nothing of qaudit except
the one thing a CPU needs (the split sizes posed on the device, where a GPU job passes a
CUDA tensor). Megatron's TEGroupedMLP cannot be used: megatron-core 0.19 refuses
moe_single_grouped_weight without the op fuser, and 0.18, which builds it, is not fetched.

Run by tests/test_guard_single_grouped_weight.py as
`qaudit guard --cpu -- python tests/guard_single_grouped_weight_job.py`, with one TE
release and megatron-core 0.19.2 on PYTHONPATH. Prints one `step N` line per optimizer step.
"""

from __future__ import annotations

import inspect
import os
import sys

import torch

EXPERTS, WIDTH, ROWS, MICROBATCHES, STEPS = 2, 16, 8, 2, 2
# TE 2.15+ turn single_grouped_weight off without it (utils.resolve_grouped_linear_single_param_flags).
os.environ["NVTE_GROUPED_LINEAR_SINGLE_PARAM"] = "1"


def main() -> int:
    torch.distributed.init_process_group(backend="gloo", store=torch.distributed.HashStore(),
                                         rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel()
    import transformer_engine.pytorch as te

    # TE 2.19+ take a single grouped weight on their grouped-tensor path only.
    grouped_tensor = "use_grouped_tensor" in inspect.signature(te.GroupedLinear.__init__).parameters
    config = TransformerConfig(num_layers=1, hidden_size=WIDTH, num_attention_heads=1,
                               bf16=True, params_dtype=torch.bfloat16,
                               gradient_accumulation_fusion=True, use_cpu_initialization=True)

    class Experts(MegatronModule):
        def __init__(self) -> None:
            super().__init__(config)
            self.model_type = ModelType.encoder_or_decoder
            self.linear_fc1 = te.GroupedLinear(
                EXPERTS, WIDTH, WIDTH, bias=False, fuse_wgrad_accumulation=True,
                params_dtype=torch.bfloat16, single_grouped_weight=True,
                **({"use_grouped_tensor": True} if grouped_tensor else {}))

        def set_input_tensor(self, tensor) -> None:  # the schedule's pipeline hand-off
            pass

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            splits = [ROWS // EXPERTS] * EXPERTS
            if grouped_tensor:
                splits = _on_device(torch.tensor(splits, dtype=torch.int64))
            return self.linear_fc1(x, splits)

    model = DistributedDataParallel(config, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False), Experts())
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            yield torch.randn(ROWS, WIDTH, generator=generator).to(torch.bfloat16)

    def forward_step(data, model):
        output = model(next(data).requires_grad_())

        def loss(output_tensor):
            value = output_tensor.float().square().mean()
            return value, {"loss": value.detach()}

        return output, loss

    forward_backward = get_forward_backward_func()
    data = batches()
    for step in range(STEPS):
        model.zero_grad_buffer()
        forward_backward(forward_step_func=forward_step, data_iterator=data, model=[model],
                         num_microbatches=MICROBATCHES, seq_length=ROWS, micro_batch_size=1,
                         forward_only=False)
        with torch.no_grad():  # the optimizer step the guard stops before
            for parameter in model.parameters():
                parameter.data.sub_(1e-3 * parameter.main_grad.to(parameter.dtype))
        grads = [p.main_grad.abs().sum().item() for p in model.parameters()]
        print(f"step {step + 1} main_grad {sum(grads):.4g}", flush=True)
    torch.distributed.destroy_process_group()
    return 0


def _on_device(tensor: torch.Tensor) -> torch.Tensor:
    """The split sizes where TE 2.19+'s grouped-tensor path checks for them: on the device.
    On a GPU that is the tensor's own device; under `qaudit guard --cpu` the stand-in's pose."""
    if torch.cuda.is_available() and "transformer_engine_torch" in sys.modules \
            and getattr(sys.modules["transformer_engine_torch"], "QAUDIT_STAND_IN", False):
        from qaudit.runtime.standin.host import on_posed_device

        return on_posed_device(tensor)
    return tensor.cuda()


if __name__ == "__main__":
    sys.exit(main())
