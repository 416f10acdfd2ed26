#!/bin/bash
# Gemma-3-1B (Bridge library recipe, bf16_mixed), as Megatron-LM flags.
torchrun --nproc-per-node 1 pretrain_gpt.py \
    --num-layers 26 --hidden-size 1152 --ffn-hidden-size 6912 --num-attention-heads 4 \
    --group-query-attention --num-query-groups 1 --kv-channels 256 --swiglu --qk-layernorm \
    --disable-bias-linear --vocab-size 262144 --bf16 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
