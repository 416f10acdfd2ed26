"""load -> build -> run -> judge: one audit, returning a Report."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping

import torch

from qaudit.load.config import ModelConfig, load_model_config
from qaudit.run.cost import check_run_cost
from qaudit.run.distributed import World, agreed, all_gather, processes_on_this_machine
from qaudit.errors import InputError
from qaudit.plan.dims import model_dims
from qaudit.model.gpt import GPTModel, build_model
from qaudit.plan.policies import COMPARED_POLICIES, POLICIES, TrackingPolicy
from qaudit.model.session import Session
from qaudit.model.probe import CallRecord
from qaudit.load.recipe import QuantRecipe, import_custom_factory, load_recipe
from qaudit.judge.report import (Finding, ModuleRow, Report, accumulation_of, calls_per_microbatch,
                           precision_of, tracked_of)
from qaudit.judge.rules import AuditFacts, judge
from qaudit.runtime import select_runtime
from qaudit.plan.sizes import FULL_SIZE_BYTES_PER_PARAM, available_memory_bytes, model_params
from qaudit.load.sources import load_source_config
from qaudit.run.train import run_evaluation, run_training
from qaudit.plan.upstream.target import MegatronTarget, check_config_runs_on, resolve_megatron
from qaudit.plan.upstream.te import TETarget, resolve_te

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class AuditOptions:
    # --policy: an explicit tracking behaviour, over the one of the Megatron below.
    policy: str | None = None
    # --megatron: "auto", "main" or a release; resolved once into a MegatronTarget.
    megatron: str | MegatronTarget = "auto"
    # --te: "auto", "main" or a TE release; resolved once into a TETarget.
    te: str | TETarget = "auto"
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
    # --cross-check: also build and run the config with the installed Megatron and compare.
    cross_check: bool = False
    # --allow-long-audit: run even when the estimate is over qaudit.run.cost.MAX_SECONDS.
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
    `MODEL_ARGS`, or a TransformerConfig YAML (see `qaudit.load.sources`).
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
    options = replace(options, megatron=megatron_target(options),  # once, for every re-audit
                      te=te_target(options))
    report = audit_config(config, recipe, options)
    if suggest:
        from qaudit.commands.suggest import suggest as find_remedies

        report.suggestions = [asdict(s) for s in find_remedies(config, recipe, options, report)]
    return report


def megatron_target(options: AuditOptions) -> MegatronTarget:
    if isinstance(options.megatron, MegatronTarget):
        return options.megatron
    return resolve_megatron(options.megatron)


def te_target(options: AuditOptions) -> TETarget:
    if isinstance(options.te, TETarget):
        return options.te
    return resolve_te(options.te)


def effective_policy(options: AuditOptions) -> TrackingPolicy:
    """--policy when given, else the behaviour of the Megatron the verdict is for."""
    if options.policy is not None:
        return POLICIES[options.policy]
    return megatron_target(options).behaviour.tracking_policy()


def run_audit(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions,
              policy_name: str | None = None) -> AuditRun:
    policy = POLICIES[policy_name] if policy_name else effective_policy(options)

    te = te_target(options)

    def build() -> tuple[Session, GPTModel, dict[str, str]]:
        if options.world is not None:
            check_world_matches_stages(config, options.world)
        if options.full_size:
            check_full_size_fits(config, processes_here=processes_on_this_machine(options.world))
        runtime = _runtime_for(config, options, te, recipe)
        session = Session(runtime, policy, te=te.behaviour)
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
        from qaudit.run.stage_runner import StageRunner

        runner = StageRunner(model, options.world.rank)
    snapshot: dict[str, torch.Tensor] = {}

    def keep_last_step_weights(step: int) -> None:
        if options.verify and step == options.steps - 1:
            snapshot.update({name: p.detach().clone() for name, p in model.named_parameters()})

    if options.evaluation or config.freeze_all_layers:
        run_evaluation(model, session.recorder, options.steps, options.microbatches, options.seed,
                       forward=runner.forward_only if runner else None,
                       frozen_training=not options.evaluation)
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
        frozen = bool(module.weights()) and not any(w.requires_grad for w in module.weights())
        rows[module.fqn] = ModuleRow(
            name=module.fqn, type=module.upstream_class, precision=_not_executed(precision_of(own)),
            recipe=quant_config.name if quant_config else "-",
            tracked=tracked_of(own, module.is_te, rearmed),
            accumulation="frozen" if frozen else accumulation_of(own),
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


# Settings only the reference runtime reproduces (docs/te-settings.md); the te runtime would
# need TE's own constructor arguments, quantized_model_init and graph capture for them.
_REFERENCE_ONLY = ("delay_wgrad_compute", "fp8_param", "fp4_param", "freeze_all_layers")


def reference_only_settings(config: ModelConfig, recipe: QuantRecipe | None = None) -> list[str]:
    found = [name for name in _REFERENCE_ONLY if getattr(config, name)]
    if config.graph_impl in ("local", "transformer_engine"):
        found.append("cuda_graph_impl")
    if recipe is not None and _recipe_has_primary_weights(recipe):
        found.append("quant_recipe")
    return found


def _recipe_has_primary_weights(recipe: QuantRecipe) -> bool:
    """A recipe config asking for primary quantized weights (read from the raw payloads: an
    invalid one is QA014's business)."""
    for payload in recipe.configs.values():
        for key in ("training_recipe", "evaluation_recipe"):
            part = payload.get(key) if isinstance(payload, dict) else None
            if isinstance(part, dict) and (part.get("fp8_param") is True
                                           or part.get("fp4_param") is True):
                return True
    return False


def _runtime_for(config: ModelConfig, options: AuditOptions, te: TETarget,
                 recipe: QuantRecipe | None = None):
    """The runtime, with `auto` falling back to reference for settings only it models."""
    needs_reference = reference_only_settings(config, recipe)
    name = options.runtime
    if name == "te" and te.source == "named":
        # The te runtime runs the installed TE; a named version is for the reference's model.
        raise InputError(f"--te {te.version} names the TE behaviour the reference runtime "
                         "models; --runtime te runs the installed Transformer Engine (leave "
                         "--te at auto, or use --runtime reference)")
    if name == "auto" and (needs_reference or te.source == "named"):
        name = "reference"
    if name == "te" and needs_reference:
        key = needs_reference[0]
        what = "primary quantized weights (the recipe's fp8_param)" if key == "quant_recipe" \
            else key
        raise InputError(f"--runtime te does not model {what} yet (the reference runtime does: "
                         "docs/te-settings.md); use --runtime reference",
                         file=config.file, line=config.line_of(key), key=key)
    return select_runtime(name, options.device,
                          reads_overwrite_main_grad=te.behaviour.reads_overwrite_main_grad)


def check_config_runs_on_te(config: ModelConfig, te: TETarget) -> None:
    """What Megatron refuses for the TE version audited for (megatron/core/extensions/
    transformer_engine.py, megatron/training/arguments.py): exit 2, as for a Megatron."""
    behaviour = te.behaviour
    line = config.line_of("delay_wgrad_compute")
    if config.delay_wgrad_compute and not behaviour.delay_wgrad:
        raise InputError(f"delay_wgrad_compute needs Transformer Engine 2.3 or newer (Megatron "
                         f"refuses it with {te.label()}); pass --te VERSION for the TE you run",
                         file=config.file, line=line, key="delay_wgrad_compute")
    if config.delay_wgrad_compute and not config.gradient_accumulation_fusion \
            and not behaviour.delay_wgrad_hooks:
        raise InputError(f"delay_wgrad_compute without gradient accumulation fusion needs "
                         f"Transformer Engine 2.7 or newer (Megatron asserts it; audited for "
                         f"{te.label()})", file=config.file, line=line, key="delay_wgrad_compute")


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
    if options.policy is not None and options.policy not in POLICIES:
        raise ValueError(f"unknown policy {options.policy!r}")
    target = megatron_target(options)
    check_config_runs_on(config, target)
    te = te_target(options)
    check_config_runs_on_te(config, te)
    options = replace(options, megatron=target, te=te)
    # The shrunk model's tensors are tiny: extra intra-op threads only add synchronisation,
    # and spin badly when the machine is busy.
    threads = torch.get_num_threads()
    torch.set_num_threads(threads if options.full_size else 1)
    try:
        return _audit_config(config, recipe, options)
    finally:
        torch.set_num_threads(threads)


def _audit_config(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions) -> Report:
    job = None
    if options.cross_check:
        from qaudit.crosscheck import CrossCheckJob, require_megatron

        # exit 2 before any work when there is none; the upstream side starts now, beside
        # the audit's own build and run
        job = CrossCheckJob(config, recipe, options, require_megatron())
    try:
        run = run_audit(config, recipe, options)
    except BaseException:
        if job is not None:
            job.cancel()
        raise
    if job is not None:
        run.facts.cross_check = job.result(run)
    findings = judge(run.facts)
    rows = run.rows
    if options.verify and not options.evaluation:
        from qaudit.judge.verify import verify_run

        rows, findings = verify_run(run, options, findings)
    findings = _sorted_findings(findings, rows)
    rows = _with_verdicts(rows, findings)
    report = Report(runtime=run.session.runtime.description, policy=run.facts.policy.name,
                    config=config.file or "<memory>", recipe=recipe.file if recipe else None,
                    steps=options.steps, microbatches=options.microbatches,
                    modules=rows, findings=findings,
                    megatron=megatron_target(options).to_dict(), te=te_target(options).to_dict())
    if run.facts.cross_check is not None:
        report.cross_check = run.facts.cross_check.to_dict()
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
    run_policy = effective_policy(options)
    # The audited run's rows stand for a column only when its behaviour is exactly that one.
    run_policy_name = run_policy.name if run_policy == POLICIES.get(run_policy.name) else None
    per_policy = {}
    for name in COMPARED_POLICIES:
        if name == run_policy_name:
            rows = current_rows
        else:
            run = run_audit(config, recipe, plain, policy_name=name)
            rows = _with_verdicts(run.rows, judge(run.facts))
        per_policy[name] = group_verdicts(rows)
    groups = list(per_policy[COMPARED_POLICIES[0]])
    return {group: {name: per_policy[name][group] for name in COMPARED_POLICIES} for group in groups}
