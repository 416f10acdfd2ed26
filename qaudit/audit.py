"""load -> build -> run -> judge: one audit, returning a Report."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping

import torch

from qaudit.config import ModelConfig, load_model_config
from qaudit.cost import check_run_cost
from qaudit.distributed import World, agreed, all_gather, processes_on_this_machine
from qaudit.errors import InputError
from qaudit.megatron.dims import model_dims
from qaudit.megatron.gpt import GPTModel, build_model
from qaudit.megatron.policies import COMPARED_POLICIES, DEFAULT_POLICY, POLICIES
from qaudit.megatron.session import Session
from qaudit.probe import CallRecord
from qaudit.recipe import QuantRecipe, import_custom_factory, load_recipe
from qaudit.report import (Finding, ModuleRow, Report, accumulation_of, calls_per_microbatch,
                           precision_of, tracked_of)
from qaudit.rules import AuditFacts, judge
from qaudit.runtime import select_runtime
from qaudit.sizes import FULL_SIZE_BYTES_PER_PARAM, available_memory_bytes, model_params
from qaudit.sources import load_source_config
from qaudit.train import run_evaluation, run_training

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class AuditOptions:
    policy: str = DEFAULT_POLICY
    steps: int = 2
    microbatches: int = 2
    runtime: str = "auto"
    device: str | None = None  # cpu|cuda; None: the runtime's own (te: cuda, reference: cpu)
    seed: int = 0
    evaluation: bool = False  # forward-only, modules in eval mode
    verify: bool = False  # measure main_grad against an unfused float64 reference
    compare_policies: bool = False
    full_size: bool = False  # real widths instead of shrunk ones
    rank: int | None = None  # show one pipeline stage only
    # --set NAME=VALUE: values a launch script or MODEL_ARGS file takes from outside.
    variables: tuple[tuple[str, str], ...] = ()
    # --allow-import: import and call the recipes' custom_recipe_factory (Python code the
    # input names). Off: nothing is imported and such modules are reported "not executed".
    allow_import: bool = False
    # Under torchrun: this process's rank, which runs pipeline stage `world.rank`.
    world: World | None = None
    # --allow-long-audit: run even when the estimate is over qaudit.cost.MAX_SECONDS.
    allow_long_audit: bool = False


@dataclass
class AuditRun:
    """One built and run model with what the probes saw."""

    model: GPTModel
    session: Session
    records: dict[str, list[CallRecord]]
    rows: list[ModuleRow]
    facts: AuditFacts
    snapshot: dict[str, torch.Tensor] | None


def load_inputs(config_path: str, recipe_path: str | None = None,
                variables: Mapping[str, str] | None = None) -> tuple[ModelConfig, QuantRecipe | None]:
    """Load the model config and its recipe (`--recipe` wins over `quant_recipe`).

    The config is a bash launch script (`.sh` or a shell shebang), a functional-test YAML with
    `MODEL_ARGS`, or a TransformerConfig YAML (see `qaudit.sources`).
    """
    config = load_source_config(Path(config_path), config_path, variables) \
        or load_model_config(Path(config_path), config_path)
    if recipe_path is not None:
        config.quant_recipe = recipe_path
        return config, load_recipe(Path(recipe_path), recipe_path)
    if config.quant_recipe is None:
        return config, None
    # Relative to the config file, as a user reading the config expects.
    display = os.path.normpath(os.path.join(os.path.dirname(config_path), config.quant_recipe))
    if not os.path.isfile(display):  # False (not OSError) for a name too long or with a NUL
        raise InputError(f"recipe file {display!r} not found (paths are relative to the config file)",
                         file=config.file, line=config.line_of("quant_recipe"), key="quant_recipe")
    return config, load_recipe(Path(display), display)


def audit_files(config_path: str, recipe_path: str | None = None,
                options: AuditOptions = AuditOptions(), suggest: bool = False) -> Report:
    config, recipe = agreed(options.world,
                            lambda: load_inputs(config_path, recipe_path, dict(options.variables)))
    report = audit_config(config, recipe, options)
    if suggest:
        from qaudit.suggest import suggest as find_remedies

        report.suggestions = [asdict(s) for s in find_remedies(config, recipe, options, report)]
    return report


def run_audit(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions,
              policy_name: str | None = None) -> AuditRun:
    policy = POLICIES[policy_name or options.policy]

    def build() -> tuple[Session, GPTModel, dict[str, str]]:
        if options.world is not None:
            check_world_matches_stages(config, options.world)
        if options.full_size:
            check_full_size_fits(config, processes_here=processes_on_this_machine(options.world))
        session = Session(select_runtime(options.runtime, options.device), policy)
        model = build_model(config, model_dims(config, options.full_size), session, recipe,
                            seed=options.seed)
        check_run_cost(model.audited_modules(), steps=options.steps,
                       microbatches=options.microbatches, file=config.file,
                       runs=len(COMPARED_POLICIES) if options.compare_policies else 1,
                       allowed=options.allow_long_audit)
        factories = _import_custom_factories(model, recipe, options) if options.allow_import else {}
        return session, model, factories

    session, model, factories = agreed(options.world, build)
    every_module = model.audited_modules()  # all stages', in upstream order
    order = [m.fqn for m in every_module]
    te_modules = [m.fqn for m in every_module if m.is_te]
    match_names = {m.fqn: m.match_name for m in every_module}
    bindings = {m.fqn: (m.matcher, m.quant_config) for m in every_module
                if getattr(m, "quant_config", None) is not None}
    del every_module  # a stage's process drops the others' modules now
    runner = None
    if options.world is not None:
        from qaudit.megatron.stage_runner import StageRunner

        runner = StageRunner(model, options.world.rank)
    snapshot: dict[str, torch.Tensor] = {}

    def keep_last_step_weights(step: int) -> None:
        if options.verify and step == options.steps - 1:
            snapshot.update({name: p.detach().clone() for name, p in model.named_parameters()})

    if options.evaluation:
        run_evaluation(model, session.recorder, options.steps, options.microbatches, options.seed,
                       forward=runner.forward_only if runner else None)
    else:
        run_training(model, session.recorder, options.steps, options.microbatches, options.seed,
                     before_step=keep_last_step_weights,
                     microbatch_step=runner.train_microbatch if runner else None,
                     before_update=runner.sum_embedding_grads if runner else None)
    records: dict[str, list[CallRecord]] = defaultdict(list)
    for record in session.recorder.calls:
        records[record.module].append(record)
    modules = model.audited_modules()  # under torchrun, this rank's stage only
    rearmed = policy.rearms(config)
    rows = {}
    for module in modules:
        own = records.get(module.fqn, [])
        quant_config = getattr(module, "quant_config", None)
        rows[module.fqn] = ModuleRow(
            name=module.fqn, type=module.upstream_class, precision=_not_executed(precision_of(own)),
            recipe=quant_config.name if quant_config else "-",
            tracked=tracked_of(own, module.is_te, rearmed), accumulation=accumulation_of(own),
            calls_per_microbatch=calls_per_microbatch(own, grad=True),
            nograd_calls_per_microbatch=calls_per_microbatch(own, grad=False),
            stage=module.stage, chunk=module.chunk)
    overwrite = {m.fqn: any(getattr(p, "overwrite_main_grad", False) for p in m.weights()[:1])
                 for m in modules}
    records = dict(records)
    if runner is not None:  # every rank judges every stage's evidence
        rows, records, overwrite = _merge_stages(all_gather((rows, records, overwrite)))
    rows_in_order = [rows[name] for name in order]
    facts = AuditFacts(
        config=config, recipe=recipe, policy=policy, rows=rows_in_order, records=records,
        overwrite_main_grad=overwrite, te_modules=te_modules, match_names=match_names,
        bindings=bindings, evaluation=options.evaluation, allow_import=options.allow_import,
        custom_factories=factories)
    return AuditRun(model, session, records, rows_in_order, facts, snapshot or None)


def _merge_stages(per_rank: list[tuple[dict, dict, dict]]) -> tuple[dict, dict, dict]:
    merged: tuple[dict, dict, dict] = ({}, {}, {})
    for parts in per_rank:
        for into, part in zip(merged, parts):
            into.update(part)
    return merged


def check_world_matches_stages(config: ModelConfig, world: World) -> None:
    if config.is_t5:
        # Megatron cannot pipeline T5, and torchrun here means one pipeline stage per process.
        raise InputError("encoder-decoder (T5) models cannot be pipelined (Megatron's "
                         "pretrain_t5.py rejects it): run qaudit without torchrun",
                         file=config.file, line=config.line_of("encoder_num_layers"),
                         key="encoder_num_layers")
    stages = config.pipeline_model_parallel_size
    if world.size != stages:
        raise InputError(f"torchrun started {world.size} processes but the model has {stages} "
                         "pipeline stage(s) (pipeline_model_parallel_size): qaudit runs one "
                         f"stage per process, so start it with --nproc-per-node {stages}",
                         file=config.file, line=config.line_of("pipeline_model_parallel_size"),
                         key="pipeline_model_parallel_size")


def _import_custom_factories(model: GPTModel, recipe: QuantRecipe | None,
                             options: AuditOptions) -> dict[str, str]:
    """--allow-import only: import and call each custom_recipe_factory a bound module selects;
    factory path -> what it gave. The reference runtime cannot execute what it returns."""
    found: dict[str, str] = {}
    for module in model.audited_modules():
        quant_config = getattr(module, "quant_config", None)
        if quant_config is None:
            continue
        selected = quant_config.recipe_for(not options.evaluation)
        factory = selected.custom_recipe_factory
        if selected.quant is not None and selected.quant.recipe == "custom" and factory \
                and factory not in found:
            found[factory] = import_custom_factory(factory, recipe.file if recipe else None,
                                                   selected.line)
    return found


def _not_executed(precision: str) -> str:
    """A custom recipe runs as a per-tensor stand-in: say so in the row (rule QA020)."""
    return precision.replace("/custom", "/custom (not executed)")


def check_full_size_fits(config: ModelConfig, processes_here: int = 1) -> None:
    """Refuse a real-width build that cannot fit in memory, before allocating anything.
    Under torchrun every process builds the whole model before keeping its stage."""
    params = model_params(config)
    needed = params * FULL_SIZE_BYTES_PER_PARAM * processes_here
    available = available_memory_bytes()
    if available is not None and needed > 0.8 * available:
        each = f" for {processes_here} processes" if processes_here > 1 else ""
        raise InputError(f"--full-size needs about {needed / 2**30:.1f} GiB{each} ({params / 1e9:.2f} B "
                         f"parameters x {FULL_SIZE_BYTES_PER_PARAM} bytes) and "
                         f"{available / 2**30:.1f} GiB is available; audit the shrunk model "
                         "(the default: same layers, experts and MTP depths) or use a bigger "
                         "machine", file=config.file)


def _sorted_findings(findings: list[Finding], rows: list[ModuleRow]) -> list[Finding]:
    order = {row.name: i for i, row in enumerate(rows)}
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.rule,
                                           order.get(f.module, -1), f.file or "", f.line or 0,
                                           f.message))


def _with_verdicts(rows: list[ModuleRow], findings: list[Finding]) -> list[ModuleRow]:
    verdicts: dict[str, list[str]] = defaultdict(list)
    for finding in findings:
        if finding.module and finding.severity != "info" and finding.rule not in verdicts[finding.module]:
            verdicts[finding.module].append(finding.rule)
    return [replace(row, verdict=",".join(verdicts[row.name]) or "ok") for row in rows]


def module_group(name: str) -> str:
    """Collapse layer and expert indices: one group per module kind and block."""
    return re.sub(r"\.(layers|local_experts)\.\d+\.", r".\1.*.", name)


def group_verdicts(rows: list[ModuleRow]) -> dict[str, str]:
    groups: dict[str, set[str]] = {}
    for row in rows:
        rules = groups.setdefault(module_group(row.name), set())
        if row.verdict != "ok":
            rules.update(row.verdict.split(","))
    return {group: ",".join(sorted(rules)) or "ok" for group, rules in groups.items()}


def audit_config(config: ModelConfig, recipe: QuantRecipe | None,
                 options: AuditOptions = AuditOptions()) -> Report:
    if options.policy not in POLICIES:
        raise ValueError(f"unknown policy {options.policy!r}")
    # The shrunk model's tensors are tiny: extra intra-op threads only add synchronisation,
    # and spin badly when the machine is busy.
    threads = torch.get_num_threads()
    torch.set_num_threads(threads if options.full_size else 1)
    try:
        return _audit_config(config, recipe, options)
    finally:
        torch.set_num_threads(threads)


def _audit_config(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions) -> Report:
    run = run_audit(config, recipe, options)
    findings = judge(run.facts)
    rows = run.rows
    if options.verify and not options.evaluation:
        from qaudit.verify import verify_run

        rows, findings = verify_run(run, options, findings)
    findings = _sorted_findings(findings, rows)
    rows = _with_verdicts(rows, findings)
    report = Report(runtime=run.session.runtime.description, policy=run.facts.policy.name,
                    config=config.file or "<memory>", recipe=recipe.file if recipe else None,
                    steps=options.steps, microbatches=options.microbatches,
                    modules=rows, findings=findings)
    if options.compare_policies:
        report.policies = compare_policies(config, recipe, options, rows)
    if options.rank is not None:
        _keep_stage(report, config, options.rank)
    return report


def _keep_stage(report: Report, config: ModelConfig, stage: int) -> None:
    """--rank N: the modules of pipeline stage N, and the findings about them or about no module."""
    stages = config.pipeline_model_parallel_size
    if not 0 <= stage < stages:
        raise InputError(f"--rank {stage}: the model has pipeline stages 0..{stages - 1}",
                         file=config.file, line=config.line_of("pipeline_model_parallel_size"))
    report.modules = [row for row in report.modules if row.stage == stage]
    kept = {row.name for row in report.modules}
    report.findings = [f for f in report.findings if f.module is None or f.module in kept]


def compare_policies(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions,
                     current_rows: list[ModuleRow]) -> dict[str, dict[str, str]]:
    """Per module group, the verdict under each upstream tracking behaviour."""
    plain = replace(options, verify=False, compare_policies=False)
    per_policy = {}
    for name in COMPARED_POLICIES:
        if name == options.policy:
            rows = current_rows
        else:
            run = run_audit(config, recipe, plain, policy_name=name)
            rows = _with_verdicts(run.rows, judge(run.facts))
        per_policy[name] = group_verdicts(rows)
    groups = list(per_policy[COMPARED_POLICIES[0]])
    return {group: {name: per_policy[name][group] for name in COMPARED_POLICIES} for group in groups}
