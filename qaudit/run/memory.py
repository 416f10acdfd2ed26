"""--full-size: what one rank holds at the run's real widths, counted on the meta build.

Every parameter of the built model is given to a pipeline stage (its layer's, the embedding's
first, the output's last) and divided by the split that shards it: tensor parallel for TE's
column- and row-parallel linears and the vocabulary-parallel embedding and output layer,
expert parallel x expert tensor parallel for experts; norms, routers and MLA's duplicated
down projections are whole on every rank. The bytes per parameter are Megatron's mixed
precision defaults (docs/performance.md, "--full-size"): a BF16 weight (1 byte with
fp8_param / fp4_param's primary quantized weights), an FP32 `main_grad` (the DDP grad
buffer), and Adam's FP32 state: master weight, first and second moments. What the config's
Megatron-FSDP sharding (`data_parallel_sharding_strategy`: optim, optim_grads,
optim_grads_params) or Megatron's distributed optimizer shards is divided over the
data-parallel ranks, whose count the config does not state: the report says which parts.
"""

from __future__ import annotations

import re

import torch

from qaudit.load.config import ModelConfig
from qaudit.plan.shapes import Parallel

_TP_SHARDED = {"TEColumnParallelLinear", "TERowParallelLinear", "TELayerNormColumnParallelLinear",
               "TELMHeadColumnParallelLinear", "ColumnParallelLinear", "RowParallelLinear"}
_LAYER = re.compile(r"^(.*?layers\.\d+\.)")
GIB = 2 ** 30
MAIN_GRAD_BYTES = 4
OPTIMIZER_BYTES = 12  # FP32 master weight + Adam's two moments


def per_rank_memory(model: torch.nn.Module, config: ModelConfig, parallel: Parallel,
                    modules: list) -> dict:
    """Parameters and bytes on the rank holding the largest pipeline stage."""
    stages = max(config.pipeline_model_parallel_size, 1)
    shard: dict[int, int] = {}
    stage_of_prefix: dict[str, int] = {}
    for module in modules:
        expert = ".experts." in f".{module.fqn}."
        factor = parallel.ep * parallel.etp if expert else (
            parallel.tp if module.upstream_class in _TP_SHARDED else 1)
        for weight in module.weights():
            shard[id(weight)] = factor
        layer = _LAYER.match(module.fqn)
        if layer:
            stage_of_prefix.setdefault(layer.group(1), module.stage)
    per_stage = [0.0] * stages
    for name, param in model.named_parameters():
        layer = _LAYER.match(name)
        if layer and layer.group(1) in stage_of_prefix:
            stage = stage_of_prefix[layer.group(1)]
        else:
            stage = 0 if "embedding" in name else stages - 1
        factor = shard.get(id(param))
        if factor is None:
            factor = parallel.tp if "embedding" in name or name.startswith("output_layer") else 1
        per_stage[min(stage, stages - 1)] += param.numel() / factor
    stage = max(range(stages), key=lambda index: per_stage[index])
    params = int(per_stage[stage])
    weight_bytes = 1 if (config.fp8_param or config.fp4_param) else 2
    return {"split": parallel.label() + (f", PP {stages}" if stages > 1 else ""),
            "stage": stage, "parameters": params,
            "weights_gib": round(params * weight_bytes / GIB, 1),
            "main_grad_gib": round(params * MAIN_GRAD_BYTES / GIB, 1),
            "optimizer_gib": round(params * OPTIMIZER_BYTES / GIB, 1),
            "sharded_over_data_parallel": sharded_over_data_parallel(config)}


def sharded_over_data_parallel(config: ModelConfig) -> list[str]:
    """Which of weights, main_grad and optimizer state the config shards over data-parallel
    ranks (Megatron-FSDP's strategies; without FSDP, the distributed optimizer is a training
    argument the config does not carry, so nothing is assumed sharded)."""
    if not config.use_megatron_fsdp:
        return []
    return {"optim": ["optimizer"], "optim_grads": ["optimizer", "main_grad"],
            "optim_grads_params": ["optimizer", "main_grad", "weights"]}.get(
                config.data_parallel_sharding_strategy, [])
