"""What a model provider's class path decides: the model family, or a refusal.

The `_target_` of `model:` is a class path such as
`megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider`. It is matched by name
only (never imported): the hybrid/Mamba/Nemotron-H providers are hybrid, T5 is T5, providers
under `megatron.bridge.diffusion` or of vision-language / multimodal models are refused (qaudit
builds none of their blocks), every other provider (Llama, Qwen, DeepSeek, Gemma, OLMoE,
GPT...) subclasses GPTModelProvider and is GPT.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qaudit.load.bridge.nodes import short_name

_DIFFUSION = re.compile(r"(^|\.)diffusion(\.|$)|(^|\.)(wan|flux|dit)(_|\.)|^(Wan|Flux|DiT)[A-Z]")
_VISION = re.compile(r"(^|[._])(vl|vlm|vision|llava|mimo|omni|avlm)([._]|$)|VL[A-Z]|VLModel|"
                     r"Vision|Llava|MIMO|Omni", re.IGNORECASE)
_HYBRID = re.compile(r"hybrid|mamba|nemotron_?h(?![a-z])", re.IGNORECASE)
_T5 = re.compile(r"(^|\.)t5(_|\.)|^T5", re.IGNORECASE)


@dataclass(frozen=True)
class Provider:
    target: str | None
    family: str  # "gpt", "hybrid", "t5" or "unsupported"
    why: str = ""

    @property
    def name(self) -> str | None:
        return short_name(self.target) if self.target else None


def classify(target: str | None) -> Provider:
    if target is None:
        return Provider(None, "gpt")
    name = short_name(target)
    if _DIFFUSION.search(target) or _DIFFUSION.search(name):
        return Provider(target, "unsupported", "a diffusion model: its DiT/WAN/Flux blocks are "
                        "not Megatron's GPT, hybrid or T5 layers, which are all qaudit builds")
    if _VISION.search(target.rsplit(".", 1)[0]) or _VISION.search(name):
        return Provider(target, "unsupported", "a vision-language model: its vision encoder "
                        "and projector are not modelled")
    if _T5.search(target) or _T5.search(name):
        return Provider(target, "t5")
    if _HYBRID.search(target):
        return Provider(target, "hybrid")
    return Provider(target, "gpt")
