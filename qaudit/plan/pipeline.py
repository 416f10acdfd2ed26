"""Pipeline layouts: which decoder layers each stage and virtual chunk holds (pure, no torch).

Megatron splits `num_layers` over `pipeline_model_parallel_size` stages and, with virtual
pipelining, each stage into `virtual_pipeline_model_parallel_size` model chunks; a hybrid
pattern's `|` separators give the chunks explicitly. Module names
inside a chunk use the layer's position in that chunk (`decoder.layers.0` exists once per
chunk), while the first/last BF16 rule uses the global layer index. The embedding lives on the
first stage; MTP and the output layer on the last chunk of the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from qaudit.errors import InputError

if TYPE_CHECKING:  # config.py validates layouts through this module
    from qaudit.load.config import ModelConfig


@dataclass(frozen=True)
class ModelChunk:
    stage: int
    chunk: int
    first_layer: int  # global 0-based index of the chunk's first decoder layer
    num_layers: int

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.first_layer + self.num_layers)


def _stage_counts(config: ModelConfig, stages: int) -> list[int]:
    """Decoder layers per stage, embedding/loss slots and uneven first/last stages included."""
    first, last = config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage
    if first is not None or last is not None:
        middle_stages = stages - (first is not None) - (last is not None)
        rest = config.num_layers - (first or 0) - (last or 0)
        if rest < 0 or (middle_stages == 0 and rest) or (middle_stages and rest % middle_stages):
            raise InputError(f"num_layers ({config.num_layers}) minus the first/last stage layers "
                             f"does not split evenly over {middle_stages} middle stage(s)",
                             file=config.file, line=config.line_of("num_layers_in_first_pipeline_stage")
                             or config.line_of("num_layers_in_last_pipeline_stage"),
                             key="num_layers_in_first_pipeline_stage")
        each = rest // middle_stages if middle_stages else 0
        counts = [each] * stages
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return counts
    # The embedding and the loss may each take the place of one layer in the split.
    slots = config.num_layers + config.account_for_embedding_in_pipeline_split \
        + config.account_for_loss_in_pipeline_split
    if slots % stages:
        raise InputError(f"{slots} layers (num_layers plus any embedding/loss slot) do not split "
                         f"evenly over pipeline_model_parallel_size={stages}", file=config.file,
                         line=config.line_of("pipeline_model_parallel_size"),
                         key="pipeline_model_parallel_size")
    counts = [slots // stages] * stages
    counts[0] -= config.account_for_embedding_in_pipeline_split
    counts[-1] -= config.account_for_loss_in_pipeline_split
    return counts


def _segment_layout(segments: tuple[str, ...], stages: int) -> list[ModelChunk]:
    """A hybrid pattern's '|' segments: segment c * stages + s is chunk c of stage s
    (upstream `select_pipeline_segment`); segment lengths may differ."""
    chunks, start = [], 0
    for index, segment in enumerate(segments):
        chunks.append(ModelChunk(index % stages, index // stages, start, len(segment)))
        start += len(segment)
    return chunks


def _explicit_layout(config: ModelConfig) -> list[ModelChunk]:
    """`pipeline_model_parallel_layout`: each chunk's decoder layers ('t'), in layer order
    (config validation has checked it; MTP is then on the last chunk of the last stage)."""
    from qaudit.load.pp_layout import read_layout

    stages = config.pipeline_model_parallel_size
    layout = read_layout(config.pipeline_model_parallel_layout, stages, config.num_layers,
                         config.mtp_depths)
    chunks, start = [], 0
    for index, count in enumerate(layout.decoder_counts()):
        chunks.append(ModelChunk(index % stages, index // stages, start, count))
        start += count
    return chunks


def pipeline_layout(config: ModelConfig) -> list[ModelChunk]:
    """Every model chunk, in the order a microbatch's forward passes through them."""
    stages = config.pipeline_model_parallel_size
    pattern = config.hybrid_pattern()
    if pattern is not None and pattern.has_pipes:
        return _segment_layout(pattern.segments, stages)
    if config.pipeline_model_parallel_layout is not None:
        return _explicit_layout(config)
    vpp = config.virtual_pipeline_model_parallel_size or 1
    counts = _stage_counts(config, stages)
    if vpp == 1:
        chunks, start = [], 0
        for stage, count in enumerate(counts):
            chunks.append(ModelChunk(stage, 0, start, count))
            start += count
        return chunks
    if config.num_layers_in_first_pipeline_stage is not None \
            or config.num_layers_in_last_pipeline_stage is not None:
        raise InputError("virtual pipelining with uneven first/last stages is not modelled yet",
                         file=config.file, line=config.line_of("virtual_pipeline_model_parallel_size"),
                         key="virtual_pipeline_model_parallel_size")
    embedding = int(config.account_for_embedding_in_pipeline_split)
    loss = int(config.account_for_loss_in_pipeline_split)
    slots_per_stage = counts[0] + embedding  # counts[0] had the embedding slot taken out
    if slots_per_stage % vpp:
        raise InputError(f"{slots_per_stage} layer slots per stage do not split into "
                         f"virtual_pipeline_model_parallel_size={vpp} chunks", file=config.file,
                         line=config.line_of("virtual_pipeline_model_parallel_size"),
                         key="virtual_pipeline_model_parallel_size")
    per_chunk = slots_per_stage // vpp
    # Chunk c of stage s holds the (c * stages + s)-th run of per_chunk slots; the embedding
    # slot is the very first, the loss slot the very last.
    chunks, start = [], 0
    for chunk in range(vpp):
        for stage in range(stages):
            count = per_chunk - (embedding if (stage, chunk) == (0, 0) else 0) \
                - (loss if (stage, chunk) == (stages - 1, vpp - 1) else 0)
            chunks.append(ModelChunk(stage, chunk, start, count))
            start += count
    return chunks


def is_pipelined(config: ModelConfig) -> bool:
    return config.pipeline_model_parallel_size > 1


def chunk_prefix(chunk: ModelChunk, config: ModelConfig) -> str:
    """The row-name prefix that tells equal chunk-local names apart."""
    if not is_pipelined(config):
        return ""
    vpp = config.virtual_pipeline_model_parallel_size or 1
    return f"stage{chunk.stage}/" if vpp == 1 else f"stage{chunk.stage}.chunk{chunk.chunk}/"
