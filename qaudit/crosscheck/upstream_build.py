"""Build and train the config with the user's own Megatron code; return one ModuleFacts per
linear module (the builder seam: a plain list, whatever built it).

Upstream's pieces, used as they are: `TransformerConfig` (its `__post_init__` validates),
the TE layer specs and decoder block spec (`gpt_layer_specs.py`), the MTP block spec,
`GPTModel` (whose construction walk calls each module's `finish_init` with the recipe config
`get_quant_config_or_none` picks), `set_is_first_microbatch`, forward and backward. qaudit
adds only what a training loop adds around them: a DDP-like `main_grad` buffer, the re-arming
call at each step's first microbatch, the optimizer step (qaudit/run/train.py's, the same as for
qaudit's own model).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from qaudit.crosscheck import te_side
from qaudit.crosscheck.probe import CallProbe
from qaudit.runtime.standin import te_package as standin_te
from qaudit.runtime.standin.gemm import output_writes
from qaudit.crosscheck.facts import BuiltModel, ModuleFacts, will_execute_label
from qaudit.crosscheck.upstream_config import UpstreamInput
from qaudit.model.probe import CallRecord
from qaudit.run.fsdp import NO_FSDP, FsdpGrads
from qaudit.run.observe import LiveObserver
from qaudit.runtime.standin.storage import NotStoodIn
from qaudit.run.rows import (accumulation_of, calls_per_microbatch, precision_of,
                             weight_cache_of)
from qaudit.run.train import (apply_update, attach_grad_buffers, drain_into_sharded_grads,
                          zero_grad_buffer)

# Megatron's own (non-TE) linear classes: rows too (the usual output layer is one; every
# linear of the modelopt spec, whose MLA down projections are its `Linear`).
MCORE_LINEARS = ("ColumnParallelLinear", "RowParallelLinear")
MODELOPT_LINEAR = "megatron.core.post_training.modelopt.layers"


class Rejected(Exception):
    """Upstream's own code refused the config (its validation or an assertion at build)."""


def upstream_classes() -> dict[str, Any]:
    """The installed Megatron's classes and spec functions the build uses."""
    from megatron.core.models.gpt import gpt_layer_specs, gpt_model
    from megatron.core.transformer import transformer_config

    return {"TransformerConfig": transformer_config.TransformerConfig,
            "MLATransformerConfig": getattr(transformer_config, "MLATransformerConfig", None),
            "GPTModel": gpt_model.GPTModel, "specs": gpt_layer_specs, "gpt_model": gpt_model}


def hybrid_classes() -> dict[str, Any]:
    """The installed Megatron's HybridModel and its TE stack spec (hybrid_builders.py's
    `--spec megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec`)."""
    from megatron.core.models.hybrid import hybrid_layer_specs, hybrid_model

    return {"HybridModel": hybrid_model.HybridModel, "hybrid_model": hybrid_model,
            "stack_spec": hybrid_layer_specs.hybrid_stack_spec}


def hybrid_stack_spec(which: str, config: Any) -> Any:
    """The TE stack spec, or ModelOpt's (megatron/post_training/model_builder.py, main, with
    ModelOpt's option defaults)."""
    if which == "modelopt":
        from megatron.core.post_training.modelopt.hybrid.model_specs import (
            get_hybrid_stack_modelopt_spec)

        return _call_with_supported(get_hybrid_stack_modelopt_spec, local_core_attention=False,
                                    remap_te_layernorm=False, use_default_te_spec=False,
                                    moe_grouped_gemm=config.moe_grouped_gemm)
    return hybrid_classes()["stack_spec"]


def make_config(upstream: UpstreamInput) -> Any:
    """Upstream's TransformerConfig; its own validation errors are the user's input errors."""
    from megatron.core.quantization.utils import load_quantization_recipe

    classes = upstream_classes()
    cls = upstream.config_class or (classes["MLATransformerConfig"] if upstream.mla
                                    else classes["TransformerConfig"])
    kwargs = dict(upstream.config_kwargs)
    kwargs.update(_cuda_graphs_off(cls))
    upstream.notes.extend(_cpu_substitutions(kwargs))
    if upstream.recipe_path is not None:
        kwargs["quant_recipe"] = load_quantization_recipe(upstream.recipe_path)
    elif upstream.prebuilt_recipe is not None:
        kwargs["quant_recipe"] = upstream.prebuilt_recipe
    try:
        config = cls(**kwargs)
    except (AssertionError, ValueError, TypeError) as exc:
        raise Rejected(f"{cls.__name__}: {type(exc).__name__}: {exc}") from exc
    for name, value in upstream.config_attributes.items():
        setattr(config, name, value)
    return config


def recipe_config(recipe: Any) -> Any:
    """qaudit's reading of a serialized RecipeConfig (a Bridge dump's `model.quant_recipe`:
    qaudit/load/bridge/quant_recipe.py) as upstream's RecipeConfig, matchers in their order."""
    from megatron.core.quantization.quant_config import GlobMatcher, RecipeConfig

    from qaudit.crosscheck.upstream_config import plain

    return RecipeConfig(matchers=[GlobMatcher(pattern=m.pattern, config_key=m.config)
                                  for m in recipe.matchers],
                        config_dict=plain(recipe.configs))


def _cpu_substitutions(kwargs: dict[str, Any]) -> list[str]:
    """Run paths that need GPU-only libraries, replaced by Megatron's own CPU-capable ones
    (same linear modules and calls); each one said in the report."""
    notes = []
    if kwargs.get("overlap_moe_expert_parallel_comm"):
        # Needs expert parallelism (EP is 1 here); delay_wgrad_compute needs the overlap.
        kwargs["overlap_moe_expert_parallel_comm"] = False
        if kwargs.get("delay_wgrad_compute"):
            kwargs["delay_wgrad_compute"] = False
            notes.append("delay_wgrad_compute: run without it (it needs expert-parallel "
                         "overlap, EP is 1 on CPU)")
    for name in ("fine_grained_activation_offloading", "cpu_offloading"):
        if kwargs.get(name):
            kwargs[name] = False
            notes.append(f"{name}: run without it (pinned host memory and CUDA streams)")
    if kwargs.get("use_transformer_engine_op_fuser"):
        kwargs["use_transformer_engine_op_fuser"] = False
        notes.append("TE op fuser: run with Megatron's unfused TE modules")
    if kwargs.get("moe_token_dispatcher_type") == "flex":
        kwargs["moe_token_dispatcher_type"] = "alltoall"
        # The flex backend's own settings go with it: TransformerConfig refuses them without
        # the flex dispatcher (the `ncclep` backend; a per-rank expert capacity, which needs
        # hybridep with the op fuser; paged stashing, which needs that capacity).
        kwargs.pop("moe_flex_dispatcher_backend", None)
        if kwargs.get("moe_expert_rank_capacity_factor") is not None:
            kwargs["moe_expert_rank_capacity_factor"] = None
            if kwargs.get("moe_paged_stash"):
                kwargs["moe_paged_stash"] = False
            notes.append("per-rank expert capacity and paged stashing (flex dispatcher only): "
                         "run without them")
        notes.append("flex token dispatcher (DeepEP/HybridEP, CUDA): run with alltoall")
    return notes


# TE's MXFP8 attention (`fp8_dot_product_attention` under an mxfp8 recipe) asserts sequence
# lengths that are multiples of 128 and head sizes that are multiples of 32
# (megatron/core/extensions/transformer_engine.py hands TE's check its message).
MXFP8_ATTENTION_SEQUENCE, MXFP8_ATTENTION_HEAD = 128, 32


def _sized_for_mxfp8_attention(upstream: UpstreamInput) -> list[str]:
    """On TE's own Python, a config with MXFP8 attention is run at the smallest sequence and
    head size TE accepts, instead of the shrunk model's 8 and 16: no compared fact depends on
    a width or a length. Multi-latent attention keeps its sizes (its heads are split in
    three; compared as built, quoting TE)."""
    kwargs = upstream.config_kwargs
    recipe = kwargs.get("fp8_recipe")
    if upstream.mla or not kwargs.get("fp8_dot_product_attention") \
            or getattr(recipe, "value", recipe) != "mxfp8":
        return []
    head = kwargs.get("kv_channels") or 0
    sequence = upstream.model_kwargs["max_sequence_length"]
    kwargs["kv_channels"] = -(-max(head, 1) // MXFP8_ATTENTION_HEAD) * MXFP8_ATTENTION_HEAD
    upstream.model_kwargs["max_sequence_length"] = \
        -(-sequence // MXFP8_ATTENTION_SEQUENCE) * MXFP8_ATTENTION_SEQUENCE
    return [f"MXFP8 attention: run at sequence length {upstream.model_kwargs['max_sequence_length']}"
            f" and head size {kwargs['kv_channels']} (TE's minimum; widths are not compared)"]


def _unfused_attention_on_cpu(chunks: list[Chunk]) -> list[str]:
    """A config pinning TE's flash or fused attention: Megatron's model build has opted TE out
    of its unfused backend (LanguageModule._set_attention_backend), and a CPU has neither of
    the other two. Opt TE back in for the run, after the build, so the config Megatron
    validated is unchanged; core attention has no linear module, so no compared fact moves.
    os.environ is restored by the worker's upstream_environment."""
    backend = getattr(getattr(chunks[0].model, "config", None), "attention_backend", None)
    name = getattr(backend, "name", None)
    if name not in ("flash", "fused"):
        return []
    os.environ.update(NVTE_FLASH_ATTN="0", NVTE_FUSED_ATTN="0", NVTE_UNFUSED_ATTN="1")
    return [f"attention_backend {name}: TE's core attention run with its unfused backend "
            "(no flash or fused attention kernels on CPU; it has no linear module)"]


def _cuda_graphs_off(cls: type) -> dict[str, Any]:
    """Every CUDA-graph field at its default (off): capture needs a GPU. Modules qaudit runs
    inside a graph are then compared as built (qaudit.crosscheck.cross_check)."""
    off = {}
    for spec in dataclasses.fields(cls):
        if "cuda_graph" in spec.name and spec.init:
            if spec.default is not dataclasses.MISSING:
                off[spec.name] = spec.default
            elif spec.default_factory is not dataclasses.MISSING:
                off[spec.name] = spec.default_factory()
    return off


def _call_with_supported(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Call with the keyword arguments the installed version accepts (specs gain keywords
    from release to release)."""
    accepted = inspect.signature(function).parameters
    return function(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def layer_spec(config: Any, stage: dict[str, Any], which: str = "te") -> Any:
    """The layer spec Megatron-LM's gpt_builders.py picks for the TE implementation, or the
    one ModelOpt's builder picks (`which` "modelopt": megatron/post_training/model_builder.py,
    main, with ModelOpt's option defaults); `stage`: vp_stage and pp_rank of the chunk."""
    if which == "modelopt":
        from megatron.core.post_training.modelopt.gpt.model_specs import get_gpt_modelopt_spec

        return get_gpt_modelopt_spec(config=config, local_core_attention=False,
                                     remap_te_layernorm=False, real_quant_cfg="None",
                                     use_arbitrary_attention_mask=False)
    specs = upstream_classes()["specs"]
    if config.num_moe_experts:
        return _call_with_supported(specs.get_gpt_decoder_block_spec, config,
                                    use_transformer_engine=True,
                                    normalization=config.normalization,
                                    qk_l2_norm=config.qk_l2_norm, **stage)
    return _te_layer_spec(specs, config)


def _te_layer_spec(specs: Any, config: Any) -> Any:
    return _call_with_supported(
        specs.get_gpt_layer_with_transformer_engine_spec, config.num_moe_experts,
        config.moe_grouped_gemm, config.qk_layernorm, config.multi_latent_attention,
        qk_l2_norm=config.qk_l2_norm, use_kitchen=config.use_kitchen,
        use_te_activation_func=getattr(config, "use_te_activation_func", False),
        use_kitchen_attention=getattr(config, "use_kitchen_attention", False),
        kitchen_attention_backend=getattr(config, "kitchen_attention_backend", "sdpa"),
        mla_down_proj_fusion=getattr(config, "mla_down_proj_fusion", False),
        use_grouped_gemm_for_dense_mlp=getattr(config, "use_grouped_gemm_for_dense_mlp", False))


def mtp_spec(config: Any, spec: Any, stage: dict[str, Any]) -> Any:
    if not config.mtp_num_layers:
        return None
    specs = upstream_classes()["specs"]
    if getattr(spec, "layer_specs", None) is not None and len(spec.layer_specs) == 0:
        last = _te_layer_spec(specs, config)
    elif hasattr(specs, "get_gpt_decoder_layer_specs"):
        last = _call_with_supported(specs.get_gpt_decoder_layer_specs, config,
                                    use_transformer_engine=True,
                                    normalization=config.normalization,
                                    qk_l2_norm=config.qk_l2_norm, **stage)[-1]
    else:
        last = spec
    return _call_with_supported(specs.get_gpt_mtp_block_spec, config, last,
                                use_transformer_engine=True, **stage)


@contextlib.contextmanager
def _recording_binder(gpt_model_module: Any) -> Iterator[dict[str, str]]:
    """Observe which recipe config GPTModel's finish_init walk binds to each module name, by
    wrapping upstream's own `get_quant_config_or_none` where gpt_model.py calls it."""
    original = gpt_model_module.get_quant_config_or_none
    bound: dict[str, str] = {}

    def recording(name: str, recipe: Any) -> Any:
        result = original(name, recipe)
        bound[name] = getattr(result, "config_key", None) or "-"
        return result

    gpt_model_module.get_quant_config_or_none = recording
    try:
        yield bound
    finally:
        gpt_model_module.get_quant_config_or_none = original


@dataclass(kw_only=True)
class Chunk:
    """One model chunk: a pipeline stage's (virtual) part, or the whole model."""

    prefix: str  # qaudit's row prefix: "", "stage1/", "stage0.chunk1/"
    stage: int
    index: int  # virtual chunk
    model: Any
    bound: dict[str, str]  # chunk-local module name -> recipe config bound
    pre_process: bool
    post_process: bool
    t5: bool = False  # T5Model's forward takes encoder and decoder inputs


class _Group:
    """A pipeline process group as the chunk being built sees it (rank and size only)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@contextlib.contextmanager
def pipeline_rank(stage: int, stages: int, chunk: int, chunks: int | None) -> Iterator[None]:
    """Megatron's own parallel_state overrides (set_pipeline_model_parallel_rank, ...): code
    that asks parallel_state which stage it is on gets the chunk being built or run."""
    from megatron.core import parallel_state as ps

    if stages == 1:
        yield
        return
    ps.set_pipeline_model_parallel_world_size(stages)
    ps.set_pipeline_model_parallel_rank(stage)
    ps.set_virtual_pipeline_model_parallel_world_size(chunks)
    ps.set_virtual_pipeline_model_parallel_rank(chunk if chunks else None)
    try:
        yield
    finally:
        ps.set_pipeline_model_parallel_world_size(None)
        ps.set_pipeline_model_parallel_rank(None)
        ps.set_virtual_pipeline_model_parallel_world_size(None)
        ps.set_virtual_pipeline_model_parallel_rank(None)


def build_model(upstream: UpstreamInput, seed: int = 0) -> tuple[Any, list[Chunk]]:
    """Upstream's config and its model chunks, in the order a microbatch passes them."""
    classes = upstream_classes()
    config = make_config(upstream)
    stages = config.pipeline_model_parallel_size
    chunks = config.virtual_pipeline_model_parallel_size
    torch.manual_seed(seed)
    if upstream.hybrid is not None:
        _seed_rng_tracker(seed)
    built = []
    for index in range(chunks or 1):
        for stage in range(stages):
            prefix = "" if stages == 1 else (f"stage{stage}/" if not chunks
                                             else f"stage{stage}.chunk{index}/")
            built.append(_build_chunk(classes, config, upstream, prefix, stage, stages, index,
                                      chunks))
    _share_embedding_copies(built)
    return config, built


def _build_chunk(classes: dict[str, Any], config: Any, upstream: UpstreamInput, prefix: str,
                 stage: int, stages: int, index: int, chunks: int | None) -> Chunk:
    from megatron.core.process_groups_config import ProcessGroupCollection

    vp_stage = index if chunks else None
    pre = stage == 0 and index == 0
    post = stage == stages - 1 and index == (chunks or 1) - 1
    extra: dict[str, Any] = {}
    where: dict[str, Any] = {}
    if stages > 1:
        groups = ProcessGroupCollection.use_mpu_process_groups()
        groups.pp = _Group(stage, stages)
        # No embedding group: the first stage's weights are copied to the last stage's
        # copies below, as Megatron's all-reduce at construction does.
        groups.embd = groups.pos_embd = None
        extra = {"pre_process": pre, "post_process": post, "vp_stage": vp_stage,
                 "pg_collection": groups}
        where = {"vp_stage": vp_stage, "pp_rank": stage}
    if upstream.hybrid is not None:
        model, bound = _build_hybrid(config, upstream, stage, stages, index, chunks, extra)
        return Chunk(prefix=prefix, stage=stage, index=index, model=model, bound=bound,
                     pre_process=pre, post_process=post)
    if upstream.t5_encoder_layers is not None:
        return Chunk(prefix=prefix, stage=stage, index=index, model=_build_t5(config, upstream),
                     bound={}, pre_process=pre, post_process=post, t5=True)
    with pipeline_rank(stage, stages, index, chunks), \
            _recording_binder(classes["gpt_model"]) as bound:
        # A failure here is the cross-check's, not the input's.
        spec = layer_spec(config, where, upstream.layer_spec)
        block = mtp_spec(config, spec, where)
        try:
            model = classes["GPTModel"](config=config, transformer_layer_spec=spec,
                                        mtp_block_spec=block, **upstream.model_kwargs, **extra)
        except (AssertionError, ValueError, AttributeError, TypeError, ImportError,
                NotImplementedError) as exc:
            raise Rejected(f"GPTModel: {type(exc).__name__}: {exc}{_where(exc)}") from exc
    return Chunk(prefix=prefix, stage=stage, index=index, model=model, bound=bound,
                 pre_process=pre, post_process=post)


@contextlib.contextmanager
def _group_answers() -> Iterator[None]:
    """HybridModel asks torch.distributed for its pipeline rank and size
    (`select_pipeline_segment`, hybrid_layer_allocation.py): the chunk's `_Group` answers."""
    import torch.distributed as dist

    get_rank, get_world_size = dist.get_rank, dist.get_world_size

    def rank(group: Any = None) -> int:
        return group.rank() if isinstance(group, _Group) else get_rank(group)

    def size(group: Any = None) -> int:
        return group.size() if isinstance(group, _Group) else get_world_size(group)

    dist.get_rank, dist.get_world_size = rank, size
    try:
        yield
    finally:
        dist.get_rank, dist.get_world_size = get_rank, get_world_size


def _seed_rng_tracker(seed: int) -> None:
    """Megatron's model-parallel RNG states, as training's initialization seeds them: the Mamba
    mixer draws its parameters inside `get_cuda_rng_tracker().fork()` (on CPU the tracker's
    CUDA states are the CPU generator's, environment.py)."""
    from megatron.core.tensor_parallel import random

    random.get_cuda_rng_tracker().reset()
    random.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)


def _build_hybrid(config: Any, upstream: UpstreamInput, stage: int, stages: int, index: int,
                  chunks: int | None, extra: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """One HybridModel chunk, as hybrid_builders.py builds it: the stack spec (whose
    mtp_block_spec builds the MTP depths from the pattern) and the pattern arguments."""
    from qaudit.crosscheck.build_scope import mamba_bound

    classes = hybrid_classes()
    mamba_bound()
    model_class = classes["HybridModel"]
    accepted = inspect.signature(model_class).parameters
    # GPTModel-only arguments (RoPE scaling) change no linear module.
    kwargs = {key: value for key, value in upstream.model_kwargs.items() if key in accepted}
    with pipeline_rank(stage, stages, index, chunks), _group_answers(), \
            _recording_binder(classes["hybrid_model"]) as bound:
        spec = hybrid_stack_spec(upstream.layer_spec, config)
        try:
            model = model_class(config=config, hybrid_stack_spec=spec, **upstream.hybrid,
                                **kwargs, **extra)
        except (AssertionError, ValueError, AttributeError, TypeError, ImportError,
                NotImplementedError) as exc:
            raise Rejected(f"HybridModel: {type(exc).__name__}: {exc}{_where(exc)}") from exc
    return model, bound


def _build_t5(config: Any, upstream: UpstreamInput) -> Any:
    """T5Model as examples/t5/pretrain_t5.py's model_provider builds it: the encoder gets a copy
    of the config with the encoder's layer count, each block its TE block spec. T5Model has no
    finish_init walk (megatron/core/models/T5/t5_model.py), so no module binds a recipe config
    (docs/cross-check.md)."""
    import copy

    from megatron.core.models.T5 import t5_model, t5_spec

    encoder_config = copy.deepcopy(config)
    encoder_config.num_layers = upstream.t5_encoder_layers
    accepted = inspect.signature(t5_model.T5Model).parameters
    kwargs = {key: value for key, value in upstream.model_kwargs.items() if key in accepted}
    try:
        return t5_model.T5Model(
            config=config, encoder_config=encoder_config,
            transformer_encoder_layer_spec=t5_spec.get_t5_encoder_with_transformer_engine_block_spec(
                upstream.t5_encoder_layers),
            transformer_decoder_layer_spec=t5_spec.get_t5_decoder_with_transformer_engine_block_spec(
                config.num_layers), **kwargs)
    except (AssertionError, ValueError, AttributeError, TypeError, ImportError,
            NotImplementedError) as exc:
        raise Rejected(f"T5Model: {type(exc).__name__}: {exc}{_where(exc)}") from exc


def _share_embedding_copies(chunks: list[Chunk]) -> None:
    first = getattr(chunks[0].model, "embedding", None)
    if first is None or len(chunks) == 1:
        return
    source = first.word_embeddings.weight
    for chunk in chunks[1:]:
        for param in chunk.model.parameters():
            if getattr(param, "shared_embedding", False) and param.shape == source.shape:
                with torch.no_grad():
                    param.copy_(source)


def te_linear_classes() -> tuple[type, ...]:
    """TE's linear base classes as Megatron bound them: the stand-in's, or a real TE's."""
    from megatron.core.extensions import transformer_engine as extension

    pytorch = extension.te.pytorch
    return tuple(getattr(pytorch, name) for name in ("Linear", "LayerNormLinear",
                                                     "GroupedLinear") if hasattr(pytorch, name))


def linear_modules(chunks: list[Chunk]) -> list[tuple[str, torch.nn.Module]]:
    """(row name, module) of every linear module, chunk by chunk, in upstream's order."""
    te_classes = te_linear_classes()
    found = []
    for chunk in chunks:
        for name, module in chunk.model.named_modules():
            mcore = type(module).__name__ in MCORE_LINEARS or (
                type(module).__name__ == "Linear" and type(module).__module__ == MODELOPT_LINEAR)
            if isinstance(module, te_classes) or (mcore and not isinstance(module, te_classes)):
                found.append((chunk.prefix + name, module))
    return found


def run_training(chunks: list[Chunk], probe: CallProbe, steps: int,
                 microbatches: int, vocab: int, seq_length: int, seed: int = 0,
                 fsdp: FsdpGrads = NO_FSDP, values: bool = True,
                 observer: LiveObserver | None = None) -> None:
    """qaudit's training loop around upstream's model chunks: re-arm through upstream's own
    set_is_first_microbatch at each step's first microbatch, forward through every chunk in
    order (one process, as qaudit's own pipelined run), backward, update.
    `fsdp`: what Megatron-FSDP sets on the parameters and whether it drains main_grad after
    every microbatch (qaudit/run/fsdp.py). `values` False, on qaudit's stand-in TE (whose
    GEMMs compute no values): no buffer zeroed or drained, no weight updated, as qaudit's
    own run without --verify (qaudit/run/train.py). TE's own Python computes real values
    and may decide on them, so that side keeps them. `observer`: the guard's observer, told
    each step and microbatch as the guard's hooks on Megatron's schedule tell it."""
    modules = torch.nn.ModuleList(chunk.model for chunk in chunks)
    params = attach_grad_buffers(modules, fsdp, values=values)
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(microbatches):
        tokens = torch.randint(0, vocab, (2, seq_length + 1), generator=generator)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    position_ids = torch.arange(seq_length).unsqueeze(0).expand(2, -1)
    stages = max(chunk.stage for chunk in chunks) + 1
    virtual = max(chunk.index for chunk in chunks) + 1
    modules.train()
    for _ in range(steps):
        zero_grad_buffer(params, values)
        probe.recorder.start_step()
        if observer is not None:
            observer.start_step(zeroed=values)
        for index, (tokens, labels) in enumerate(batches):
            probe.recorder.start_microbatch(buffers_drained=fsdp.drained_each_backward)
            if observer is not None:
                observer.start_microbatch(index, drained=fsdp.drained_each_backward and index > 0)
            hidden = None
            for chunk in chunks:
                with pipeline_rank(chunk.stage, stages, chunk.index,
                                   virtual if virtual > 1 else None):
                    if index == 0:
                        chunk.model.set_is_first_microbatch()
                    if not chunk.pre_process:
                        chunk.model.set_input_tensor(hidden)
                    if chunk.t5:  # the decoder reads the tokens shifted right, as qaudit's T5
                        hidden = chunk.model(tokens, torch.roll(tokens, 1, dims=1),
                                             *_t5_masks(tokens), lm_labels=labels)
                    else:
                        hidden = chunk.model(tokens, position_ids, None,
                                             labels=labels if chunk.post_process else None)
            hidden.float().mean().backward()
            if fsdp.drained_each_backward and values:
                drain_into_sharded_grads(params)
        if values:
            apply_update(params)


def _t5_masks(tokens: torch.Tensor) -> tuple[Any, Any, Any]:
    """Encoder, decoder and cross-attention masks as pretrain_t5.py gives TE's padding
    attention (megatron/core/datasets/t5_dataset.py, config_attention_mask, TE >= 1.10):
    [b, 1, 1, s] with True where masked (none here: no padding), no decoder mask (causal),
    a (decoder, encoder) pair for cross-attention."""
    nothing_masked = torch.zeros(tokens.shape[0], 1, 1, tokens.shape[1], dtype=torch.bool)
    return nothing_masked, None, (nothing_masked, nothing_masked)


def _where(exc: BaseException) -> str:
    """ (at megatron/...py:LINE): the upstream line that raised, so that a refusal can be
    told from a gap in the CPU stand-ins."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/megatron/" in f.filename]
    if not frames:
        return ""
    path = frames[-1].filename
    return f" (at {path[path.rindex('/megatron/') + 1:]}:{frames[-1].lineno})"


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _tracked(records: list[CallRecord]) -> str:
    """Observed: `no` when every call got None, `yes` when a later step got True again
    (re-armed), `stale` when only the first step's first call did."""
    if all(r.flag is None for r in records):
        return "no"
    return "yes" if any(r.flag is True and r.step > 0 for r in records) else "stale"


def module_facts(chunks: list[Chunk], probe: CallProbe | None,
                 mcore_decisions: dict[str, list[str]]) -> list[ModuleFacts]:
    records: dict[str, list[CallRecord]] = defaultdict(list)
    if probe is not None:
        for record in probe.recorder.calls:
            records[record.module].append(record)
    bound = {chunk.prefix + name: key for chunk in chunks for name, key in chunk.bound.items()}
    facts = []
    te_classes = te_linear_classes()
    for name, module in linear_modules(chunks):
        te = isinstance(module, te_classes)
        upstream_class = type(module).__name__
        wrapper = module if te else None
        run: dict[str, Any] = {}
        if probe is not None:
            own = records.get(name, [])
            if not te:
                _assign_decisions(own, mcore_decisions.get(name, []))
            run = {"precision": precision_of(own), "tracked": _tracked(own) if te else "-",
                   "accumulation": accumulation_of(own), "weight_cache": weight_cache_of(own),
                   "calls_per_microbatch": calls_per_microbatch(own, grad=True),
                   "nograd_calls_per_microbatch": calls_per_microbatch(own, grad=False)}
        facts.append(ModuleFacts(
            name=name, upstream_class=upstream_class, recipe=bound.get(name, "-"),
            will_execute_quantized=will_execute_label(
                getattr(wrapper, "will_execute_quantized", None)), **run))
    return facts


def _assign_decisions(records: list[CallRecord], decisions: list[str]) -> None:
    """Megatron's own linears: the fused kernel's writes (in order) go to the grad calls of
    each microbatch; without any, autograd produced the weight gradient."""
    grad_calls = [r for r in records if r.grad]
    if not decisions:
        for record in grad_calls:
            record.decision = "autograd"
        return
    for record, decision in zip(grad_calls, decisions):
        record.decision = decision


@contextlib.contextmanager
def observe_mcore_linears(chunks: list[Chunk], probe: CallProbe
                          ) -> Iterator[dict[str, list[str]]]:
    """Record calls of Megatron's own linears (forward pre-hooks) and how their wgrad GEMMs
    wrote main_grad (by buffer: APEX's kernel adds; TE's general_gemm as upstream asked)."""
    handles = []
    owners: dict[int, str] = {}
    decisions: dict[str, list[str]] = defaultdict(list)
    te_classes = te_linear_classes()
    for name, module in linear_modules(chunks):
        if isinstance(module, te_classes):
            continue

        def hook(module: torch.nn.Module, args: Any, kwargs: Any, name: str = name) -> None:
            probe.recorder.on_forward(name, None, torch.is_grad_enabled(), None, module.training)
            weight = kwargs.get("weight") if kwargs.get("weight") is not None else module.weight
            owners[id(weight)] = name

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield decisions
    finally:
        for handle in handles:
            handle.remove()
        params = {id(getattr(p, "main_grad", None)): id(p)
                  for chunk in chunks for p in chunk.model.parameters()}
        for buffer, decision in output_writes():
            owner = owners.get(params.get(id(buffer), -1))
            if owner is not None:
                decisions[owner].append(decision)


def build_and_run(upstream: UpstreamInput, steps: int, microbatches: int, seed: int = 0,
                  run: bool = True, te_on_cpu: bool = False,
                  observer: LiveObserver | None = None) -> BuiltModel:
    """`te_on_cpu`: Megatron's TE is TE's own Python on the CPU kernel stand-in; its modules'
    calls are recorded at TE's own forwards (te_side.observing) instead of by standin_te.
    `observer` (te_on_cpu only): the guard watches the same training run, installed outside
    the cross-check's own recording so that each sees every call and every GEMM."""
    # upstream_environment restores os.environ afterwards.
    os.environ.update(upstream.environment)
    if te_on_cpu:
        upstream.notes.extend(_sized_for_mxfp8_attention(upstream))
    try:
        _, chunks = build_model(upstream, seed)
    except Rejected as exc:
        if isinstance(exc.__cause__, NotStoodIn):
            # TE's own Python needs a kernel the CPU stand-in lacks to build a module: not
            # Megatron's refusal, and nothing built to compare.
            return BuiltModel([], ran=False, skipped=(
                f"TE's own Python cannot build this config on the CPU kernel stand-in: "
                f"{_one_line(str(exc.__cause__), 200)}{_where(exc.__cause__)}"))
        return BuiltModel([], ran=False, rejected=_one_line(str(exc)))
    notes = list(upstream.notes)
    if not run:
        return BuiltModel(module_facts(chunks, None, {}), ran=False, notes=notes)
    if te_on_cpu:
        notes.extend(_unfused_attention_on_cpu(chunks))
    probe = CallProbe()
    probe.names = {id(module): name for name, module in linear_modules(chunks)}
    try:
        guarded = contextlib.nullcontext()
        if observer is not None:
            observer.watch([(chunk.prefix, chunk.model) for chunk in chunks])
            guarded = observer.installed()
        with guarded:
            observed = te_side.observing(probe) if te_on_cpu else standin_te.probing(probe)
            with observed, observe_mcore_linears(chunks, probe) as decisions:
                if observer is not None:
                    observer.recording = True
                run_training(chunks, probe, steps, microbatches,
                             upstream.model_kwargs["vocab_size"],
                             upstream.model_kwargs["max_sequence_length"], seed,
                             upstream.fsdp, values=te_on_cpu, observer=observer)
                if observer is not None:
                    observer.recording = False
    except standin_te.NotOnCPU as exc:
        # A feature of this config runs a CUDA kernel: compare what was built.
        return BuiltModel(module_facts(chunks, None, {}), ran=False,
                             notes=notes + [f"the training run needs {exc}; compared as built"])
    except NotStoodIn as exc:
        # TE's own Python called a kernel the CPU kernel stand-in does not provide.
        return BuiltModel(module_facts(chunks, None, {}), ran=False, notes=notes + [
            f"the training run on TE's own Python stopped: {_one_line(str(exc), 200)}"
            f"{_where(exc)}; compared as built"])
    except (RuntimeError, AssertionError, ValueError, TypeError, AttributeError,
            IndexError) as exc:
        # Upstream's forward or backward failed here (the note names its line): what was built
        # is still compared.
        failure = _one_line(f"{type(exc).__name__}: {exc}", 200)
        return BuiltModel(module_facts(chunks, None, {}), ran=False, notes=notes + [
            f"the training run failed in Megatron's code: {failure}{_where(exc)}; compared "
            "as built"])
    return BuiltModel(module_facts(chunks, probe, decisions), ran=True, notes=notes)
