"""Pretrain a GPT with megatron.training's own loop: written the way Megatron-LM's
`pretrain_gpt.py` is (a model provider, a forward step, a dataset provider with Megatron's
mock data, and `megatron.training.pretrain`), because the megatron-core wheel the tests run
ships `megatron/training` but no `pretrain_gpt.py`. Everything else -- the argument parser,
initialisation, DDP, the optimizer, the schedule and the training loop -- is upstream's.
It knows nothing of qaudit; tests/test_guard_pretrain.py runs it under `qaudit guard`.

    torchrun --nproc-per-node 1 tests/megatron_pretrain_gpt.py --num-layers 2 ... --mock-data
"""

from functools import partial

import torch

from megatron.core import parallel_state
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_with_transformer_engine_spec, get_gpt_mtp_block_spec)
from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
from megatron.training import get_args, pretrain, print_rank_0
from megatron.training.argument_utils import pretrain_cfg_container_from_args
from megatron.training.arguments import core_transformer_config_from_args, parse_and_validate_args
from megatron.training.utils import get_blend_and_blend_per_split, is_first_or_last_pipeline_stage


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None,
                   pg_collection=None):
    """The GPT of the command line, on Transformer Engine's layer spec (with MTP if asked)."""
    args = get_args()
    config = config or core_transformer_config_from_args(args)
    spec = get_gpt_layer_with_transformer_engine_spec(
        args.num_experts, args.moe_grouped_gemm, args.qk_layernorm)
    mtp = (get_gpt_mtp_block_spec(config, spec, use_transformer_engine=True, vp_stage=vp_stage)
           if args.mtp_num_layers else None)
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
        post_process=post_process, fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type,
        rotary_percent=args.rotary_percent, rotary_base=args.rotary_base,
        mtp_block_spec=mtp, vp_stage=vp_stage, pg_collection=pg_collection)


def loss_func(loss_mask, output_tensor):
    """Summed token loss, its token count, and the report the training loop logs."""
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    tokens = loss_mask.sum().clone().detach().to(torch.int)
    return loss, tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), tokens.view(1)])}


def get_batch(data_iterator, vp_stage=None):
    """The microbatch on this rank. Tensor and context parallelism are 1 here, so no
    broadcast or sequence split is needed (pretrain_gpt.py's TP/CP helpers do those)."""
    keys = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
    if not is_first_or_last_pipeline_stage(vp_stage):
        return [None] * len(keys)
    batch = next(data_iterator)
    return [batch[key].cuda(non_blocking=True) if batch.get(key) is not None else None
            for key in keys]


def forward_step(data_iterator, model):
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(
        data_iterator, getattr(model, "vp_stage", None))
    output = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output, partial(loss_func, loss_mask)


def is_dataset_built_on_rank(vp_stage=None):
    return (is_first_or_last_pipeline_stage(vp_stage)
            and parallel_state.get_tensor_model_parallel_rank() == 0)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, blend=blend,
        blend_per_split=blend_per_split, split=args.split, path_to_cache=args.data_cache_path,
        tokenizer=build_tokenizer(args), reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader)
    assert args.mock_data, "this entry only trains on Megatron's mock data (--mock-data)"
    print_rank_0("> building mock GPT datasets ...")
    return BlendedMegatronDatasetBuilder(
        MockGPTDataset, train_val_test_num_samples,
        partial(is_dataset_built_on_rank, vp_stage=vp_stage), config).build()


if __name__ == "__main__":
    train_valid_test_datasets_provider.is_distributed = True
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "NullTokenizer"})
    assert args.tensor_model_parallel_size == 1 and args.context_parallel_size == 1, \
        "this entry reads its batches without the TP broadcast and CP split"
    pretrain(pretrain_cfg_container_from_args(args), train_valid_test_datasets_provider,
             ModelType.encoder_or_decoder, forward_step, model_provider=model_provider)
