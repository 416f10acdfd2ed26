"""The `qaudit` command line."""

from __future__ import annotations

import inspect
import sys
from enum import Enum
from typing import TYPE_CHECKING, Optional

import typer
import typer.core

from qaudit import __version__
from qaudit.commands.targets import split_targets  # noqa: F401  (one definition, commands/)
from qaudit.commands.usage_errors import OneLineUsageErrors
from qaudit.commands.written import written_files
from qaudit.errors import EnvironmentProblem, InputError, printable

if TYPE_CHECKING:
    from qaudit.run.options import AuditOptions

EXIT_USAGE, EXIT_INTERNAL = 2, 3

app = typer.Typer(cls=OneLineUsageErrors, add_completion=True, pretty_exceptions_enable=False,
                  no_args_is_help=True,
                  rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Audit Megatron-LM / Transformer Engine quantization and gradient "
                       "accumulation before a long training run. Details: docs/usage.md.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _main_options(version: bool = typer.Option(False, "--version", callback=_print_version,
                                               is_eager=True,
                                               help="Print qaudit's version and exit.")) -> None:
    """Audit Megatron-LM / Transformer Engine quantization and gradient accumulation before a
    long training run. Details: docs/usage.md."""


class Policy(str, Enum):
    legacy = "legacy"
    config = "config"
    module = "module"
    pre_5642 = "pre-5642"
    always_rearm = "always-rearm"


class OutputFormat(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"
    sarif = "sarif"
    github = "github"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"


class RuntimeChoice(str, Enum):
    auto = "auto"
    reference = "reference"
    te = "te"


class DeviceChoice(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


# One line each in `check --help` (it fits a screen); docs/usage.md has the details: the
# Megatron / Transformer Engine the verdict is for.
MEGATRON_HELP = "Megatron judged: auto|main|VERSION|COMMIT|PATH"
TE_HELP = "Transformer Engine judged: auto|main|VERSION|PATH"
POLICY_HELP = "Override the is_first_microbatch tracking."


def _fail(message: str, code: int) -> None:
    typer.echo(printable(message), err=True)
    raise typer.Exit(code)


@app.command()
def check(
    targets: list[str] = typer.Argument(..., metavar="CONFIG", show_default=False,
                                        help="Configs or directories of them; or one Bridge "
                                        "config and KEY=VALUE overrides."),
    override_files: Optional[list[str]] = typer.Option(None, "--override", metavar="FILE",
                                                       help="A Bridge override YAML; "
                                                       "repeatable."),
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", metavar="FILE",
                                         help="Quant recipe YAML (wins over quant_recipe)."),
    set_values: Optional[list[str]] = typer.Option(None, "--set", metavar="NAME=VALUE",
                                                   help="A value a script takes from outside."),
    megatron: str = typer.Option("auto", "--megatron", metavar="WHICH", show_default=False,
                                 help=MEGATRON_HELP),
    te: str = typer.Option("auto", "--te", metavar="WHICH", show_default=False, help=TE_HELP),
    policy: Optional[Policy] = typer.Option(None, metavar="NAME", help=POLICY_HELP),
    steps: int = typer.Option(2, min=1, max=100, metavar="N", show_default=False,
                              help="Training steps (default 2)."),
    microbatches: int = typer.Option(2, min=1, max=64, metavar="N", show_default=False,
                                     help="Microbatches per step (default 2)."),
    output_format: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                               metavar="FORMAT", show_default=False,
                                               help="table, markdown, json, sarif or github."),
    output: Optional[list[str]] = typer.Option(None, "--output", "-o", metavar="FORMAT=PATH",
                                               help="Also write FORMAT (or svg) to PATH."),
    fail_on: FailOn = typer.Option(FailOn.error, metavar="SEVERITY", show_default=False,
                                   help="Lowest severity that exits 1 (default error)."),
    show_info: bool = typer.Option(False, "--show-info", "-v",
                                   help="Table: print the info notes in full."),
    expand: bool = typer.Option(False, "--expand", help="One row per module, one finding "
                                "per module."),
    baseline: Optional[str] = typer.Option(None, "--baseline", metavar="FILE",
                                           help="Report only findings not in FILE."),
    write_baseline: Optional[str] = typer.Option(None, "--write-baseline", metavar="FILE",
                                                 help="Record today's findings in FILE."),
    runtime: RuntimeChoice = typer.Option(RuntimeChoice.auto, metavar="NAME",
                                          show_default=False,
                                          help="auto (default), reference or te (CUDA)."),
    device: Optional[DeviceChoice] = typer.Option(None, metavar="NAME",
                                                  help="Reference runtime on cpu or cuda."),
    seed: int = typer.Option(0, metavar="N", show_default=False,
                             help="Seed for weights and data (default 0)."),
    # Not in -h (it fits one screen): docs/usage.md and docs/te-inference.md describe it.
    no_infer: bool = typer.Option(False, "--no-infer", hidden=True,
                                  help="--runtime te: TE's code for every module."),
    evaluation: bool = typer.Option(False, "--eval", help="Forward-only, modules in eval mode."),
    verify: bool = typer.Option(False, "--verify", help="Measure main_grad against a "
                                "reference."),
    compare_policies: bool = typer.Option(False, "--compare-policies",
                                          help="Verdicts under every tracking policy."),
    suggest_fixes: bool = typer.Option(False, "--suggest", help="Re-audit the known remedies "
                                       "for errors."),
    cross_check: bool = typer.Option(False, "--cross-check", help="Compare with the installed "
                                     "Megatron (QA030)."),
    startup_checks: Optional[bool] = typer.Option(
        None, "--startup-checks/--no-startup-checks", show_default=False,
        help="Run the installed Megatron's own start-up checks on the config (default: for a "
        "megatron-core package in site-packages, not a tree on PYTHONPATH)."),
    rank: Optional[int] = typer.Option(None, "--rank", min=0, metavar="N", show_default=False,
                                       help="Show one pipeline stage."),
    full_size: bool = typer.Option(False, "--full-size", help="Build real widths, not "
                                   "shrunk ones."),
    allow_import: bool = typer.Option(False, "--allow-import", help="Import the recipe's "
                                      "custom_recipe_factory."),
    allow_symlinked_output: bool = typer.Option(False, "--allow-symlinked-output",
                                                help="Write outputs through symbolic links."),
    cross_check_timeout: float = typer.Option(900.0, "--cross-check-timeout", min=0.1,
                                              max=86400.0, metavar="SECONDS",
                                              show_default=False,
                                              help="Cross-check worker deadline (900)."),
    cross_check_memory: int = typer.Option(16384, "--cross-check-memory", min=0, metavar="MIB",
                                           show_default=False,
                                           help="Cross-check worker memory (16384)."),
    allow_long_audit: bool = typer.Option(False, "--allow-long-audit", help="Run past the "
                                          "10-minute estimate."),
) -> None:
    """Build the model, run a few steps, report every TE module; exit 1 on errors.

    Several configs (or a directory): one summary line each, the worst exit code; json and
    sarif carry every file. Every option in detail: docs/usage.md."""
    from qaudit.commands.targets import expand_targets, is_override, split_targets
    from qaudit.files.outputs import allow_symlinked_output as follow_output_links
    from qaudit.run import distributed
    from qaudit.run.options import AuditOptions

    follow_output_links(allow_symlinked_output)
    paths, arguments = split_targets(targets)
    if not paths:
        _fail("error: no config given", EXIT_USAGE)
    if (arguments or override_files) and len(paths) != 1:
        _fail(f"error: overrides apply to one Megatron-Bridge config, got {len(paths)} paths "
              f"({', '.join(paths)})", EXIT_USAGE)
    try:
        files, several = expand_targets(paths)
    except InputError as exc:
        _fail(f"error: {exc}", EXIT_USAGE)
    if several and (arguments or override_files):
        _fail(f"error: {paths[0]}: overrides apply to one Megatron-Bridge config, not a "
              "directory", EXIT_USAGE)
    try:
        world = distributed.world_from_environment()
        if world is not None:
            if several:
                _fail("error: under torchrun, check takes one config", EXIT_USAGE)
            distributed.join(world)
    except EnvironmentProblem as exc:
        _fail(f"error: {exc}", EXIT_INTERNAL)
    from qaudit.load.bridge.overrides import Override

    # Each argument's position on the command line, found in one pass (many thousands of
    # overrides stay linear).
    positions = [i + 1 for i, arg in enumerate(targets) if is_override(arg)]
    overrides = tuple([Override(path=path) for path in override_files or []]
                      + [Override(text=text, index=at) for text, at in zip(arguments, positions)])
    options = AuditOptions(policy=policy.value if policy else None, megatron=megatron, te=te,
                           steps=steps, microbatches=microbatches,
                           runtime=runtime.value, device=device.value if device else None,
                           seed=seed, evaluation=evaluation, verify=verify,
                           compare_policies=compare_policies, allow_import=allow_import,
                           full_size=full_size, rank=rank, world=world, cross_check=cross_check,
                           startup_checks=startup_checks,
                           cross_check_timeout=cross_check_timeout,
                           cross_check_memory=cross_check_memory or None,
                           allow_long_audit=allow_long_audit, overrides=overrides,
                           te_infer=not no_infer)
    from qaudit.load.run_files import one_run

    if several:
        from qaudit.commands.many import check_many

        with one_run():  # a recipe shared by several configs is read once
            code = check_many(files, recipe, options, set_values, output_format.value,
                              fail_on.value, output, baseline, write_baseline, suggest_fixes,
                              show_info)
        raise typer.Exit(code)
    # Under torchrun every rank reaches the same outcome and only rank 0 speaks.
    speaks = world is None or world.is_leader
    with one_run():
        code = _check(files[0], recipe, options, set_values, output_format, fail_on, output,
                      expand, baseline, write_baseline, suggest_fixes, speaks, show_info)
    if world is not None:
        distributed.exit_together(code)
    raise typer.Exit(code)


def _check(config: str, recipe: str | None, options: AuditOptions, set_values: list[str] | None,
           output_format: OutputFormat, fail_on: FailOn, output: list[str] | None, expand: bool,
           baseline: str | None, write_baseline: str | None, suggest_fixes: bool,
           speaks: bool, show_info: bool = False) -> int:
    """`check` once options are known: the exit code, after printing (when `speaks`)."""
    from dataclasses import replace

    from qaudit.commands.inputs import load_inputs
    from qaudit.judge.baseline import prepare_baseline
    from qaudit.files.outputs import check_clashes
    from qaudit.render import emit, parse_outputs
    from qaudit.load.sources import parse_assignments

    def failed(message: str, code: int) -> int:
        if speaks:
            typer.echo(printable(message), err=True)
        return code

    inputs = [("config", config)] + ([("recipe", recipe)] if recipe else []) \
        + ([("baseline", baseline)] if baseline else []) \
        + [("override", o.path) for o in options.overrides if o.path is not None]
    try:
        outputs = parse_outputs(output)
        baselines = prepare_baseline(baseline, write_baseline)
        options = replace(options, variables=parse_assignments(set_values))
        written = written_files(outputs, write_baseline)
        check_clashes(written, inputs)
    except InputError as exc:
        return failed(f"error: {exc}", EXIT_USAGE)
    if options.world is not None and options.cross_check:
        return failed("error: --cross-check builds the installed Megatron in one process; run "
                      "it without torchrun", EXIT_USAGE)
    if options.world is not None and options.verify:
        return failed("error: --verify replays the whole model in one process; run it without "
                      "torchrun", EXIT_USAGE)
    try:
        # Inputs load before torch is imported: a bad file is refused at once. Under torchrun
        # the ranks agree on the loading outcome inside audit_files.
        if options.world is None:
            loaded = load_inputs(config, recipe, dict(options.variables), options.overrides,
                                 options.megatron)
            from qaudit.commands.check import audit_inputs

            report = audit_inputs(*loaded, options, suggest=suggest_fixes)
        else:
            from qaudit.commands.check import audit_files

            report = audit_files(config, recipe, options, suggest=suggest_fixes)
    except InputError as exc:
        return failed(f"error: {exc}", EXIT_USAGE)
    except EnvironmentProblem as exc:
        return failed(f"error: {exc}", EXIT_INTERNAL)
    report = baselines.apply(report)
    code = report.exit_code(fail_on.value)
    if speaks:
        for line in baselines.unmatched:
            typer.echo(printable(line), err=True)
        try:
            # The config's own quant_recipe is known only now.
            check_clashes(written, inputs + ([("recipe", report.recipe)] if report.recipe else []))
            emit(report, code, output_format.value, outputs, expand=expand,
                 show_info=show_info, extra_files=baselines.files(report))
        except InputError as exc:
            return failed(f"error: {exc}", EXIT_USAGE)
    return code


class RulesFormat(str, Enum):
    table = "table"
    markdown = "markdown"


@app.command("rules")
def list_rules(output_format: RulesFormat = typer.Option(
        RulesFormat.table, "--format", "-f",
        help="table, or markdown (the README's rule table, linking docs/rules/).")) -> None:
    """List every rule: ID, severity, title."""
    from tabulate import tabulate

    from qaudit.judge.rules import load_rules
    from qaudit.render.rules_doc import rules_table

    rules = load_rules()
    if output_format is RulesFormat.markdown:
        typer.echo(rules_table(rules), nl=False)
        return
    rows = [(r.id, r.severity, r.title) for r in rules.values()]
    typer.echo(tabulate(rows, headers=("rule", "severity", "title"), tablefmt="simple"))


@app.command()
def explain(rule_id: str = typer.Argument(..., help="A rule ID, e.g. QA001.")) -> None:
    """Print one rule's documentation page."""
    from qaudit.judge.rules import load_rules

    rules = load_rules()
    found = rules.get(rule_id.upper())
    if found is None:
        _fail(f"error: unknown rule {rule_id!r}; `qaudit rules` lists them", EXIT_USAGE)
    typer.echo(f"{found.id} ({found.severity}): {found.title}\n\n{inspect.cleandoc(found.doc)}")


class DiffFormat(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


@app.command()
def diff(
    base: str = typer.Argument(..., help="Base config YAML, or a JSON report from "
                               "`check --format json`."),
    head: str = typer.Argument(..., help="Head config YAML, or a JSON report."),
    recipe_base: Optional[str] = typer.Option(None, "--recipe-base", help="Quant recipe for BASE."),
    recipe_head: Optional[str] = typer.Option(None, "--recipe-head", help="Quant recipe for HEAD."),
    megatron: str = typer.Option("auto", "--megatron", metavar="auto|main|VERSION|COMMIT|PATH",
                                 help="The Megatron both audits are for (as for check)."),
    te: str = typer.Option("auto", "--te", metavar="auto|main|VERSION|PATH",
                           help="The Transformer Engine both audits are for (as for check)."),
    policy: Optional[Policy] = typer.Option(None, help="Tracking policy for both audits, over "
                                            "the Megatron's own."),
    steps: int = typer.Option(2, min=1, max=100, help="Training steps to run."),
    microbatches: int = typer.Option(2, min=1, max=64, help="Microbatches per step."),
    runtime: RuntimeChoice = typer.Option(RuntimeChoice.auto, help="auto, reference or te."),
    seed: int = typer.Option(0, help="Seed for weights and data."),
    output_format: DiffFormat = typer.Option(DiffFormat.table, "--format", "-f",
                                             help="Output format."),
    output: Optional[list[str]] = typer.Option(None, "--output", "-o", metavar="FORMAT=PATH",
                                               help="Also write FORMAT (table, markdown, json) "
                                               "to PATH; repeatable."),
    expand: bool = typer.Option(False, "--expand", help="One row per module."),
    fail_on: FailOn = typer.Option(FailOn.error, help="Lowest severity of a NEW finding that "
                                   "makes the exit code 1."),
    allow_long_audit: bool = typer.Option(False, "--allow-long-audit", help="Run even when an "
                                          "audit's estimated time is over 10 minutes."),
    allow_symlinked_output: bool = typer.Option(
        False, "--allow-symlinked-output", help="Write outputs through symbolic links (the "
        "file a link names). Off by default: an output path that is, or goes through, a "
        "symlink is refused (exit 2)."),
) -> None:
    """Audit BASE and HEAD; show only what changes. Exit 1 when HEAD introduces an error."""
    from qaudit.run.options import AuditOptions
    from qaudit.commands.diff import emit_diff, load_side
    from qaudit.judge.diff import diff_reports
    from qaudit.files.outputs import allow_symlinked_output as follow_output_links, check_clashes
    from qaudit.render import parse_outputs

    from qaudit.plan.upstream.target import resolve_megatron

    follow_output_links(allow_symlinked_output)
    from qaudit.plan.upstream.te import resolve_te

    inputs = [("base", base), ("head", head)] + [
        (what, path) for what, path in (("base recipe", recipe_base), ("head recipe", recipe_head))
        if path]
    try:
        # auto is resolved per side: each side's loader may know the Megatron its writer pins
        target = megatron if megatron == "auto" else resolve_megatron(megatron)
        options = AuditOptions(policy=policy.value if policy else None,
                               megatron=target, te=resolve_te(te), steps=steps,
                               microbatches=microbatches, runtime=runtime.value, seed=seed,
                               allow_long_audit=allow_long_audit)
        outputs = parse_outputs(output, tuple(f.value for f in DiffFormat))
        written = written_files(outputs)
        check_clashes(written, inputs)
        from qaudit.load.run_files import one_run

        with one_run():  # a file on both sides (a shared recipe) is read once
            result = diff_reports(load_side(base, recipe_base, options),
                                  load_side(head, recipe_head, options))
        check_clashes(written, inputs + [(f"{side} recipe", report.recipe) for side, report
                                         in (("base", result.base), ("head", result.head))
                                         if report.recipe])
    except InputError as exc:
        _fail(f"error: {exc}", EXIT_USAGE)
    except EnvironmentProblem as exc:
        _fail(f"error: {exc}", EXIT_INTERNAL)
    code = result.exit_code(fail_on.value)
    try:
        emit_diff(result, code, output_format.value, outputs, expand=expand)
    except InputError as exc:
        _fail(f"error: {exc}", EXIT_USAGE)
    raise typer.Exit(code)


class EnvFormat(str, Enum):
    table = "table"
    json = "json"


@app.command()
def env(output_format: EnvFormat = typer.Option(EnvFormat.table, "--format", "-f",
                                                help="Output format.")) -> None:
    """Versions (Python, torch, TE, CUDA), the GPU, the recipes it can run, what auto picks."""
    from qaudit.commands.env import collect, render_env_json, render_env_text

    report = collect()
    from qaudit.render.defuse import defuse

    render = render_env_json if output_format is EnvFormat.json else render_env_text
    sys.stdout.write(defuse(render(report)))  # installed metadata is input text too


class GuardMode(str, Enum):
    stop = "stop"
    warn = "warn"


class _GuardCommand(typer.core.TyperCommand):
    """`qaudit guard`'s own options are options only before the command: parsing stops at
    `--` or at the first word that is not an option, and everything from there on is the
    job's (its own --steps, --report, --help included). A usage error is one line."""

    def parse_args(self, ctx, args):  # noqa: ANN001 - Click's signature
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:  # Click's UsageError (Click's classes vary with typer)
            if getattr(exc, "exit_code", None) != EXIT_USAGE or not hasattr(exc,
                                                                           "format_message"):
                raise
            _fail(f"error: qaudit guard: {_guard_usage_words(exc)}", EXIT_USAGE)


def _guard_usage_words(exc: Exception) -> str:
    option = getattr(exc, "option_name", None)
    if option and type(exc).__name__ == "NoSuchOption":
        import difflib

        possible = difflib.get_close_matches(option, list(getattr(exc, "possibilities", None)
                                                          or []), n=1)
        hint = f"; did you mean {possible[0]}?" if possible else ""
        return (f"no such option {option}{hint} (qaudit guard's own options go before the "
                "command; the job's after it: qaudit guard [OPTIONS] -- COMMAND ...)")
    return " ".join(exc.format_message().split())


@app.command(cls=_GuardCommand, context_settings={"allow_interspersed_args": False})
def guard(
    command: Optional[list[str]] = typer.Argument(
        None, help="The launch command, after --: torchrun ..., python train.py ..."),
    mode: GuardMode = typer.Option(GuardMode.stop, "--mode",
                                   help="stop: end the job before an optimizer step whose "
                                        "gradients were lost; warn: say so and run on."),
    steps: int = typer.Option(1, "--steps", min=1,
                              help="Training steps watched, from the first (docs/guard.md)."),
    report: Optional[str] = typer.Option(None, "--report",
                                         help="Write the JSON report (qaudit check's schema)."),
    numeric: bool = typer.Option(False, "--numeric",
                                 help="Measure each write into main_grad against the call's "
                                      "own weight gradient."),
    fail_on: FailOn = typer.Option(FailOn.error, "--fail-on",
                                   help="Findings at or above this stop the job."),
    cpu: bool = typer.Option(False, "--cpu",
                             help="For tests and demos: run the job on TE's own Python on "
                                  "qaudit's CPU kernel stand-in, with gloo."),
) -> None:
    """Run a training launch command with the guard inside it: the same verdict as `check`,
    observed in the real run, which is stopped before a step with lost gradients. qaudit's
    options go before the command; everything from the command on is the job's."""
    from qaudit.files.outputs import check_output_path
    from qaudit.guard import launch
    from qaudit.guard.options import GuardOptions

    try:
        if report:
            check_output_path(report, "--report")
        outcome = launch.run(list(command or []), GuardOptions(
            mode=mode.value, steps=steps, report=report, numeric=numeric,
            fail_on=fail_on.value), cpu=cpu)
    except InputError as exc:
        _fail(f"error: {exc}", EXIT_USAGE)
    except EnvironmentProblem as exc:
        _fail(f"error: {exc}", EXIT_INTERNAL)
    # The guard's words last, after the job's own output: the verdict, then one line.
    if outcome.said:
        sys.stderr.write(outcome.said.rstrip("\n") + "\n")
    sys.stderr.write(f"qaudit guard: {printable(outcome.message)}\n")
    raise typer.Exit(outcome.code)


@app.command()
def version() -> None:
    """Print qaudit's version."""
    typer.echo(__version__)


def _tolerant_streams() -> None:
    """A character the terminal's encoding lacks (qaudit's own \u2705 under LC_ALL=POSIX or
    PYTHONIOENCODING=ascii, a name from the input) is printed as its escape, never a crash."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        # strict, or surrogateescape (a C locale's), fail on qaudit's own characters.
        if reconfigure is not None and getattr(stream, "errors", None) in ("strict",
                                                                             "surrogateescape"):
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


def main() -> None:
    """Console entry point: internal errors exit 3 with a short message, never a traceback."""
    _tolerant_streams()
    try:
        app()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - last line of defence for exit code 3
        sys.stderr.write(printable(f"internal error: {type(exc).__name__}: {exc}")[:2000] + "\n"
                         "This is a bug in qaudit; please report it with the input files.\n")
        sys.exit(EXIT_INTERNAL)
    except BaseException as exc:  # noqa: BLE001 - GeneratorExit and the like: still exit 3
        sys.stderr.write(printable(f"internal error: {type(exc).__name__}: {exc}")[:2000] + "\n")
        sys.exit(EXIT_INTERNAL)
