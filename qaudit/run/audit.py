"""Build and run one audit: the model over one runtime, a few training steps, every call
recorded; what it leaves (`AuditRun`) is the judge's evidence."""

from __future__ import annotations

import functools
import gc
from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from qaudit.errors import EnvironmentProblem, InputError
from qaudit.load.config import ModelConfig
from qaudit.load.recipe import QuantRecipe, import_custom_factory
from qaudit.model.gpt import GPTModel, build_model
from qaudit.model.identical import TE_MODULE_NAMES, same_structure
from qaudit.model.probe import CallRecord
from qaudit.model.session import Session
from qaudit.plan.dims import model_dims
from qaudit.plan.policies import COMPARED_POLICIES, POLICIES, TrackingPolicy
from qaudit.plan.sizes import FULL_SIZE_BYTES_PER_PARAM, available_memory_bytes, model_params
from qaudit.plan.upstream.target import MegatronTarget, resolve_megatron
from qaudit.plan.upstream.te import TETarget, resolve_te
from qaudit.run.cost import check_run_cost
from qaudit.run.distributed import World, agreed, all_gather, processes_on_this_machine
from qaudit.run.evidence import AuditFacts
from qaudit.run.gc_pause import built_objects_set_aside, gc_paused
from qaudit.run.inferred import (add_inferred_records, form_classes, inferred_classes,
                                 inferred_twins, observation, unrun_parameters)
from qaudit.run.options import AuditOptions
from qaudit.run.rows import ModuleRow, accumulation_of, calls_per_microbatch, precision_of, tracked_of
from qaudit.run.train import run_evaluation, run_training
from qaudit.runtime import select_runtime
from qaudit.runtime.reference import ReferenceRuntime
from qaudit.runtime.te_shapes import shape_checks_for


@dataclass(kw_only=True)
class AuditRun:
    """One built and run model with what the probes saw."""

    model: GPTModel
    session: Session
    records: dict[str, list[CallRecord]]
    rows: list[ModuleRow]
    facts: AuditFacts
    snapshot: dict[str, torch.Tensor] | None
    memory: dict | None = None  # --full-size: what one rank holds (qaudit/run/memory.py)
    # Modules inferred identical to an observed one, by class (qaudit/run/inferred.py);
    # None when every module ran.
    observation: dict | None = None
    # --runtime te: which modules ran TE's code and which were inferred from an identical
    # one (qaudit/runtime/te_infer.py); None when every module ran it.
    te_inference: dict | None = None


def megatron_target(options: AuditOptions, config: ModelConfig | None = None) -> MegatronTarget:
    """--megatron resolved; with `auto` and no Megatron read, the one the config's writer pins
    (`ConfigSource.assumed_megatron`, set by the Megatron-Bridge reader) when it names one."""
    if isinstance(options.megatron, MegatronTarget):
        return options.megatron
    source = config.source if config is not None else None
    return resolve_megatron(options.megatron, assumed=getattr(source, "assumed_megatron", None))


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
    try:
        try:
            with built_objects_set_aside():
                return _run_audit(config, recipe, options, policy_name)
        except EnvironmentProblem as exc:
            # --runtime auto chose te (e.g. TE's Python on the CPU stand-in), and TE cannot run a
            # recipe of this config here: the reference audits it, and its runtime line says why.
            if options.runtime != "auto" or not str(exc).startswith("--runtime te: ") \
                    or options.world is not None:
                raise
            with built_objects_set_aside():
                run = _run_audit(config, recipe, replace(options, runtime="reference"),
                                 policy_name)
            run.session.runtime.note = f"te not used: {str(exc)[len('--runtime te: '):]}"
            return run
    finally:
        _allow_numpy_import_again()


def _run_audit(config: ModelConfig, recipe: QuantRecipe | None, options: AuditOptions,
               policy_name: str | None = None) -> AuditRun:
    policy = POLICIES[policy_name] if policy_name else effective_policy(options)

    te = te_target(options)

    def build() -> tuple[Session, GPTModel, dict[str, str]]:
        if options.world is not None:
            check_world_matches_stages(config, options.world)
        if options.full_size and options.verify:  # gradient values need real storage
            check_full_size_fits(config, processes_here=processes_on_this_machine(options.world))
        runtime = (_full_size_runtime(options, te) if options.full_size and not options.verify
                   else _runtime_for(config, options, te, recipe))
        values = _values_read(runtime)
        # Identical sequential experts run once per class where no value is read: what they
        # record follows from what they are (docs/observed-once.md).
        session = Session(runtime, policy, te=te.behaviour, values_read=values,
                          observe_once=options.observe_once and not values)
        model = build_model(config, model_dims(config, options.full_size), session, recipe,
                            seed=options.seed)
        check_run_cost(model.audited_modules(), steps=options.steps,
                       microbatches=options.microbatches, file=config.file,
                       runs=len(COMPARED_POLICIES) if options.compare_policies else 1,
                       allowed=options.allow_long_audit)
        factories = _import_custom_factories(model, recipe, options) if options.allow_import else {}
        return session, model, factories

    with gc_paused():  # construction makes no garbage to collect
        session, model, factories = agreed(options.world, build)
    gc.freeze()  # the model lives through the run: later collections need not walk it again
    every_module = model.audited_modules()  # all stages', in upstream order
    order = [m.fqn for m in every_module]
    te_modules = [m.fqn for m in every_module if m.is_te]
    match_names = {m.fqn: m.match_name for m in every_module}
    bindings = {m.fqn: (m.matcher, m.quant_config) for m in every_module
                if getattr(m, "quant_config", None) is not None}
    memory, built_widths = None, {}
    if options.full_size:
        from qaudit.plan.shapes import Parallel, parallel_of
        from qaudit.run.memory import per_rank_memory

        memory = per_rank_memory(model, config, parallel_of(config) or Parallel(), every_module)
        built_widths = {m.fqn: (int(m.weights()[0].shape[-1]), int(m.weights()[0].shape[-2]))
                        for m in every_module if m.is_te and m.weights()}
    del every_module  # a stage's process drops the others' modules now
    runner = None
    if options.world is not None:
        from qaudit.run.stage_runner import StageRunner

        runner = StageRunner(model, options.world.rank)
    snapshot: dict[str, torch.Tensor] = {}
    expert_layers = form_classes(model) if session.observe_once else []
    inference = _te_inference(model, session, options)

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
                     before_update=runner.sum_embedding_grads if runner else None,
                     values=session.values_read, unrun=unrun_parameters(expert_layers))
    records: dict[str, list[CallRecord]] = defaultdict(list)
    for record in session.recorder.calls:
        records[record.module].append(record)
    twins = inferred_twins(expert_layers)
    add_inferred_records(records, twins)
    classes = inferred_classes(expert_layers)
    modules = model.audited_modules()  # under torchrun, this rank's stage only
    rearmed = policy.rearms(config)
    rows = {}
    overwrite = {}
    for module in modules:
        own = records.get(module.fqn, [])
        quant_config = getattr(module, "quant_config", None)
        weights = module.weights()
        frozen = bool(weights) and not any(w.requires_grad for w in weights)
        overwrite[module.fqn] = any(getattr(p, "overwrite_main_grad", False) for p in weights[:1])
        rows[module.fqn] = ModuleRow(
            name=module.fqn, type=module.upstream_class, precision=_not_executed(precision_of(own)),
            recipe=quant_config.name if quant_config else "-",
            tracked=tracked_of(own, module.is_te, rearmed),
            accumulation="frozen" if frozen else accumulation_of(own),
            calls_per_microbatch=calls_per_microbatch(own, grad=True),
            nograd_calls_per_microbatch=calls_per_microbatch(own, grad=False),
            stage=module.stage, chunk=module.chunk)
    for member, twin in twins.items():  # an inferred module's parameters got no attributes
        overwrite[member] = overwrite[twin]
    records = dict(records)
    if runner is not None:  # every rank judges every stage's evidence
        rows, records, overwrite, classes = _merge_stages(all_gather((rows, records, overwrite,
                                                                      classes)))
    rows_in_order = [rows[name] for name in order]
    facts = AuditFacts(
        config=config, recipe=recipe, policy=policy, rows=rows_in_order, records=records,
        overwrite_main_grad=overwrite, te_modules=te_modules, match_names=match_names,
        bindings=bindings, evaluation=options.evaluation, allow_import=options.allow_import,
        custom_factories=factories, te_version=te.rule_version, built_widths=built_widths,
        te_shape_checks=shape_checks_for(session.runtime), megatron=megatron_target(options, config))
    return AuditRun(model=model, session=session, records=records, rows=rows_in_order, facts=facts,
                    snapshot=snapshot or None, memory=memory,
                    observation=observation(classes, order),
                    te_inference=inference.summary(order) if inference is not None else None)


def _te_inference(model: GPTModel, session: Session, options: AuditOptions):
    """The te runtime's classes of identical TE modules, formed before the run; None where
    every module runs TE's code: --no-infer, --verify (each module's gradient values are
    compared) and under torchrun (each rank would report its own classes)."""
    runtime = session.runtime
    if not hasattr(runtime, "form_classes"):
        return None
    runtime.inference = None
    if not options.te_infer or options.verify or options.world is not None:
        return None
    pairs = [(m.fqn, m.inner) for m in model.audited_modules()
             if m.is_te and isinstance(getattr(m, "inner", None), torch.nn.Module)]
    return runtime.form_classes(pairs, functools.partial(same_structure, names=TE_MODULE_NAMES))


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
    note = ""
    if name == "auto" and (needs_reference or te.source == "named"):
        name = "reference"
        note = (f"te not used: {needs_reference[0]} is modelled by the reference runtime only"
                if needs_reference else f"te not used: --te {te.version} names a modelled TE")
    if name == "te" and needs_reference:
        key = needs_reference[0]
        what = "primary quantized weights (the recipe's fp8_param)" if key == "quant_recipe" \
            else key
        raise InputError(f"--runtime te does not model {what} yet (the reference runtime does: "
                         "docs/te-settings.md); use --runtime reference",
                         file=config.file, line=config.line_of(key), key=key)
    runtime = select_runtime(name, options.device,
                             reads_overwrite_main_grad=te.behaviour.reads_overwrite_main_grad,
                             fallback_note=note, overwrite_read_from_gemm_weight=(
                                 te.behaviour.overwrite_read_from_gemm_weight))
    if isinstance(runtime, ReferenceRuntime):
        # Values matter only where they are compared (--verify); fake quantization is most
        # of the reference runtime's own work, and no row or verdict depends on it.
        runtime.numerics = options.verify
    return runtime


def _values_read(runtime: object) -> bool:
    """Whether anything reads the run's tensor values: --verify on the reference runtime, and
    every other runtime (TE's own code may decide on values)."""
    return not isinstance(runtime, ReferenceRuntime) or runtime.numerics


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


def _merge_stages(per_rank: list[tuple[dict, ...]]) -> tuple[dict, ...]:
    merged: tuple[dict, ...] = tuple({} for _ in per_rank[0])
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


def _full_size_runtime(options: AuditOptions, te: TETarget):
    """--full-size: the reference runtime on the meta device. Real widths hold no storage,
    so any model builds; the forward and backward run on shapes (no values: the verdicts
    come from the flags and the calls, which do not depend on them)."""
    if options.runtime == "te" or options.device == "cuda":
        raise InputError("--full-size builds on the meta device with the reference runtime; "
                         "drop --runtime te / --device cuda")
    if options.verify:
        raise InputError("--verify compares gradient values, and --full-size runs on the meta "
                         "device, which has none: use one or the other")
    _skip_failing_numpy_import()
    return ReferenceRuntime("meta", te.behaviour.reads_overwrite_main_grad, numerics=False,
                            overwrite_read_from_gemm_weight=te.behaviour.overwrite_read_from_gemm_weight)


def _skip_failing_numpy_import() -> None:
    """torch's meta kernels call torch.sym_max, which tries `import numpy` on every call; without
    numpy installed each try searches sys.path again (most of a meta run's time). A None entry
    makes the import fail at once, with the same ModuleNotFoundError."""
    import importlib.util
    import sys

    global _numpy_blocked
    if "numpy" not in sys.modules and importlib.util.find_spec("numpy") is None:
        sys.modules["numpy"] = None  # type: ignore[assignment]
        _numpy_blocked = True


_numpy_blocked = False


def _allow_numpy_import_again() -> None:
    """The None entry lasts one audit only: later work in this process (the cross-check, whose
    Megatron brings numpy on its own sys.path entry; a caller of the Python API) must be able
    to import numpy."""
    import sys

    global _numpy_blocked
    if _numpy_blocked and "numpy" in sys.modules and sys.modules["numpy"] is None:
        del sys.modules["numpy"]
    _numpy_blocked = False


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
