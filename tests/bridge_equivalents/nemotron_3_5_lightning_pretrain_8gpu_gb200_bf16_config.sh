#!/bin/bash
# Nemotron-3.5-Lightning (Bridge perf recipe, gb200 bf16), as Megatron-LM flags.
torchrun --nproc-per-node 8 pretrain_hybrid.py \
    --hybrid-layer-pattern "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME/*E/*E" \
    --mtp-num-layers 2 --mtp-use-repeated-layer \
    --hidden-size 2688 --ffn-hidden-size 1856 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 2 --kv-channels 128 --disable-bias-linear \
    --mamba-num-heads 64 --mamba-head-dim 64 --mamba-num-groups 8 --mamba-state-dim 128 \
    --num-experts 128 --moe-ffn-hidden-size 1856 --moe-shared-expert-intermediate-size 3712 \
    --moe-router-topk 6 --moe-grouped-gemm --untie-embeddings-and-output-weights \
    --cuda-graph-impl transformer_engine --cuda-graph-modules attn mamba moe_router moe_preprocess \
    --bf16 --expert-model-parallel-size 8 --use-distributed-optimizer \
    --overlap-grad-reduce --overlap-param-gather
