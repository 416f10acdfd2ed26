"""Explicit pipeline layouts (`pipeline_model_parallel_layout`), read as Megatron reads them.

A layout lists, model chunk by model chunk, what each holds: `E` the embedding, `t` a decoder
layer, `m` an MTP layer, `L` the loss; `|` ends a chunk, `(...)*n` and `x*n` repeat, commas
are cosmetic ("Et*3|(tt|)*6tmL"). Chunk `c * PP + s` is virtual chunk `c` of stage `s`, so
the number of chunks sets the virtual pipeline size. The checks are upstream's
(docs/upstream-model.md, "Pipeline layouts"); an MTP block on a stage other than the last
("standalone" MTP) is valid upstream but not modelled here, and is refused as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Upstream's letters and the layer types they stand for (`LayerType` names in list form).
SYMBOLS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
LIST_NAMES = ("embedding", "loss", "encoder", "decoder", "mtp")
# A layout expands to one letter per layer plus separators; refuse before expanding one that
# would be larger than any buildable model (qaudit builds at most 1,024 layers).
MAX_EXPANDED = 1 << 16
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_SINGLE = re.compile(r"(.)\*(\d+)")


class LayoutError(ValueError):
    """A layout Megatron rejects, or one qaudit cannot model; the message says which."""


@dataclass(frozen=True)
class Layout:
    chunks: tuple[tuple[str, ...], ...]  # in layer order: index c * stages + s
    stages: int

    @property
    def virtual(self) -> int:
        return len(self.chunks) // self.stages

    def decoder_counts(self) -> list[int]:
        return [chunk.count("decoder") for chunk in self.chunks]


def _expand(text: str, pattern: re.Pattern[str]) -> str:
    """One left-to-right pass of a repetition rule (as upstream's single `re.sub`), bounded."""
    size = len(text)
    for match in pattern.finditer(text):
        count = match.group(2)  # digits only; long ones are refused before int() sees them
        size += len(match.group(1)) * int(count[-7:]) - len(match.group(0))
        if len(count.lstrip("0")) > 6 or size > MAX_EXPANDED:
            raise LayoutError(f"expands to more than {MAX_EXPANDED} symbols; no buildable model "
                              "has that many layers")
    return pattern.sub(lambda m: m.group(1) * int(m.group(2)), text)


def parse_layout_string(text: str) -> list[list[str]]:
    """The chunks of a layout string, each a list of layer type names."""
    flat = _expand(_expand(text.replace(",", ""), _GROUP), _SINGLE)
    chunks = []
    for part in flat.split("|"):
        unknown = sorted({ch for ch in part if ch not in SYMBOLS})
        if unknown:
            raise LayoutError(f"invalid layer character {unknown[0]!r}; the known ones are "
                              f"{', '.join(SYMBOLS)} (Megatron asserts it)")
        chunks.append([SYMBOLS[ch] for ch in part])
    return chunks


def parse_layout_list(value: list) -> list[list[str]]:
    """The list form (`[["embedding", "decoder"], ...]`): names as upstream's `LayerType`."""
    chunks = []
    for row in value:
        if not isinstance(row, list):
            raise LayoutError("must be a list of lists of layer types (Megatron asserts it)")
        names = []
        for item in row:
            name = item.strip().lower() if isinstance(item, str) else None
            if name not in LIST_NAMES:
                raise LayoutError(f"{item!r} is not a layer type; expected one of "
                                  f"{', '.join(LIST_NAMES)}")
            names.append(name)
        chunks.append(names)
    return chunks


def read_layout(value: str | list, stages: int, num_layers: int, mtp_layers: int) -> Layout:
    """Parse and check a layout as `PipelineParallelLayerLayout` and its
    `validate_layer_layout` do; raise LayoutError naming the broken rule."""
    chunks = parse_layout_string(value) if isinstance(value, str) else parse_layout_list(value)
    if len(chunks) % stages:
        raise LayoutError(f"{len(chunks)} model chunks do not split over "
                          f"pipeline_model_parallel_size={stages} (Megatron asserts it)")
    flat = [name for chunk in chunks for name in chunk]
    if not flat or flat[0] != "embedding" or flat.count("embedding") != 1:
        raise LayoutError("must begin with the embedding (E), given once (Megatron asserts it)")
    if flat[-1] != "loss" or flat.count("loss") != 1:
        raise LayoutError("must end with the loss (L), given once (Megatron asserts it)")
    if flat.count("decoder") != num_layers:
        raise LayoutError(f"holds {flat.count('decoder')} decoder layers (t), num_layers is "
                          f"{num_layers} (Megatron asserts they match)")
    if flat.count("mtp") != mtp_layers:
        raise LayoutError(f"holds {flat.count('mtp')} MTP layers (m), mtp_num_layers is "
                          f"{mtp_layers} (Megatron asserts they match)")
    if "mtp" in flat and "decoder" in flat[flat.index("mtp"):]:
        raise LayoutError("places a decoder layer after an MTP layer (Megatron asserts decoder "
                          "layers come first)")
    if "encoder" in flat:
        raise LayoutError("encoder layers are not supported in a layout (Megatron raises "
                          "NotImplementedError)")
    layout = Layout(tuple(tuple(chunk) for chunk in chunks), stages)
    holding = [i for i, chunk in enumerate(layout.chunks) if "mtp" in chunk]
    if holding:
        last_chunk = (layout.virtual - 1) * stages
        if any(i < last_chunk for i in holding):
            raise LayoutError("places MTP layers in a model chunk other than the last of its "
                              "stage (Megatron asserts against it)")
        if len(holding) > 1:
            raise LayoutError("splits the MTP layers over several stages (Megatron asserts all "
                              "are in one model chunk)")
        if holding[0] != len(layout.chunks) - 1:
            raise LayoutError(f"places the MTP layers on stage {holding[0] % stages}, not the "
                              "last: standalone MTP (a valid Megatron layout) is not modelled")
    return layout
