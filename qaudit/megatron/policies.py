"""How Megatron decides the `is_first_microbatch` value it passes to TE (semantics.md §2.3).

Three upstream behaviours, one small strategy object each. All three re-arm the flags with the
config-level predicate; they differ only in the value passed at each call.
"""

from __future__ import annotations

from typing import Protocol

from qaudit.config import ModelConfig


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


class TrackingPolicy:
    name = ""
    upstream = ""
    summary = ""

    def rearms(self, config: ModelConfig) -> bool:
        """Whether `set_is_first_microbatch` re-arms the flags at a schedule's first microbatch."""
        return config.is_tracked()

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        raise NotImplementedError


class LegacyPolicy(TrackingPolicy):
    name = "legacy"
    upstream = "Megatron-LM main before PR #6965"
    summary = "pass the module's flag unless the transpose cache is disabled"

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        if module.disable_parameter_transpose_cache:
            return None
        return module.is_first_microbatch


class ConfigPolicy(TrackingPolicy):
    name = "config"
    upstream = "Megatron-LM PR #6965 (current upstream)"
    summary = "pass None when the config is not quantized (no fp8/fp4/kitchen/quant_recipe)"

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        if module.disable_parameter_transpose_cache or not module.config.is_tracked():
            return None
        return module.is_first_microbatch


class ModulePolicy(TrackingPolicy):
    name = "module"
    upstream = "Megatron-LM PR #7353 (open)"
    summary = "pass None unless this module will execute quantized"

    def flag_to_pass(self, module: TrackedModule, is_context_quantized: bool) -> bool | None:
        if module.disable_parameter_transpose_cache:
            return None
        if not is_first_microbatch_tracked(module.config, module, is_context_quantized):
            return None
        return module.is_first_microbatch


class Pre5642Policy(LegacyPolicy):
    name = "pre-5642"
    upstream = "Megatron-LM before PR #5642 (issue #5641)"
    summary = "as legacy, but a quant_recipe alone does not re-arm the flags"

    def rearms(self, config: ModelConfig) -> bool:
        return bool(config.fp8 or config.fp4 or config.use_kitchen)


POLICIES: dict[str, TrackingPolicy] = {
    p.name: p for p in (LegacyPolicy(), ConfigPolicy(), ModulePolicy(), Pre5642Policy())}
# The three behaviours --compare-policies puts side by side.
COMPARED_POLICIES = ("legacy", "config", "module")
DEFAULT_POLICY = "config"
