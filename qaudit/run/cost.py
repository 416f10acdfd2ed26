"""How long an audit will run, estimated once the model is built, and the limit on it.

Every module runs forward and backward in every microbatch of every step, so `--steps 100
--microbatches 64` on a DeepSeek-V3-sized config would run for hours. The estimate is a linear
model fitted on this project's 2-core CPU with the reference runtime (docs/performance.md):
about 0.6 ms per module and 26 us per expert GEMM of a grouped module, per microbatch. Over `MAX_SECONDS` the audit is refused (exit 2) unless `--allow-long-audit`.
"""

from __future__ import annotations

from typing import Iterable

from qaudit.errors import InputError

SECONDS_PER_MODULE = 0.6e-3
SECONDS_PER_GROUPED_EXPERT = 26e-6
MAX_SECONDS = 600.0


def expert_gemms(module) -> int:
    """Expert GEMMs of a grouped module beyond its first (a stacked 3-D weight, or TE's
    weight0..weightN); 0 for a plain linear."""
    weights = module.weights()
    if len(weights) == 1 and weights[0].dim() == 3:
        return weights[0].shape[0] - 1
    return max(len(weights) - 1, 0)


def estimate_seconds(modules: Iterable, microbatches_in_all: int, runs: int = 1) -> float:
    per_microbatch = 0.0
    for module in modules:
        per_microbatch += SECONDS_PER_MODULE + SECONDS_PER_GROUPED_EXPERT * expert_gemms(module)
    return per_microbatch * microbatches_in_all * runs


def _shown(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def check_run_cost(modules: list, *, steps: int, microbatches: int, runs: int, file: str | None,
                   allowed: bool) -> float:
    """The estimate in seconds; an InputError (exit 2) when it is over the limit and the
    user did not allow it."""
    seconds = estimate_seconds(modules, steps * microbatches, runs)
    if seconds > MAX_SECONDS and not allowed:
        what = f" x {runs} runs" if runs > 1 else ""
        raise InputError(f"the audit would run for about {_shown(seconds)} ({len(modules)} "
                         f"modules x {steps} steps x {microbatches} microbatches{what}; "
                         f"estimated for a 2-core CPU); the limit is {_shown(MAX_SECONDS)}: "
                         "lower --steps or --microbatches (2 x 2 shows every verdict), or "
                         "pass --allow-long-audit", file=file)
    return seconds
