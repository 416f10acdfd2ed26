"""Bridge's `mixed_precision` section, applied to the model as Bridge applies it.

Facts from Megatron-Bridge v0.6.0 `src/megatron/bridge/training/mixed_precision.py` (unchanged
at main 067f987; the 0.6.2 wheel adds `nemotron_3_ultra_bf16_with_nvfp4_mixed`): `runtime_config_update()` turns a recipe name into its `MixedPrecisionConfig`,
calls `finalize()` (an unset `fp8_param` / `fp4_param` takes the `*_param_gather` value) and
`setup()`, which copies **every** field the model also has onto the model, whatever its value
(a null `fp8` clears the model's). So the section wins over the model's own fields, whether the
dump was written before that update (`run_recipe.py --dry-run`) or after it (`run_config.yaml`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# MixedPrecisionConfig's defaults (fields that reach a model config; fp8_recipe is
# "tensorwise" here, not TransformerConfig's "delayed").
DEFAULTS: dict[str, Any] = {
    "fp32": False, "fp16": False, "bf16": False,
    "params_dtype": None, "pipeline_dtype": None, "autocast_dtype": None,
    "fp8": None, "fp8_recipe": "tensorwise", "first_last_layers_bf16": False,
    "fp8_margin": 0, "fp8_amax_history_len": 1, "fp8_amax_compute_algo": "most_recent",
    "fp8_wgrad": True, "fp8_dot_product_attention": False, "fp8_multi_head_attention": False,
    "fp8_param": None, "fp8_param_gather": False,
    "fp4": None, "fp4_recipe": "nvfp4", "fp4_param": None, "fp4_param_gather": False,
    "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0,
    "grad_reduce_in_fp32": True, "reuse_grad_buf_for_mxfp8_param_ag": False,
    "autocast_enabled": False, "loss_scale": None, "initial_loss_scale": 4294967296,
    "min_loss_scale": 1.0, "loss_scale_window": 1000, "hysteresis": 2,
}

_BF16 = {"bf16": True, "params_dtype": "bfloat16", "pipeline_dtype": "bfloat16",
         "grad_reduce_in_fp32": True}
_FP16 = {"fp16": True, "params_dtype": "float16", "pipeline_dtype": "float16",
         "grad_reduce_in_fp32": False}
_DELAYED = {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_amax_history_len": 1024,
            "fp8_amax_compute_algo": "max", "fp8_param_gather": True}
_MXFP8 = {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
          "reuse_grad_buf_for_mxfp8_param_ag": True}
_CURRENT = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True,
            "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1,
            "fp8_param_gather": True}
_SUBCHANNEL = {"fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": False}
_NVFP4 = {"fp8": None, "fp4": "e2m1", "fp4_recipe": "nvfp4", "fp8_param_gather": False,
          "fp4_param_gather": True}

# Every recipe the release registers (MIXED_PRECISION_RECIPES; hyphens are accepted too):
# the fields each sets over the defaults above.
NAMED_RECIPES: dict[str, dict[str, Any]] = {
    "bf16_mixed": _BF16,
    "fp16_mixed": _FP16,
    "bf16_with_fp8_delayed_scaling_mixed": {**_BF16, **_DELAYED},
    "fp16_with_fp8_delayed_scaling_mixed": {**_FP16, **_DELAYED},
    "bf16_with_mxfp8_mixed": {**_BF16, **_MXFP8},
    "fp16_with_mxfp8_mixed": {**_FP16, **_MXFP8},
    "bf16_with_fp8_current_scaling_mixed": {**_BF16, **_CURRENT},
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": {
        **_BF16, **_CURRENT, "num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 2},
    "nanov2_bf16_with_fp8_current_scaling_mixed": {
        **_BF16, **_CURRENT, "fp8_recipe": "blockwise", "num_layers_at_start_in_bf16": 2,
        "num_layers_at_end_in_bf16": 2},
    "fp16_with_fp8_current_scaling_mixed": {**_FP16, **_CURRENT},
    "bf16_with_fp8_subchannel_scaling_mixed": {**_BF16, **_SUBCHANNEL},
    "fp16_with_fp8_subchannel_scaling_mixed": {**_FP16, **_SUBCHANNEL},
    "bf16_with_nvfp4_mixed": {**_BF16, **_NVFP4},
    "nemotron_3_super_bf16_with_nvfp4_mixed": {
        **_BF16, **_NVFP4, "first_last_layers_bf16": True, "num_layers_at_end_in_bf16": 14},
    # Added in 0.6.2 (the release the corpus dumps were written with): the last 16 in BF16.
    "nemotron_3_ultra_bf16_with_nvfp4_mixed": {
        **_BF16, **_NVFP4, "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 0,
        "num_layers_at_end_in_bf16": 16},
}

# MixedPrecisionConfig fields a model provider also has (setup copies them; the rest go to
# the optimizer and DDP configs only).
MODEL_FIELDS = ("fp16", "bf16", "params_dtype", "pipeline_dtype", "autocast_dtype",
                "fp8", "fp8_recipe", "first_last_layers_bf16", "fp8_margin",
                "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_wgrad",
                "fp8_dot_product_attention", "fp8_multi_head_attention", "fp8_param",
                "fp4", "fp4_recipe", "fp4_param", "num_layers_at_start_in_bf16",
                "num_layers_at_end_in_bf16")


QAUDIT_TABLE_VERSION = "0.6.2"


@dataclass(frozen=True)
class RecipeTable:
    """The named recipes a verdict uses: qaudit's table for a Bridge release, or the one read
    from the user's Bridge source (qaudit/plan/upstream/bridge_recipes.py)."""

    recipes: dict[str, dict[str, Any]]
    defaults: dict[str, Any] = field(default_factory=lambda: dict(DEFAULTS))
    # Said wherever the table is used: "Megatron-Bridge 0.6.2 at PATH", "qaudit's table ...".
    origin: str = f"qaudit's table for Megatron-Bridge {QAUDIT_TABLE_VERSION}"
    note: str | None = None  # why qaudit's table, when a Bridge was found but not read

    def describe(self) -> str:
        return self.origin + (f" ({self.note})" if self.note else "")


QAUDIT_TABLE = RecipeTable(NAMED_RECIPES)


def recipe_by_name(name: str, table: RecipeTable = QAUDIT_TABLE) -> dict[str, Any] | None:
    """A named recipe's finalized fields, or None when the table has no such recipe (Bridge's
    get_mixed_precision_config turns hyphens into underscores before its look-up)."""
    fields = table.recipes.get(name.replace("-", "_"))
    return None if fields is None else finalized({**table.defaults, **fields})


def finalized(values: dict[str, Any]) -> dict[str, Any]:
    """MixedPrecisionConfig.finalize(): an unset fp8_param/fp4_param follows *_param_gather.
    (Setting either one of a pair sets the other too; a dump holds them agreeing.)"""
    result = dict(values)
    for param, gather in (("fp8_param", "fp8_param_gather"), ("fp4_param", "fp4_param_gather")):
        if result.get(param) is None:
            result[param] = bool(result.get(gather))
    return result


def model_updates(values: dict[str, Any]) -> list[tuple[str, Any]]:
    """What setup() writes onto the model, from the finalized section values: (field, value)."""
    return [(name, values[name]) for name in MODEL_FIELDS if name in values]
