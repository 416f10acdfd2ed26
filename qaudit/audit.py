"""load -> build -> run -> judge: one audit, returning a Report."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from qaudit.config import ModelConfig, load_model_config
from qaudit.errors import InputError
from qaudit.megatron.dims import model_dims
from qaudit.megatron.gpt import build_model
from qaudit.megatron.policies import DEFAULT_POLICY, POLICIES
from qaudit.megatron.session import Session
from qaudit.probe import CallRecord
from qaudit.recipe import QuantRecipe, load_recipe
from qaudit.report import ModuleRow, Report, accumulation_of, calls_per_microbatch, precision_of, tracked_of
from qaudit.rules import AuditFacts, judge
from qaudit.runtime import select_runtime
from qaudit.train import run_training

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class AuditOptions:
    policy: str = DEFAULT_POLICY
    steps: int = 2
    microbatches: int = 2
    runtime: str = "auto"
    seed: int = 0


def load_inputs(config_path: str, recipe_path: str | None = None) -> tuple[ModelConfig, QuantRecipe | None]:
    """Load the model config and its recipe (`--recipe` wins over `quant_recipe`)."""
    config = load_model_config(Path(config_path), config_path)
    if recipe_path is not None:
        config.quant_recipe = recipe_path
        return config, load_recipe(Path(recipe_path), recipe_path)
    if config.quant_recipe is None:
        return config, None
    # Relative to the config file, as a user reading the config expects.
    display = os.path.normpath(os.path.join(os.path.dirname(config_path), config.quant_recipe))
    if not Path(display).is_file():
        raise InputError(f"recipe file {display!r} not found (paths are relative to the config file)",
                         file=config.file, line=config.line_of("quant_recipe"), key="quant_recipe")
    return config, load_recipe(Path(display), display)


def audit_files(config_path: str, recipe_path: str | None = None,
                options: AuditOptions = AuditOptions()) -> Report:
    config, recipe = load_inputs(config_path, recipe_path)
    return audit_config(config, recipe, options)


def audit_config(config: ModelConfig, recipe: QuantRecipe | None,
                 options: AuditOptions = AuditOptions()) -> Report:
    if options.policy not in POLICIES:
        raise ValueError(f"unknown policy {options.policy!r}")
    policy = POLICIES[options.policy]
    session = Session(select_runtime(options.runtime), policy)
    model = build_model(config, model_dims(config), session, recipe, seed=options.seed)
    run_training(model, session.recorder, options.steps, options.microbatches, seed=options.seed)

    records: dict[str, list[CallRecord]] = defaultdict(list)
    for record in session.recorder.calls:
        records[record.module].append(record)
    modules = model.audited_modules()
    rearmed = policy.rearms(config)
    rows = []
    for module in modules:
        own = records.get(module.fqn, [])
        recipe_name = module.quant_config.name if getattr(module, "quant_config", None) else "-"
        rows.append(ModuleRow(
            name=module.fqn, type=module.upstream_class, precision=precision_of(own),
            recipe=recipe_name, tracked=tracked_of(own, module.is_te, rearmed),
            accumulation=accumulation_of(own),
            calls_per_microbatch=calls_per_microbatch(own, grad=True),
            nograd_calls_per_microbatch=calls_per_microbatch(own, grad=False)))
    overwrite = {m.fqn: any(getattr(p, "overwrite_main_grad", False) for p in m.weights()[:1])
                 for m in modules}
    facts = AuditFacts(config, recipe, policy, rows, dict(records), overwrite)
    findings = sorted(judge(facts), key=lambda f: (SEVERITY_ORDER[f.severity], f.rule,
                                                    [r.name for r in rows].index(f.module)
                                                    if f.module in records else -1))
    verdicts: dict[str, list[str]] = defaultdict(list)
    for finding in findings:
        if finding.module and finding.severity != "info" and finding.rule not in verdicts[finding.module]:
            verdicts[finding.module].append(finding.rule)
    rows = [replace(row, verdict=",".join(verdicts[row.name]) or "ok") for row in rows]
    return Report(runtime=session.runtime.description, policy=policy.name,
                  config=config.file or "<memory>", recipe=recipe.file if recipe else None,
                  steps=options.steps, microbatches=options.microbatches,
                  modules=rows, findings=findings)
