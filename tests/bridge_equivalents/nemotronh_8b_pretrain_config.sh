#!/bin/bash
# Nemotron-H-8B (Bridge library recipe, bf16_mixed), as Megatron-LM flags.
torchrun --nproc-per-node 8 pretrain_mamba.py \
    --hybrid-layer-pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" \
    --hidden-size 4096 --ffn-hidden-size 21504 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --disable-bias-linear \
    --mamba-num-heads 128 --mamba-head-dim 64 --mamba-num-groups 8 --mamba-state-dim 128 \
    --untie-embeddings-and-output-weights --bf16 \
    --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap \
    --use-distributed-optimizer --overlap-grad-reduce
