"""QA030: qaudit's model differs from what the user's own Megatron builds (--cross-check)."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule

_FIELD_WORDS = {
    "module": "module", "upstream_class": "class", "recipe": "recipe config bound",
    "will_execute_quantized": "will_execute_quantized (bf16/fp8 context)",
    "precision": "executed precision", "tracked": "tracked", "accumulation": "accumulation",
    "weight_cache": "weight-cache use (per step, in call order)",
    "calls_per_microbatch": "calls per microbatch",
    "nograd_calls_per_microbatch": "no-grad calls per microbatch",
    "config field": "config field", "build": "the config",
}
_RUN_FIELDS = {"tracked", "accumulation", "weight_cache"}


@rule("QA030", "error", "qaudit's model differs from the installed Megatron's")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """With `--cross-check`, qaudit also builds the config with the Megatron you have
    installed (megatron-core, or a Megatron-LM checkout on `PYTHONPATH`): upstream's own
    `TransformerConfig`, TE layer specs, MTP block, `GPTModel` and its `finish_init` recipe
    binding, then two training steps of two microbatches through upstream's own forward and
    backward, with qaudit's reference runtime standing in for Transformer Engine on CPU. It
    compares every linear module with qaudit's rows: name, upstream class, the recipe config
    bound, `will_execute_quantized`, the executed precision, whether `is_first_microbatch` is
    tracked, what each backward does to `main_grad`, what each quantized call does with TE's
    cached quantized weight, and the calls per microbatch.

    Each difference is this finding; the message names both sides. Any difference means the
    report above describes qaudit's model, not the one your Megatron builds: do not rely on
    its verdicts for the modules named until the difference is understood. A module that only
    one side builds, or a different class, is a gap in qaudit's model of Megatron (please
    report it). Differences only in `tracked`, `accumulation` and the weight-cache use usually
    mean that `--policy` or `--megatron` named another Megatron than the installed one
    (releases up to 0.19 behave as `legacy`, Megatron-LM main as `config`); without them
    qaudit follows the installed one.

    Where that run is on TE's own Python (a TE release importable, no GPU), `qaudit guard`'s
    observer watches it too and judges what it saw with the guard's rules; a module on which
    the guard's verdict and the audit's differ is this finding too (`guard QA001` and so on:
    the rule whose verdict differs, with each side's severity). See docs/guard.md.
    """
    result = facts.cross_check
    if result is None:
        return
    file = facts.config.file
    version = f"Megatron {result.megatron}"
    for difference in result.differences:
        what = _FIELD_WORDS.get(difference.field, difference.field)
        if difference.field.startswith("guard "):
            what = f"{difference.field.removeprefix('guard ')} from the guard on that run"
        module = None if difference.module == "-" else difference.module
        message = f"{what}: qaudit {difference.qaudit}; {version} {difference.megatron}"
        yield Hit(module=module, message=message, file=file, line=None,
                  fix=_fix(difference.field))


def _fix(field: str) -> str:
    if field in _RUN_FIELDS:
        return ("re-run without --policy/--megatron: qaudit then audits with the installed "
                "Megatron's own behaviour")
    if field == "build":
        return "the installed Megatron cannot train this config: fix what its message names"
    if field.startswith("guard "):
        return ("the guard, watching Megatron's own run, would give another verdict than this "
                "report: trust neither for this module until the difference is understood; "
                "report it to qaudit")
    if field == "config field":
        return ("the installed Megatron's TransformerConfig does not know this field (a newer "
                "release may): drop it or upgrade Megatron")
    return "treat this module's row as unverified; report the difference to qaudit"
