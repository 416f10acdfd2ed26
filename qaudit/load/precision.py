"""What a module executes in: high precision (None) or one quantization recipe."""

from __future__ import annotations

from dataclasses import dataclass

FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
FP4_RECIPES = ("nvfp4",)
FP8_FORMATS = ("e4m3", "hybrid")


@dataclass(frozen=True, order=True)
class Quant:
    """A quantized execution mode: `fmt` fp8|fp4, TE recipe kind, fp8 format (e4m3|hybrid)."""

    fmt: str
    recipe: str
    fp8_format: str = "e4m3"

    @property
    def label(self) -> str:
        return f"{self.fmt}/{self.recipe}"


def precision_label(quant: Quant | None) -> str:
    """Table/JSON label: `bf16` for high precision, else e.g. `fp8/mxfp8`."""
    return "bf16" if quant is None else quant.label
