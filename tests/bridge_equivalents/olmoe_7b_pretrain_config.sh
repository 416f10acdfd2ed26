#!/bin/bash
# OLMoE-7B (Bridge library recipe), as Megatron-LM flags.
torchrun --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 16 --hidden-size 2048 --ffn-hidden-size 1024 --num-attention-heads 16 \
    --kv-channels 128 --swiglu --qk-layernorm --disable-bias-linear \
    --num-experts 64 --moe-ffn-hidden-size 1024 --moe-router-topk 8 --moe-grouped-gemm \
    --recompute-granularity selective --vocab-size 50304 \
    --untie-embeddings-and-output-weights --bf16 --expert-model-parallel-size 8 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
