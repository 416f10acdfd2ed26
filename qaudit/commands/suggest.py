"""--suggest: try the known remedies for the errors found, keep those that make the audit pass.

Each remedy is re-audited, not guessed. Costs are stated in the terms a training team weighs:
memory (at the config's real widths), precision and speed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from qaudit.judge import remedies
from qaudit.judge.remedies import Remedy
from qaudit.judge.report import Report
from qaudit.load.config import ModelConfig
from qaudit.load.recipe import Matcher, QuantConfig, QuantRecipe, TERecipe
from qaudit.load.yamlio import YamlMap
from qaudit.run.audit import effective_policy
from qaudit.run.options import AuditOptions

KEEP_BF16 = "qaudit_keep_bf16"


@dataclass(frozen=True, kw_only=True)
class Suggestion:
    remedy: str
    passes: bool
    cost: str
    yaml: str
    remaining_errors: int


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


def _name(remedy: Remedy, pattern: str | None) -> str:
    if pattern is not None and remedy.name.startswith("--policy module"):
        return f"--policy module with {pattern} forced to bf16 (needs Megatron-LM PR #7353)"
    return remedy.name


def _paste(config: ModelConfig, remedy: Remedy, pattern: str | None) -> str:
    """What the user pastes: the setting in the input's own syntax, or the recipe entries."""
    if remedy.setting is not None:
        pasted = remedies.snippet(config, *remedy.setting)
        second = remedies.also_needed(config, remedy)
        if second is not None:  # upstream refuses the one without the other at start-up
            pasted += "\n# and: " + second
        return pasted
    if remedy.name.startswith("Megatron-LM main"):
        return "# no config change: upgrade Megatron-LM"
    if pattern is None:
        return "# no config change: PR #7353"
    return (f"configs:\n  {KEEP_BF16}: {{transformer_engine_config_type: "
            f"TEQuantizationParams, training_recipe: {{}}}}\nmatchers:   # put first\n"
            f"  {KEEP_BF16}: {{type: glob, pattern: \"{pattern}\", config: {KEEP_BF16}, "
            "enabled: true}")


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
        candidates.append((remedies.one_layer_per_depth(config),
                           replace(config, mtp_use_repeated_layer=False), recipe, plain))
    if "output_layer" in failing and config.fp8_output_proj:
        candidates.append((remedies.own_output_layer(), replace(config, fp8_output_proj=False),
                           recipe, plain))
    if effective_policy(options).name in ("legacy", "pre-5642", "always-rearm"):
        candidates.append((remedies.megatron_main(), config, recipe,
                           replace(plain, policy="config")))
    quantized = [row.name for row in report.modules if row.name in failing and row.precision != "bf16"]
    pattern = _bf16_pattern(failing) if quantized else None
    if pattern is None:
        candidates.append((remedies.module_policy(0), config, recipe,
                           replace(plain, policy="module")))
    else:
        candidates.append((remedies.module_policy(len(quantized)),
                           replace(config, quant_recipe=config.quant_recipe or "recipe"),
                           _recipe_forcing_bf16(recipe, pattern, config.file or "recipe.yaml"),
                           replace(plain, policy="module")))
    any_quantized = any(row.precision not in ("bf16", "-") for row in report.modules)
    candidates.append((remedies.no_weight_cache(any_quantized, config),
                       replace(config, disable_parameter_transpose_cache=True), recipe, plain))
    candidates.append((remedies.unfused_accumulation(config),
                       replace(config, gradient_accumulation_fusion=False), recipe, plain))
    # In the fix line's order (writable, then cheapest first); re-audited, those that pass
    # are listed first, the rest after them, marked with what remains.
    order = remedies.cheapest_first([candidate[0] for candidate in candidates], config)
    candidates.sort(key=lambda candidate: order.index(candidate[0]))
    results = []
    for remedy, new_config, new_recipe, new_options in candidates:
        errors = reaudit(new_config, new_recipe, new_options).counts().get("error", 0)
        results.append(Suggestion(remedy=_name(remedy, pattern),
                                  passes=errors == 0, cost=remedy.cost,
                                  yaml=_paste(config, remedy, pattern),
                                  remaining_errors=errors))
    return sorted(results, key=lambda suggestion: not suggestion.passes)  # stable
