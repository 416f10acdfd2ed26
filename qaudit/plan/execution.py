"""Pure precision planning: ambient context per module group, then the recipe's decision.

No torch here: the model builder and wrappers call these functions, so the planned answer and
the executed one come from one place (docs/semantics.md §3.3 and §4).
"""

from __future__ import annotations

from qaudit.families import BASE
from qaudit.load.config import ModelConfig
from qaudit.load.precision import Quant
from qaudit.load.recipe import TERecipe


def is_first_last_bf16_layer(config: ModelConfig, layer_index: int,
                             num_layers: int | None = None) -> bool:
    """Megatron's rule on the global 0-based layer index; `num_layers`: the block's own count
    where it differs from config.num_layers (a T5 encoder's config copy)."""
    if not config.first_last_layers_bf16 or layer_index < 0:
        return False
    count = config.num_layers if num_layers is None else num_layers
    return (layer_index < config.num_layers_at_start_in_bf16
            or layer_index >= count - config.num_layers_at_end_in_bf16)


def decoder_layer_ambient(config: ModelConfig, layer_index: int,
                          num_layers: int | None = None) -> Quant | None:
    """Ambient precision of decoder layer `layer_index` (global, 0-based); also a T5 encoder
    layer's, with the encoder's `num_layers` (its block opens the same contexts)."""
    fp8 = config.global_fp8()
    if fp8 is not None:
        # Delayed scaling wraps the whole block in one autocast: no first/last exception.
        if fp8.recipe == "delayed":
            return fp8
        return None if is_first_last_bf16_layer(config, layer_index, num_layers) else fp8
    fp4 = config.global_fp4()
    if fp4 is not None:
        return None if is_first_last_bf16_layer(config, layer_index, num_layers) else fp4
    return None


def mtp_ambient(config: ModelConfig) -> Quant | None:
    """MTP layers are quantized iff fp8 is set; the fp4 context is not applied to them."""
    return config.global_fp8()


def hybrid_mtp_layer_ambient(config: ModelConfig, inner_index: int) -> Quant | None:
    """A layer inside a hybrid MTP depth: the MTP's fp8 context, or, under fp4, the inner
    HybridStack's own per-layer fp4 context with the BF16 rule on the inner index (0-based
    within the depth), since that stack opens contexts for fp8 and fp4 alike (docs/hybrid.md)."""
    if config.fp8:
        return config.global_fp8()
    if config.fp4 and not is_first_last_bf16_layer(config, inner_index):
        return config.global_fp4()
    return None


def te_output_layer_enabled(config: ModelConfig) -> bool:
    """HybridModel and T5Model (T5LMHead) always build Megatron's own output layer, whatever
    fp8_output_proj says."""
    return bool(config.fp8_output_proj and config.fp8 and config.fp8_recipe == "mxfp8"
                and config.family == BASE)  # only GPTModel builds a TE output layer


def output_layer_ambient(config: ModelConfig) -> Quant | None:
    return config.global_fp8() if te_output_layer_enabled(config) else None


def resolve_execution(ambient: Quant | None, recipe: TERecipe | None) -> Quant | None:
    """What a module executes in, given its ambient context and selected recipe (§3.3)."""
    if recipe is None:
        return ambient
    if ambient is not None:
        return recipe.quant if recipe.override_quantized_autocast else ambient
    return recipe.quant if recipe.override_nonquantized_autocast else None
