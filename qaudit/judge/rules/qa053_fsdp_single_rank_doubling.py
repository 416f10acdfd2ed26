"""QA053: Megatron-FSDP with sharded gradients reduces every backward even where a buffer's
data-parallel group has one rank, doubling that buffer each microbatch (Megatron-LM #6660)."""

from __future__ import annotations

from typing import Iterable

from qaudit.judge.rules import AuditFacts, Hit, rule
from qaudit.judge.rules._upstream_threads import megatron_package

# megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py: the two places that set
# grad_reduce_every_bprop from the sharding strategy alone, per release line read from the
# wheels (and main as read, d98e8a64); tests/test_rule_qa053.py checks the installed one.
EVERY_BPROP_LINES = {(0, 16): (656, 773), (0, 17): (668, 802), (0, 18): (716, 832),
                     (0, 19): (755, 862), (0, 20): (761, 879)}
_SHARDED = ("optim_grads", "optim_grads_params")


@rule("QA053", "warning", "Megatron-FSDP doubles a one-rank buffer each microbatch (#6660)")
def check(facts: AuditFacts) -> Iterable[Hit]:
    """Megatron-FSDP with sharded gradients (`data_parallel_sharding_strategy` `optim_grads`
    or `optim_grads_params`) launches the gradient reduction after every backward
    (`grad_reduce_every_bprop` in megatron/core/distributed/fsdp/src/megatron_fsdp/
    megatron_fsdp.py depends on the strategy alone). Where a gradient buffer's data-parallel
    group has a single rank (expert gradients when expert parallelism equals data
    parallelism, every gradient when DP = 1), the buffer is not sharded and the
    per-microbatch reduction works on the accumulated buffer itself: Megatron-LM issue #6660
    measured `buf = 2 * buf + g` per microbatch, 2^N after N microbatches, hidden by gradient
    clipping until the norm overflows and clipping zeroes every gradient. PR #6773 makes the
    per-microbatch reduction depend on the buffer's group having more than one rank; it was
    merged after every megatron-core release qaudit knows (0.16.1 to 0.19.2 read, the same
    decision in each) and after main as qaudit read it (d98e8a64).

    A warning: qaudit does not know the data-parallel and expert-parallel sizes of the run,
    so it cannot tell whether any buffer's group has one rank. The finding's evidence names
    the line of the Megatron the verdict is for.

    Fix: keep every buffer's data-parallel group above one rank (expert parallelism smaller
    than data parallelism, DP > 1), or use `optim` / `no_shard`, or a Megatron-LM with PR
    #6773.
    """
    if facts.observed:  # the guard judges the writes it saw, not the config's features
        return
    config = facts.config
    if not config.use_megatron_fsdp or config.data_parallel_sharding_strategy not in _SHARDED:
        return
    key = megatron_package(facts.megatron)
    if key is not None and key[:2] not in EVERY_BPROP_LINES and key[:2] > (0, 20):
        return  # a Megatron newer than any qaudit read: it may have PR #6773
    label = facts.megatron.label() if facts.megatron is not None else "the Megatron in effect"
    lines = EVERY_BPROP_LINES.get(key[:2]) if key is not None else None
    where = f":{lines[0]} and :{lines[1]}" if lines else ""
    file, line = config.where("data_parallel_sharding_strategy")
    yield Hit(file=file or config.file, line=line,
              message=(f"Megatron-FSDP with {config.data_parallel_sharding_strategy} on "
                       f"{label} reduces gradients after every backward; a gradient buffer "
                       "whose data-parallel group has one rank (experts with EP = DP, or DP "
                       "= 1) is doubled each microbatch, 2^N after N (Megatron-LM issue "
                       "#6660, fixed by PR #6773 after every release qaudit knows)"),
              fix=("keep every buffer's data-parallel group above one rank (EP < DP, DP > "
                   "1), or data_parallel_sharding_strategy optim or no_shard, or a "
                   "Megatron-LM with PR #6773"),
              evidence=(f"{label}, megatron/core/distributed/fsdp/src/megatron_fsdp/"
                        f"megatron_fsdp.py{where}: grad_reduce_every_bprop = the sharding "
                        "strategy is optim_grads or optim_grads_params, whatever the "
                        "buffer's group size (the same in megatron-core 0.16.1 to 0.19.2 and "
                        "main as read); PR #6773 adds the condition "
                        "data_parallel_group.size() > 1 (no release qaudit knows has it)"))
