"""QA007: a write overwrote a main_grad that already held gradient, for a cause no rule models."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule


@rule("QA007", "error", "main_grad overwritten after a write, cause not modelled")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """A backward wrote a weight's `main_grad` with overwrite (TE's wgrad GEMM with
    `accumulate=False`, or any GEMM writing that buffer) after something had already written
    gradient into it since the step's zeroing, and neither cause QA001 knows explains it: the
    call did not get `is_first_microbatch=True`, and the weight carries no
    `overwrite_main_grad` (Megatron-FSDP). The gradient written before is lost.

    Seen where the records are observed rather than modelled: the guard inside a real run
    (qaudit/guard/, docs/guard.md) and `--runtime te`, where TE's own code decides each write.
    A write nobody's call explains (no armed backward of the module that owns the buffer: a
    writer qaudit does not know, such as a fused router or a distributed output layer) is
    reported here too when it overwrote gradient.

    Fix: find the writer (the finding names the module owning the buffer, the step and the
    microbatch); run the job with `qaudit guard --numeric` to measure what was lost, and
    report it: qaudit does not model this cause yet.
    """
    rows = facts.rows_by_name
    for module, records in facts.records.items():
        lossy = [r for r in records if r.lossy]
        if not lossy:
            continue
        first = lossy[0]
        row = rows.get(module)
        overwrites_by_attribute = facts.overwrite_main_grad.get(module, False) or (
            module not in facts.te_modules and facts.config.use_megatron_fsdp)
        if first.flag is True or (row is not None and row.accumulation == "overwrite-always"
                                  and overwrites_by_attribute):
            continue  # QA001's causes
        yield Hit(module=module, file=facts.config.file, line=None, fix=_FIX,
                  message=(f"{module}: call {first.call} of microbatch {first.microbatch} "
                           f"(step {first.step + 1}) got is_first_microbatch={first.flag}, yet "
                           "its backward overwrote main_grad after a write since the step's "
                           "zeroing: the earlier gradient is lost, for a cause qaudit does not "
                           "model"))
    stray = {}
    for write in facts.stray_writes:
        if write.lossy:
            stray.setdefault(write.module, write)
    for module, write in stray.items():
        yield Hit(module=module, file=facts.config.file, line=None, fix=_FIX,
                  message=(f"{module}: a write into its main_grad that no call of the module "
                           f"explains overwrote gradient (microbatch {write.microbatch}, step "
                           f"{write.step + 1}): a writer qaudit does not know"))


_FIX = ("find the writer (run with qaudit guard --numeric to measure the loss) and report it; "
        "qaudit does not model this cause")
