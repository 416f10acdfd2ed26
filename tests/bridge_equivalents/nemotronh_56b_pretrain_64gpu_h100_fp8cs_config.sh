#!/bin/bash
# Nemotron-H-56B (Bridge perf recipe, h100 fp8cs), as Megatron-LM flags.
torchrun --nproc-per-node 8 pretrain_mamba.py \
    --hybrid-layer-pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" \
    --hidden-size 8192 --ffn-hidden-size 32768 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --disable-bias-linear \
    --mamba-num-heads 256 --mamba-head-dim 64 --mamba-num-groups 8 --mamba-state-dim 256 \
    --untie-embeddings-and-output-weights --bf16 \
    --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather \
    --cuda-graph-impl transformer_engine --cuda-graph-scope mamba \
    --tensor-model-parallel-size 8 --sequence-parallel --tp-comm-overlap \
    --use-distributed-optimizer --overlap-grad-reduce
