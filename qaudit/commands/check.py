"""`qaudit check`: load -> plan -> build and run -> judge, returning a Report."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, replace

import torch

from qaudit.errors import InputError
from qaudit.judge.report import Finding, ModuleRow, Report
from qaudit.judge.rules import judge
from qaudit.judge.rules.qa040_gemm_shape import gemm_shapes
from qaudit.load.bridge import locate_error
from qaudit.load.config import ModelConfig
from qaudit.load.recipe import QuantRecipe
from qaudit.plan.policies import COMPARED_POLICIES, POLICIES
from qaudit.plan.upstream.target import check_config_runs_on
from qaudit.commands.inputs import load_inputs
from qaudit.plan.full_size import check_full_size_tensors
from qaudit.run.audit import (check_config_runs_on_te, effective_policy, megatron_target,
                              run_audit, te_target)
from qaudit.run.options import AuditOptions
from qaudit.run.distributed import agreed
from qaudit.run.gc_pause import built_objects_set_aside

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def audit_files(config_path: str, recipe_path: str | None = None,
                options: AuditOptions = AuditOptions(), suggest: bool = False) -> Report:
    config, recipe = agreed(options.world,
                            lambda: load_inputs(config_path, recipe_path, dict(options.variables),
                                                options.overrides, options.megatron))
    return audit_inputs(config, recipe, options, suggest)


def audit_inputs(config: ModelConfig, recipe: QuantRecipe | None,
                 options: AuditOptions = AuditOptions(), suggest: bool = False) -> Report:
    """Audit inputs already loaded (`load_inputs`), with `--suggest`'s remedies when asked."""
    options = replace(options, megatron=megatron_target(options, config),  # once, for every re-audit
                      te=te_target(options))
    try:
        if options.full_size:  # before anything is built: real widths must make real tensors
            check_full_size_tensors(config)
        report = _audit_alternatives(config, recipe, options)
    except InputError as exc:  # about a field a Bridge override set: at the override
        raise locate_error(exc, config.source) from None
    if suggest:
        from qaudit.commands.suggest import suggest as find_remedies

        report.suggestions = [asdict(s) for s in find_remedies(config, recipe, options, report,
                                                                   reaudit=audit_config)]
    return report


def _audit_alternatives(config: ModelConfig, recipe: QuantRecipe | None,
                        options: AuditOptions) -> Report:
    """Audit every value of a setting the file cannot pin down (a Bridge dump's
    gradient_accumulation_fusion: false may be the build machine's probe) and keep the worse
    report: a higher exit code, then more errors, then more warnings; the first on a tie."""
    source = config.source
    alternatives = dict(source.alternatives) if source is not None else {}
    header = list(source.header_notes) if source is not None else []
    if not alternatives:
        report = audit_config(config, recipe, options)
    else:
        key, values = next(iter(alternatives.items()))  # readers give one such setting
        reports = [(value, audit_config(replace(config, **{key: value}), recipe, options))
                   for value in values]

        def badness(item: tuple[object, Report]) -> tuple[int, int, int]:
            counts = item[1].counts()
            return (item[1].exit_code(), counts.get("error", 0), counts.get("warning", 0))

        worst_value, report = max(reports, key=badness)  # max keeps the first of equals
        shown = ", ".join(f"{_yaml_word(v)}: {r.counts().get('error', 0)} error(s)"
                          for v, r in reports)
        header.append(f"{key} {shown}; reported: {_yaml_word(worst_value)}"
                      + (" (the worse)" if len({badness(item) for item in reports}) > 1
                         else " (same verdict)"))
    if source is not None and source.origin is not None:
        report.source = header
    return report


def _yaml_word(value: object) -> str:
    return {True: "true", False: "false", None: "null"}.get(value, str(value)) \
        if isinstance(value, (bool, type(None))) else str(value)


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
    # A row whose verdict stays is kept as it is (most of them: a model with sequential
    # experts has tens of thousands of rows).
    return [row if (verdict := ",".join(verdicts.get(row.name, ())) or "ok") == row.verdict
            else replace(row, verdict=verdict) for row in rows]


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
    target = megatron_target(options, config)
    check_config_runs_on(config, target)
    te = te_target(options)
    check_config_runs_on_te(config, te)
    options = replace(options, megatron=target, te=te)
    # The shrunk model's tensors are tiny: extra intra-op threads only add synchronisation,
    # and spin badly when the machine is busy.
    threads = torch.get_num_threads()
    torch.set_num_threads(threads if options.full_size else 1)
    try:
        with built_objects_set_aside():  # the built model stays frozen through the rules
            return _audit_config(config, recipe, options)
    finally:
        torch.set_num_threads(threads)


def _audit_config(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions) -> Report:
    job = None
    if options.cross_check:
        from qaudit.crosscheck import UpstreamBuilder, require_megatron

        # exit 2 before any work when there is none; the upstream side starts now, beside
        # the audit's own build and run
        job = UpstreamBuilder(config, recipe, options, require_megatron())
    from qaudit.crosscheck.startup import start_startup_checks

    startup = start_startup_checks(config, recipe, options)
    try:
        run = run_audit(config, recipe, options)
    except BaseException:
        for started in (job, startup):
            if started is not None:
                started.cancel()
        raise
    startup_status = _startup_status(config, startup)
    if job is not None:
        from qaudit.judge.guard_side import compare_with_guard

        run.facts.cross_check = job.result(run)
        compare_with_guard(run.facts)
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
    if startup_status is None and not options.cross_check \
            and report.megatron.get("source") == "assumed":
        # Issue 48: say that upstream's own start-up checks did not run; qaudit's table of
        # its refusals (docs/upstream-checks.md) is all that was applied.
        startup_status = NOT_RUN_WITHOUT_MEGATRON
    if startup_status is not None:
        report.megatron["startup_checks"] = startup_status
    if run.facts.cross_check is not None:
        report.cross_check = run.facts.cross_check.to_dict()
    report.memory = run.memory
    report.observation = run.observation
    report.te_inference = run.te_inference
    report.gemm_shapes = gemm_shapes(run.facts)
    if options.compare_policies:
        report.policies = compare_policies(config, recipe, options, rows)
    if options.rank is not None:
        _keep_stage(report, config, options.rank)
    return report


NOT_RUN_WITHOUT_MEGATRON = ("not run (no Megatron importable); qaudit's table of upstream's "
                            "start-up refusals applied (docs/upstream-checks.md)")


def _startup_status(config: ModelConfig, startup) -> str | None:
    """'accepted' or 'not run: why'; upstream's refusal is the user's input error."""
    if startup is None:
        return None
    from qaudit.crosscheck.startup import refusal_error

    answer = startup.result()
    if isinstance(answer, str):
        return answer
    if answer.refusal is not None:
        raise refusal_error(config, startup.location, answer.refusal)
    return "accepted"


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
