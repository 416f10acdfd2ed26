"""--suggest: try the known remedies for the errors found, keep those that make the audit pass.

Each remedy is re-audited, not guessed. Costs are stated in the terms a training team weighs:
memory (at the config's real widths), precision and speed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from qaudit.judge.report import Report
from qaudit.load.config import ModelConfig
from qaudit.load.recipe import Matcher, QuantConfig, QuantRecipe, TERecipe
from qaudit.load.yamlio import YamlMap
from qaudit.plan.sizes import mtp_depth_params
from qaudit.run.audit import effective_policy
from qaudit.run.options import AuditOptions

# bf16 weight + fp32 main_grad + fp32 master weight + two fp32 Adam moments.
TRAINING_BYTES_PER_PARAM = 2 + 4 + 4 + 8
KEEP_BF16 = "qaudit_keep_bf16"


@dataclass(frozen=True, kw_only=True)
class Suggestion:
    remedy: str
    passes: bool
    cost: str
    yaml: str
    remaining_errors: int


def _gib(params: int) -> str:
    return f"{params * TRAINING_BYTES_PER_PARAM / 2**30:.1f} GiB"


def _failing(report: Report) -> list[str]:
    return sorted({f.module for f in report.findings if f.severity == "error" and f.module})


def _bf16_pattern(modules: list[str]) -> str:
    prefixes = {m.split(".")[0] for m in modules}
    if prefixes == {"mtp"}:
        return "mtp.*"
    return modules[0] if len(modules) == 1 else "*"


def _recipe_forcing_bf16(recipe: QuantRecipe | None, pattern: str, file: str) -> QuantRecipe:
    hp = TERecipe(fp8_quantization_recipe=None, fp4_quantization_recipe=None,
                  custom_recipe_factory=None, fp8_format="e4m3", override_quantized_autocast=True,
                  override_nonquantized_autocast=False, tp_only_amax_red=False, fp8_param=False,
                  fp4_param=False)
    configs = YamlMap(recipe.configs if recipe else {})
    configs[KEEP_BF16] = {"transformer_engine_config_type": "TEQuantizationParams",
                          "training_recipe": {}}
    forced = QuantRecipe(file=recipe.file if recipe else file, configs=configs,
                         matchers=[Matcher(KEEP_BF16, pattern, KEEP_BF16, None)]
                         + (recipe.matchers if recipe else []),
                         disabled_matchers=recipe.disabled_matchers if recipe else [],
                         _parsed=dict(recipe._parsed) if recipe else {})
    forced._parsed[KEEP_BF16] = QuantConfig(KEEP_BF16, hp, None, None)
    return forced


def suggest(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions,
            report: Report, reaudit: Callable[..., Report]) -> list[Suggestion]:
    """The remedies for `report`'s errors, each re-audited with `reaudit(config, recipe,
    options)` (the check command's audit: passed in, so that this module does not import it)."""
    failing = _failing(report)
    if not failing:
        return []
    plain = replace(options, verify=False, compare_policies=False)
    candidates = []
    if config.mtp_use_repeated_layer and any(m.startswith("mtp.") for m in failing):
        extra = (config.mtp_depths - 1) * mtp_depth_params(config)
        candidates.append(("one MTP layer per depth", replace(config, mtp_use_repeated_layer=False),
                           recipe, plain,
                           f"memory: +{extra / 1e9:.2f} B parameters ({_gib(extra)} of weights, "
                           "gradients and Adam state before sharding); the depths no longer share "
                           "weights", "mtp_use_repeated_layer: false"))
    if "output_layer" in failing and config.fp8_output_proj:
        candidates.append(("Megatron's own output layer", replace(config, fp8_output_proj=False),
                           recipe, plain, "precision and speed: the output projection runs "
                           "bf16 instead of mxfp8", "fp8_output_proj: false"))
    if effective_policy(options).name in ("legacy", "pre-5642", "always-rearm"):
        candidates.append(("Megatron-LM main with PR #6965 (--megatron main)", config, recipe,
                           replace(plain, policy="config"), "none: an upgrade (configs without "
                           "fp8/fp4/kitchen/recipe pass None and accumulate)",
                           "# no YAML change: upgrade Megatron-LM"))
    quantized = [row.name for row in report.modules if row.name in failing and row.precision != "bf16"]
    if not quantized:
        candidates.append(("--policy module (needs Megatron-LM PR #7353)", config, recipe,
                           replace(plain, policy="module"), "none: the modules already run bf16, "
                           "PR #7353 stops tracking them", "# no YAML change: PR #7353"))
    else:
        pattern = _bf16_pattern(failing)
        candidates.append((f"--policy module with {pattern} forced to bf16 (needs Megatron-LM PR #7353)",
                           replace(config, quant_recipe=config.quant_recipe or "recipe"),
                           _recipe_forcing_bf16(recipe, pattern, config.file or "recipe.yaml"),
                           replace(plain, policy="module"),
                           f"precision/speed: {len(quantized)} module(s) run bf16 instead of quantized",
                           f"configs:\n  {KEEP_BF16}: {{transformer_engine_config_type: "
                           f"TEQuantizationParams, training_recipe: {{}}}}\nmatchers:   # put first\n"
                           f"  {KEEP_BF16}: {{type: glob, pattern: \"{pattern}\", config: {KEEP_BF16}, "
                           "enabled: true}"))
    any_quantized = any(row.precision not in ("bf16", "-") for row in report.modules)
    candidates.append(("no weight caching", replace(config, disable_parameter_transpose_cache=True),
                       recipe, plain, "speed: every quantized weight is re-quantized on every "
                       "microbatch (no cached weight or transpose)" if any_quantized else
                       "none here: no module runs quantized, so nothing is cached",
                       "disable_parameter_transpose_cache: true"))
    candidates.append(("no fused wgrad accumulation", replace(config, gradient_accumulation_fusion=False),
                       recipe, plain, "speed and memory: every weight gradient goes through "
                       "autograd's .grad and a hook adds it to main_grad (one extra gradient "
                       "buffer and copy per weight)", "gradient_accumulation_fusion: false"))
    results = []
    for remedy, new_config, new_recipe, new_options, cost, yaml_lines in candidates:
        errors = reaudit(new_config, new_recipe, new_options).counts().get("error", 0)
        results.append(Suggestion(remedy=remedy, passes=errors == 0, cost=cost, yaml=yaml_lines,
                                  remaining_errors=errors))
    return results
