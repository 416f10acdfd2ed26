"""The `qaudit` command line."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Optional

import typer

from qaudit import __version__
from qaudit.errors import EnvironmentProblem, InputError

EXIT_USAGE, EXIT_INTERNAL = 2, 3

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Audit Megatron-LM / Transformer Engine quantization and gradient "
                       "accumulation before a long training run.")


class Policy(str, Enum):
    legacy = "legacy"
    config = "config"
    module = "module"
    pre_5642 = "pre-5642"


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"


class RuntimeChoice(str, Enum):
    auto = "auto"
    reference = "reference"
    te = "te"


def _fail(message: str, code: int) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(code)


@app.command()
def check(
    config: str = typer.Argument(..., help="Model config YAML (TransformerConfig field names, "
                                 "flat or under 'model:'). gradient_accumulation_fusion defaults "
                                 "to true, as on Megatron's training command line."),
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Quant recipe YAML "
                                         "(configs + matchers); wins over the config's quant_recipe."),
    policy: Policy = typer.Option(Policy.config, help="Megatron's is_first_microbatch tracking: "
                                  "legacy (before PR #6965), config (PR #6965, upstream), "
                                  "module (PR #7353), pre-5642 (before PR #5642: a quant_recipe "
                                  "alone does not re-arm)."),
    steps: int = typer.Option(2, min=1, max=100, help="Training steps to run."),
    microbatches: int = typer.Option(2, min=1, max=64, help="Microbatches per step."),
    output_format: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                               help="Output format."),
    runtime: RuntimeChoice = typer.Option(RuntimeChoice.auto, help="auto, reference (pure "
                                          "PyTorch, CPU) or te (Transformer Engine, CUDA)."),
    seed: int = typer.Option(0, help="Seed for weights and data."),
    fail_on: FailOn = typer.Option(FailOn.error, help="Lowest finding severity that makes the "
                                   "exit code 1."),
    evaluation: bool = typer.Option(False, "--eval", help="Forward-only run with modules in eval "
                                    "mode (evaluation recipes in force)."),
    verify: bool = typer.Option(False, "--verify", help="Measure each module's main_grad against "
                                "an unfused float64 autograd reference (grad_rel_error)."),
    compare_policies: bool = typer.Option(False, "--compare-policies", help="Also audit under "
                                          "legacy, config and module; verdicts per module group."),
    suggest_fixes: bool = typer.Option(False, "--suggest", help="Re-audit the known remedies for "
                                       "each error and print those that pass, with their cost."),
) -> None:
    """Build the model, run a few steps, and report every TE module. Exit 1 on errors."""
    from qaudit.audit import AuditOptions, audit_files
    from qaudit.render.json import render_json
    from qaudit.render.table import render_table

    options = AuditOptions(policy=policy.value, steps=steps, microbatches=microbatches,
                           runtime=runtime.value, seed=seed, evaluation=evaluation, verify=verify,
                           compare_policies=compare_policies)
    try:
        report = audit_files(config, recipe, options, suggest=suggest_fixes)
    except InputError as exc:
        _fail(f"error: {exc}", EXIT_USAGE)
    except EnvironmentProblem as exc:
        _fail(f"error: {exc}", EXIT_INTERNAL)
    code = report.exit_code(fail_on.value)
    render = render_json if output_format is OutputFormat.json else render_table
    sys.stdout.write(render(report, code))
    raise typer.Exit(code)


@app.command("rules")
def list_rules() -> None:
    """List every rule: ID, severity, title."""
    from tabulate import tabulate

    from qaudit.rules import load_rules

    rows = [(r.id, r.severity, r.title) for r in load_rules().values()]
    typer.echo(tabulate(rows, headers=("rule", "severity", "title"), tablefmt="simple"))


@app.command()
def explain(rule_id: str = typer.Argument(..., help="A rule ID, e.g. QA001.")) -> None:
    """Print one rule's documentation page."""
    from qaudit.rules import load_rules

    rules = load_rules()
    found = rules.get(rule_id.upper())
    if found is None:
        _fail(f"error: unknown rule {rule_id!r}; `qaudit rules` lists them", EXIT_USAGE)
    typer.echo(f"{found.id} ({found.severity}): {found.title}\n\n{found.doc}")


@app.command()
def version() -> None:
    """Print qaudit's version."""
    typer.echo(__version__)


def main() -> None:
    """Console entry point: internal errors exit 3 with a short message, never a traceback."""
    try:
        app()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - last line of defence for exit code 3
        sys.stderr.write(f"internal error: {type(exc).__name__}: {exc}\n"
                         "This is a bug in qaudit; please report it with the input files.\n")
        sys.exit(EXIT_INTERNAL)
