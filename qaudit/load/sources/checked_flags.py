"""Flags whose fields only `qaudit.load.upstream_checks` reads (bias, router options, parallel
sizes): the translator copies them into the field mapping so that a launch script or a
MODEL_ARGS file is checked as a TransformerConfig YAML is. A value the file takes from outside
(or passes only under an undecided condition) becomes `UNKNOWN`, and the checks that need it
are skipped rather than guessed.
"""

from __future__ import annotations

from typing import Any, Callable

from qaudit.errors import InputError
from qaudit.load.sources.megatron_flags import to_int
from qaudit.load.upstream_checks import UNKNOWN

# flag -> (field, conversion of its values; None: a switch storing `value`), value)
CHECKED_FLAGS: dict[str, tuple[str, Callable[[list[str]], Any] | None, Any]] = {
    "--disable-bias-linear": ("add_bias_linear", None, False),
    "--moe-router-pre-softmax": ("moe_router_pre_softmax", None, True),
    "--moe-router-score-function": ("moe_router_score_function", lambda v: v[0], None),
    # nargs '+'; validate_args turns a one-element list into the string.
    "--moe-router-load-balancing-type": ("moe_router_load_balancing_type",
                                         lambda v: v[0] if len(v) == 1 else list(v), None),
    "--moe-router-num-groups": ("moe_router_num_groups", lambda v: to_int(v[0]), None),
    "--moe-router-group-topk": ("moe_router_group_topk", lambda v: to_int(v[0]), None),
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", lambda v: to_int(v[0]), None),
    "--expert-model-parallel-size": ("expert_model_parallel_size", lambda v: to_int(v[0]), None),
    # The parallel split and sizes the GEMM shapes at real widths are computed for.
    "--expert-tensor-parallel-size": ("expert_tensor_parallel_size", lambda v: to_int(v[0]),
                                      None),
    "--context-parallel-size": ("context_parallel_size", lambda v: to_int(v[0]), None),
    "--sequence-parallel": ("sequence_parallel", None, True),
    "--make-vocab-size-divisible-by": ("make_vocab_size_divisible_by", lambda v: to_int(v[0]),
                                       None),
    "--seq-length": ("seq_length", lambda v: to_int(v[0]), None),
    "--moe-router-padding-for-fp8": ("moe_router_padding_for_fp8", None, True),
    "--moe-router-padding-for-quantization": ("moe_router_padding_for_quantization", None,
                                              True),
    "--fp16": ("fp16", None, True),
    "--bf16": ("bf16", None, True),
    "--overlap-moe-expert-parallel-comm": ("overlap_moe_expert_parallel_comm", None, True),
    "--defer-embedding-wgrad-compute": ("defer_embedding_wgrad_compute", None, True),
}


def apply_checked(translator) -> None:
    """Set the checked fields of the flags the file passes (a Translator's mapping). Words
    the file takes from outside (`$EXTRA_ARGS`) may pass any of them: then the ones not seen
    are unknown too."""
    open_ended = any(word.unknown for word in translator.loose)
    for flag, (field, convert, value) in CHECKED_FLAGS.items():
        occurrence = translator.last.get(flag)
        if occurrence is None:
            if open_ended:
                translator.set(field, UNKNOWN, None, flag)
            continue
        if occurrence.word.condition or any(v.depends_on() for v in occurrence.values):
            translator.set(field, UNKNOWN, occurrence.line, flag)
            continue
        if convert is not None:
            texts = [v.text for v in occurrence.values]
            if not texts:
                raise InputError("expects a value", file=translator.file, line=occurrence.line,
                                 key=flag)
            try:
                value = convert(texts)
            except ValueError as exc:
                raise InputError(str(exc), file=translator.file, line=occurrence.line,
                                 key=flag) from None
        translator.set(field, value, occurrence.line, flag)
