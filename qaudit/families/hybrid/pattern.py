"""Hybrid (Mamba) layer patterns, parsed as Megatron's `hybrid_layer_allocation` does (pure, no torch).

A pattern is `<main>/<mtp>/<mtp>...`: one symbol per decoder layer, `|` between pipeline
segments of the main part, and after each `/` the layers of one MTP depth (all depths alike).
Facts and upstream paths: docs/hybrid.md.
"""

from __future__ import annotations

from dataclasses import dataclass

MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"
MODELLED = (MAMBA, ATTENTION, MLP, MOE)
# Valid upstream, but their layers (gated delta net, DeepSeek sparse attention, MLA) are not
# built by the audit: a pattern using them is refused by name rather than audited wrongly.
NOT_MODELLED = {"G": "gated delta net", "D": "DeepSeek sparse attention",
                "+": "multi-latent attention"}
PIPE, MTP_SEPARATOR = "|", "/"


@dataclass(frozen=True)
class HybridPattern:
    segments: tuple[str, ...]  # the main pattern split at '|' (one segment when there is none)
    mtp: str | None            # the layers of one MTP depth
    mtp_depths: int

    @property
    def main(self) -> str:
        return "".join(self.segments)

    @property
    def has_pipes(self) -> bool:
        return len(self.segments) > 1


def _check_symbols(part: str, where: str, allow_pipe: bool) -> None:
    for char in part:
        if char == PIPE and allow_pipe:
            continue
        if char in NOT_MODELLED:
            raise ValueError(f"'{char}' ({NOT_MODELLED[char]}) layers are not modelled by the "
                             f"audit; only {', '.join(repr(s) for s in MODELLED)} are")
        if char not in MODELLED:
            valid = "M (Mamba), * (attention), - (MLP), E (MoE)" + (", | (pipeline stage)"
                                                                   if allow_pipe else "")
            raise ValueError(f"{char!r} in the {where} pattern is not a layer symbol; "
                             f"expected {valid}")


def parse_pattern(pattern: str) -> HybridPattern:
    """Split and validate; ValueError says what is wrong (the caller adds file and line)."""
    if not isinstance(pattern, str):
        raise ValueError(f"expected a pattern string such as 'M-M*-', got {type(pattern).__name__}")
    main, *mtp_parts = pattern.split(MTP_SEPARATOR)
    _check_symbols(main, "main", allow_pipe=True)
    if not main.replace(PIPE, ""):
        raise ValueError("the main pattern has no layers")
    segments = tuple(main.split(PIPE))
    if any(not segment for segment in segments):
        raise ValueError("a '|' pipeline segment is empty")
    if not mtp_parts or all(part == "" for part in mtp_parts):
        return HybridPattern(segments, None, 0)  # upstream: a trailing '/' means no MTP
    first = mtp_parts[0]
    for depth, part in enumerate(mtp_parts[1:], start=2):
        if part != first:
            raise ValueError(f"all MTP depths must have the same pattern: depth 1 is "
                             f"{first!r}, depth {depth} is {part!r}")
    _check_symbols(first, "MTP", allow_pipe=False)
    if not first:
        raise ValueError("an MTP depth after '/' has no layers")
    return HybridPattern(segments, first, len(mtp_parts))


def composed_length(main: str, mtp: str, copies: int) -> int:
    """Characters of `main` followed by '/' + `mtp` once per depth, counted without building
    it: Bridge's finalize() and Megatron's legacy --mtp-hybrid-override-pattern compose the
    pattern that way, and a long MTP pattern times many depths would not fit in memory."""
    return len(main) + copies * (len(mtp) + 1)


def pattern_from_ratios(num_layers: int, attention_ratio: float, mlp_ratio: float) -> str:
    """The deprecated ratio allocation: attention layers evenly spaced among Mamba layers,
    then MLP layers evenly among the remaining Mamba ones (upstream `pattern_from_ratios`)."""
    types = [MAMBA] * num_layers
    attention = round(num_layers * attention_ratio)
    section = (num_layers - attention) / (attention + 1)
    x = section
    for i in range(num_layers):
        if x < 0.5:
            types[i] = ATTENTION
            x += section
        else:
            x -= 1
    mlp = round(num_layers * mlp_ratio)
    if mlp > 0:
        step = (num_layers - attention - mlp) / mlp
        x = step
        for i in range(num_layers):
            if types[i] == MAMBA:
                if x < 0.5:
                    types[i] = MLP
                    x += step
                else:
                    x -= 1
    return "".join(types)
