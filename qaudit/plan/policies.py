"""How Megatron decides the `is_first_microbatch` value it passes to TE.

A tracking behaviour has two halves that changed independently across Megatron releases
(docs/megatron-releases.md): which config settings make `set_is_first_microbatch` re-arm the
flags at a schedule's first microbatch, and what a TE wrapper passes at each call. One small
strategy object per upstream behaviour; the re-arm half is data so that the behaviour read from
an installed Megatron's code can be reproduced exactly (qaudit/plan/upstream/detect.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from qaudit.load.config import ModelConfig

# The config settings upstream's re-arm guard has tested, in the order they were added.
REARM_SETTINGS = ("fp8", "fp4", "use_kitchen", "quant_recipe")


class TrackedModule(Protocol):
    is_first_microbatch: bool
    disable_parameter_transpose_cache: bool
    config: ModelConfig

    def will_execute_quantized(self, is_context_quantized: bool) -> bool: ...


def is_first_microbatch_tracked(config: ModelConfig, module: object | None = None,
                                is_context_quantized: bool | None = None) -> bool:
    """PR #7353's predicate, in its order: config, kitchen, missing hook, module answer."""
    if not config.is_tracked():
        return False
    if module is None:
        return True
    if config.use_kitchen:
        return True
    hook = getattr(module, "will_execute_quantized", None)
    if hook is None:
        return True
    return bool(hook(bool(is_context_quantized)))


@dataclass(frozen=True)
class TrackingPolicy:
    name: str = ""
    upstream: str = ""
    summary: str = ""
    # Settings whose presence re-arms the flags; None: re-arm whatever the config says.
    rearm_on: tuple[str, ...] | None = REARM_SETTINGS

    def rearms(self, config: ModelConfig) -> bool:
        """Whether `set_is_first_microbatch` re-arms the flags at a schedule's first microbatch."""
        if self.rearm_on is None:
            return True
        return any(getattr(config, setting) for setting in self.rearm_on)

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        raise NotImplementedError

    def rearming_on(self, settings: tuple[str, ...] | None) -> "TrackingPolicy":
        """The same passing rule with another re-arm guard (as read from an installed Megatron)."""
        return replace(self, rearm_on=settings)

    def rearm_text(self) -> str:
        if self.rearm_on is None:
            return "always"
        return " | ".join(self.rearm_on) if self.rearm_on else "never"


@dataclass(frozen=True)
class LegacyPolicy(TrackingPolicy):
    name: str = "legacy"
    upstream: str = "megatron-core 0.19.x; Megatron-LM main before PR #6965"
    summary: str = "pass the module's flag unless the transpose cache is disabled"

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        if module.disable_parameter_transpose_cache:
            return None
        return module.is_first_microbatch


@dataclass(frozen=True)
class ConfigPolicy(TrackingPolicy):
    name: str = "config"
    upstream: str = "Megatron-LM main with PR #6965"
    summary: str = "pass None when the config is not quantized (no fp8/fp4/kitchen/quant_recipe)"

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        if module.disable_parameter_transpose_cache or not module.config.is_tracked():
            return None
        return module.is_first_microbatch


@dataclass(frozen=True)
class ModulePolicy(TrackingPolicy):
    name: str = "module"
    upstream: str = "Megatron-LM PR #7353 (open)"
    summary: str = "pass None unless this module will execute quantized"

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        if module.disable_parameter_transpose_cache:
            return None
        if not is_first_microbatch_tracked(module.config, module, is_context_quantized):
            return None
        return module.is_first_microbatch


@dataclass(frozen=True)
class Pre5642Policy(LegacyPolicy):
    name: str = "pre-5642"
    upstream: str = "megatron-core 0.9.0-0.18.2 (before PR #5642)"
    summary: str = "as legacy, but a quant_recipe alone does not re-arm the flags"
    rearm_on: tuple[str, ...] | None = ("fp8", "fp4", "use_kitchen")


@dataclass(frozen=True)
class AlwaysRearmPolicy(LegacyPolicy):
    name: str = "always-rearm"
    upstream: str = "megatron-core 0.5.0-0.8.0"
    summary: str = "as legacy, but the flags are re-armed every step whatever the precision"
    rearm_on: tuple[str, ...] | None = None


POLICIES: dict[str, TrackingPolicy] = {
    p.name: p for p in (LegacyPolicy(), ConfigPolicy(), ModulePolicy(), Pre5642Policy(),
                        AlwaysRearmPolicy())}
# The behaviours --compare-policies puts side by side: released, main, proposed.
COMPARED_POLICIES = ("pre-5642", "legacy", "config", "module")
