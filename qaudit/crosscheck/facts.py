"""One module as a builder saw it: the plain record both sides of the cross-check produce.

Kept free of torch and of either builder, so that any builder (qaudit's own model, the user's
Megatron on CPU, the same on a GPU with real TE) can hand over a plain list of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# Compared fields, in the order a difference names them.
COMPARED = ("upstream_class", "recipe", "will_execute_quantized", "precision", "tracked",
            "accumulation", "weight_cache", "calls_per_microbatch",
            "nograd_calls_per_microbatch")
# Only known once the model ran (a construction-only cross-check leaves them out).
RUN_FIELDS = ("precision", "tracked", "accumulation", "weight_cache", "calls_per_microbatch",
              "nograd_calls_per_microbatch")


@dataclass(frozen=True)
class ModuleFacts:
    name: str  # the module's name in its model chunk, with qaudit's stage prefix if pipelined
    upstream_class: str  # e.g. TELayerNormColumnParallelLinear, ColumnParallelLinear
    recipe: str  # the recipe config bound at finish_init, "-" for none
    # will_execute_quantized(False), will_execute_quantized(True) in training mode; "-" for
    # modules without the method (Megatron's own linears).
    will_execute_quantized: str
    precision: str = "-"
    tracked: str = "-"
    accumulation: str = "-"
    # What TE did with the cached quantized weight at each call (qaudit.run.rows.weight_cache_of).
    weight_cache: str = "-"
    calls_per_microbatch: int = 0
    nograd_calls_per_microbatch: int = 0


def will_execute_label(method) -> str:
    """'bf16-context/fp8-context' answers of a module's will_execute_quantized, as yes/no."""
    if method is None:
        return "-"
    return "/".join("yes" if method(context) else "no" for context in (False, True))


@dataclass
class BuiltModel:
    """What one builder built, in its build order."""

    modules: list[ModuleFacts]
    ran: bool  # forward and backward ran (else construction only)
    notes: list[str] = field(default_factory=list)  # what it left out, and why
    rejected: str | None = None  # why the builder's own checks refused the config
    skipped: str | None = None  # why this builder does not build such a model (nothing built)
    unknown_fields: list[str] = field(default_factory=list)  # config fields it does not have


class Builder(Protocol):
    """One side of the cross-check (docs/cross-check.md): builds the config its own way and
    hands back plain facts. Two today: qaudit's model (`QauditBuilder`, from the audit's run)
    and the installed Megatron (`UpstreamBuilder`, on CPU with the stand-in TE)."""

    def build(self) -> BuiltModel: ...
