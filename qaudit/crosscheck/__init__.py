"""`qaudit check --cross-check`: build the same config with the user's own Megatron code and
compare it module by module with qaudit's model (docs/cross-check.md).

Two `Builder`s (qaudit/crosscheck/facts.py) hand over the same plain list of `ModuleFacts`:
`QauditBuilder`, qaudit's own model from the audit's run, and `UpstreamBuilder`, the user's
Megatron (`upstream_build`, on CPU with the stand-in TE). The comparison is `compare.compare`;
rule QA030 turns each difference into a finding.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from qaudit.crosscheck.compare import Difference, compare
from qaudit.crosscheck.facts import Builder, BuiltModel, ModuleFacts, will_execute_label
from qaudit.crosscheck import worker
from qaudit.errors import EnvironmentProblem, InputError, printable
from qaudit.plan.upstream.detect import MegatronLocation, locate_megatron
from qaudit.load.precision import Quant
from qaudit.model.probe import CallRecord
from qaudit.run.observe import LiveObserver, MissingWrite, NumericCheck, Observation, StrayWrite
from qaudit.run.rows import weight_cache_of

if TYPE_CHECKING:
    from qaudit.runtime.standin.side import TESide
    from qaudit.run.audit import AuditRun
    from qaudit.run.options import AuditOptions
    from qaudit.load.config import ModelConfig
    from qaudit.load.recipe import QuantRecipe


@dataclass(kw_only=True)
class CrossCheck:
    megatron: str  # the installed version ("unknown" when package_info.py does not say)
    location: str  # where it was imported from
    modules_compared: int
    differences: list[Difference]
    ran: bool  # upstream's forward and backward ran (else construction only)
    not_covered: list[str] = field(default_factory=list)  # what the comparison left out, why
    te: str = ""  # the Transformer Engine Megatron ran on (standin.side.TESide.describe)
    # What the guard's observer saw of the upstream run (TE's own Python only), and its
    # verdict next to the audit's (qaudit/judge/guard_side.py); None where it did not run.
    observed: Observation | None = None
    guard: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"megatron": self.megatron, "location": self.location, "te": self.te,
                "modules_compared": self.modules_compared, "ran": self.ran,
                "not_covered": list(self.not_covered),
                "differences": [d.to_dict() for d in self.differences],
                **({"guard": self.guard} if self.guard is not None else {})}


def require_megatron() -> MegatronLocation:
    """The Megatron on sys.path, or exit 2 (before any audit work) saying there is none."""
    location = locate_megatron()
    if location is None:
        raise InputError("--cross-check needs the Megatron you train with: no megatron/core/ on "
                         "sys.path (pip install megatron-core, or put a Megatron-LM checkout on "
                         "PYTHONPATH)")
    return location


@contextlib.contextmanager
def _quiet_megatron() -> Iterator[None]:
    """Megatron logs warnings at build (deprecations, defaults); the report is the output."""
    logger = logging.getLogger("megatron")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _not_built_here(config: "ModelConfig") -> str | None:
    """Models the upstream builder does not build yet: said in the report, never compared
    against the wrong upstream class."""
    from qaudit.runtime.standin.boot import importable

    if config.is_hybrid and not importable("einops"):
        return ("hybrid (Mamba) models: einops is not importable beside Megatron (its Mamba "
                "mixer needs it to be built: pip install einops)")
    return None




def _upstream_input(config: "ModelConfig", recipe: "QuantRecipe | None",
                    not_covered: list[str]) -> Any:
    """What to build: from the YAML's TransformerConfig fields, or from upstream's own
    argument parsing of a launch script's or MODEL_ARGS file's words. A string: upstream's
    argument checks refused the command line (why)."""
    from qaudit.crosscheck import upstream_build, upstream_config

    argv = config.source.argv if config.source else None
    if argv is None:
        classes = upstream_build.upstream_classes()
        mla = classes["MLATransformerConfig"]
        bridge = config.source is not None and config.source.origin == "bridge"
        serialized = bridge and recipe is not None and recipe.file == config.file
        upstream = upstream_config.from_yaml(
            config, recipe.file if recipe and not serialized else None,
            upstream_config.dataclass_fields(classes["TransformerConfig"]),
            upstream_config.dataclass_fields(mla) if mla else set())
        if serialized:
            # A Bridge dump's quant_recipe is a serialized RecipeConfig inside the dump, not a
            # recipe file: rebuilt as upstream's own RecipeConfig and GlobMatchers.
            upstream.prebuilt_recipe = upstream_build.recipe_config(recipe)
        return upstream
    words, dropped = upstream_config.argv_strings(argv)
    if dropped:
        not_covered.append("flags passed only under a condition the script leaves open")
    try:
        upstream, args = upstream_config.from_arguments(config, words,
                                                        config.source.environment,
                                                        config.source.inference_test)
    except upstream_config.ArgumentsRejected as exc:
        return str(exc)
    spec = getattr(args, "spec", None)
    # (A functional test's runner may pass the two words of --spec as one.)
    words = tuple(" ".join(spec).split()) if spec else ()
    if spec and not (upstream.hybrid is not None and words in HYBRID_TE_SPECS):
        what = "TE stack spec" if upstream.hybrid is not None else "TE layer spec"
        not_covered.append(f"--spec {' '.join(spec)}: compared with the {what}")
    return upstream


# The `--spec` words of the hybrid TE stack spec, the one the cross-check builds (the mamba
# module re-exports the hybrid one).
HYBRID_TE_SPECS = {("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"),
                   ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")}


class QauditBuilder:
    """qaudit's own model, already built and run by the audit, as the same plain list: its
    rows plus each wrapper's answer to will_execute_quantized in training mode."""

    def __init__(self, run: "AuditRun") -> None:
        self.run = run

    def build(self) -> BuiltModel:
        wrappers = {m.fqn: m for m in self.run.model.audited_modules()}
        return BuiltModel([_facts_of(row, wrappers.get(row.name),
                                     self.run.records.get(row.name, []))
                           for row in self.run.rows], ran=True)


def _facts_of(row, module, records) -> ModuleFacts:
    method = getattr(module, "will_execute_quantized", None)
    training = module.training if module is not None else True
    if module is not None:
        module.training = True
    try:
        label = will_execute_label(method)
    finally:
        if module is not None:
            module.training = training
    return ModuleFacts(
        name=row.name, upstream_class=row.type, recipe=row.recipe,
        will_execute_quantized=label, precision=row.precision, tracked=row.tracked,
        accumulation=row.accumulation, weight_cache=weight_cache_of(records),
        calls_per_microbatch=row.calls_per_microbatch,
        nograd_calls_per_microbatch=row.nograd_calls_per_microbatch)


@dataclass
class UpstreamSide:
    """What the user's Megatron built and ran, handed back to the audit."""

    built: BuiltModel | None = None
    not_covered: list[str] = field(default_factory=list)
    unknown_fields: list[str] = field(default_factory=list)
    skipped: str | None = None  # why nothing was built (a variant the builder does not cover)
    # What the guard's observer saw of the same training run (TE's own Python only).
    observed: Observation | None = None


# What the worker's result may hold besides plain values (crosscheck/plain.py): nothing else
# crosses back into qaudit's process.
RESULT_KINDS: tuple[type, ...] = (UpstreamSide, BuiltModel, ModuleFacts, Observation, CallRecord,
                                  Quant, NumericCheck, StrayWrite, MissingWrite)


def upstream_side(config: "ModelConfig", recipe: "QuantRecipe | None", steps: int,
                  microbatches: int, seed: int, train: bool, allow_import: bool,
                  te: "TESide", location: MegatronLocation) -> UpstreamSide:
    """Build (and, with `train`, run) the config with the installed Megatron."""
    import torch

    from qaudit.crosscheck import upstream_build
    from qaudit.crosscheck.build_scope import upstream_environment

    # As in qaudit's own audit: the shrunk tensors are tiny, extra intra-op threads only spin.
    torch.set_num_threads(1)
    side = UpstreamSide()
    try:
        with _quiet_megatron(), upstream_environment(te, allow_import=allow_import):
            upstream = _upstream_input(config, recipe, side.not_covered)
            variant = getattr(upstream, "config_kwargs", {}).get("experimental_attention_variant")
            if isinstance(upstream, str):  # upstream's own argument checks refused it
                side.built = BuiltModel([], ran=False, rejected=upstream)
            elif variant:
                side.skipped = (f"experimental_attention_variant {variant}: its block spec is "
                                "not built by the cross-check")
                return side
            else:
                te_on_cpu = te.kind == "te-cpu"
                # The guard watches the run where TE's own code decides (docs/guard.md).
                observer = LiveObserver() if te_on_cpu and train else None
                side.built = upstream_build.build_and_run(upstream, steps, microbatches, seed,
                                                          run=train, te_on_cpu=te_on_cpu,
                                                          observer=observer)
                if observer is not None and side.built.ran:
                    side.observed = observer.seen
            side.unknown_fields = list(getattr(upstream, "unknown_fields", []))
    except (InputError, EnvironmentProblem, worker.Deadline):
        _imported_as_reported(location)
        raise
    except BaseException as exc:  # noqa: BLE001 - upstream's code failed (or exited): one line
        _imported_as_reported(location)
        raise EnvironmentProblem(
            f"{_describe(location)} could not build and run this config on CPU: "
            f"{worker.describe_exception(exc)}") from None
    _imported_as_reported(location)
    return side


def _imported_as_reported(location: MegatronLocation) -> None:
    """The report names the Megatron at `location`: a build of any other is no result."""
    from qaudit.crosscheck.import_path import imported_elsewhere

    elsewhere = imported_elsewhere(location.root)
    if elsewhere:
        raise EnvironmentProblem(f"{_describe(location)}: {elsewhere}") from None


def _describe(location: MegatronLocation, what: str = "--cross-check") -> str:
    return printable(f"{what}: Megatron {location.version or '(version unknown)'} at "
                     f"{location.root}")


# torch's own packages that megatron.core imports at its top (DTensor, distributed
# checkpointing; about 0.8 s of CPU): imported here before the worker forks, a run over many
# configs pays them once instead of once per config. They are torch's code, not the user's
# Megatron, and change nothing in qaudit's own audit (reports byte-identical).
_TORCH_PARTS_MEGATRON_IMPORTS = ("torch.distributed.tensor", "torch.distributed.checkpoint")


def _import_torch_parts_megatron_imports() -> None:
    import importlib

    for name in _TORCH_PARTS_MEGATRON_IMPORTS:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class UpstreamBuilder:
    """The upstream side of a cross-check, started before qaudit's own audit and collected
    after it. Where the platform forks (Linux), it runs in a forked child
    (qaudit/crosscheck/worker.py: deadline, memory limit, its own output pipe, dies with
    qaudit): the two builds overlap, the child starts with everything already imported (and
    any test's patches), and Megatron and the stand-in TE never enter the audit's own process.
    Elsewhere it runs in this process when collected, output captured and deadline kept."""

    def __init__(self, config: "ModelConfig", recipe: "QuantRecipe | None",
                 options: "AuditOptions", location: MegatronLocation) -> None:
        import multiprocessing

        from qaudit.runtime.standin import side

        self.location = location
        self.not_covered: list[str] = []
        self.observed: Observation | None = None
        self.unsupported = _not_built_here(config)
        self.job: worker.ForkedWorker | None = None
        self.limits = worker.WorkerLimits(timeout_s=options.cross_check_timeout,
                                          memory_mib=options.cross_check_memory)
        # Which TE Megatron runs on (runtime/standin/side.py): qaudit's stand-in package, TE's own Python
        # on the CPU kernel stand-in, or a real TE on a GPU. Decided here, in the audit
        # process, so that a refusal is exit 3 before any work.
        self.te = side.decide()
        if self.unsupported:
            return
        if self.te.refusal:
            raise EnvironmentProblem(
                "--cross-check: a real Transformer Engine is installed but CUDA is not usable "
                f"here, and {self.te.refusal}; qaudit does not shadow a real TE with its own "
                "stand-in. Run the cross-check on a machine with a GPU")
        train = not options.evaluation
        if options.evaluation:
            self.not_covered.append("--eval: upstream's model is compared as built, not run")
        real_te = self.te.kind == "real"
        # With a real TE and a GPU, Megatron builds real TE modules. Only the CPU stand-ins
        # record each call, so that build is compared as built (scripts/gpu-check runs it).
        if real_te and train:
            train = False
            self.not_covered.append("real Transformer Engine: compared as built (calls are "
                                    "recorded by the CPU stand-in only)")
        self.arguments = (config, recipe, options.steps, options.microbatches, options.seed,
                          train, options.allow_import, self.te, location)
        # CUDA cannot be used in a forked child: a GPU build stays in this process.
        if "fork" in multiprocessing.get_all_start_methods() and not real_te:
            _import_torch_parts_megatron_imports()
            self.job = worker.ForkedWorker(upstream_side, self.arguments, self.limits,
                                           _describe(location), kinds=RESULT_KINDS)

    def _side(self) -> UpstreamSide:
        if self.job is None:
            return worker.run_in_process(upstream_side, self.arguments, self.limits,
                                         _describe(self.location))
        side = self.job.result()
        if type(side) is not UpstreamSide:  # plain data, but not what upstream_side returns
            raise EnvironmentProblem(f"{_describe(self.location)}: the worker sent something "
                                     f"that is not qaudit's plain data (a "
                                     f"{type(side).__name__}, not the build's result)")
        return side

    def build(self) -> BuiltModel:
        if self.unsupported:
            return BuiltModel([], ran=False, skipped=self.unsupported)
        side = self._side()
        self.observed = side.observed
        if side.skipped:
            return BuiltModel([], ran=False, skipped=side.skipped)
        built = side.built
        if built.skipped:
            return BuiltModel([], ran=False, skipped=built.skipped)
        return BuiltModel(built.modules, built.ran,
                          notes=self.not_covered + side.not_covered + list(built.notes),
                          rejected=built.rejected, unknown_fields=side.unknown_fields)

    def result(self, run: "AuditRun") -> CrossCheck:
        result = cross_check(QauditBuilder(run), self, self.location)
        result.te = self.te.describe()
        result.observed = self.observed  # judged by qaudit/judge/guard_side.py
        return result

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()


def cross_check(ours: Builder, theirs: Builder, location: MegatronLocation) -> CrossCheck:
    """Compare what two builders built, module by module."""
    version, where = location.version or "unknown", str(location.root)
    built = theirs.build()
    if built.skipped:
        return CrossCheck(megatron=version, location=where, modules_compared=0, differences=[],
                          ran=False, not_covered=[built.skipped])
    not_covered = list(built.notes)
    if built.rejected is not None:
        # Nothing to compare module by module: the installed Megatron refuses the config.
        return CrossCheck(megatron=version, location=where, modules_compared=0,
                          differences=[Difference("-", "build", "audits it",
                                                  f"rejects it: {built.rejected}")],
                          ran=False, not_covered=not_covered)
    mine = ours.build().modules
    # Modules qaudit runs inside a CUDA graph: the CPU run has no graphs (docs/cross-check.md).
    graphed = frozenset(facts.name for facts in mine if facts.tracked == "graph")
    if graphed and built.ran:
        not_covered.append(f"CUDA graphs: {len(graphed)} graphed module(s) compared as built "
                           "(capture needs a GPU)")
    differences = compare(mine, built.modules, built.ran, graphed)
    differences.extend(Difference("-", "config field", "accepted", "not a field of the "
                                  "installed TransformerConfig: " + name)
                       for name in built.unknown_fields)
    return CrossCheck(megatron=version, location=where, modules_compared=len(mine),
                      differences=differences, ran=built.ran, not_covered=not_covered)
