"""Hybrid (Mamba) flags, handled as Megatron's `validate_args` does (docs/hybrid.md).

The pattern is the sole sign of a hybrid model. `--hybrid-override-pattern` is its deprecated
spelling; `--mtp-hybrid-override-pattern` (legacy) is appended once per `--mtp-num-layers`
depth when the pattern has no `/`. The pattern then overrides `--num-layers` and
`--mtp-num-layers`, and its `|` segments set virtual pipelining; the pipeline flags that would
contradict them are rejected as upstream asserts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qaudit.errors import InputError
from qaudit.families.hybrid.pattern import MTP_SEPARATOR, composed_length, parse_pattern
from qaudit.load import config as load_config
from qaudit.load.sources.argv import Occurrence
from qaudit.load.unmodelled import HYBRID_WITHOUT_PATTERN
from qaudit.load.yamlio import short_repr

if TYPE_CHECKING:
    from qaudit.load.sources.flag_state import FlagState

# Flags upstream asserts away when a pattern is given ('|' in the pattern defines the stages).
_REJECTED_WITH_PATTERN = ("--num-layers-per-virtual-pipeline-stage",
                          "--num-virtual-stages-per-pipeline-rank",
                          "--pipeline-model-parallel-layout",
                          "--account-for-embedding-in-pipeline-split",
                          "--account-for-loss-in-pipeline-split")
_REJECTED_WITH_PIPES = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")


def apply(t: FlagState) -> None:
    layer, override = t.last.get("--hybrid-layer-pattern"), t.last.get("--hybrid-override-pattern")
    if layer is not None and override is not None:
        raise InputError("cannot be given together with --hybrid-layer-pattern (Megatron rejects "
                         "it; this is the deprecated spelling)", file=t.file, line=override.line,
                         key=override.flag)
    source = layer or override
    values = t.needed(source) if source is not None else []
    pattern = values[0] if values else None
    if override is not None and pattern is not None:
        t.set("hybrid_layer_pattern", pattern, override.line, override.flag)
    legacy = t.last.get("--mtp-hybrid-override-pattern")
    depths = t.mapping.get("mtp_num_layers")
    if legacy is not None and isinstance(depths, int) and depths > 0 \
            and (pattern is None or MTP_SEPARATOR not in pattern):
        mtp = t.needed(legacy)
        # Sized before it is built: each symbol is a layer, and past twice the layers qaudit
        # builds it is refused whatever the rest says (a 900 KB pattern times 1,024 depths
        # peaked at 1.8 GB before; 2**31 depths could not be built at all).
        size = composed_length(pattern or "", "".join(mtp), depths)
        limit = 2 * load_config.MAX_BUILT_LAYERS
        if size > limit:
            raise InputError(f"the pattern composed with this MTP pattern once per depth "
                             f"({depths} x {len(''.join(mtp))} characters) would be {size} "
                             f"characters: more layers than the {load_config.MAX_BUILT_LAYERS} "
                             "qaudit builds", file=t.file, line=legacy.line, key=legacy.flag)
        pattern = (pattern or "") + MTP_SEPARATOR + MTP_SEPARATOR.join(mtp * depths)
        source = legacy
        t.set("hybrid_layer_pattern", pattern, legacy.line, legacy.flag)
    if pattern is None:
        hybrid = t.last.get("--is-hybrid-model")
        if hybrid is not None:
            t.note(f"--is-hybrid-model: {HYBRID_WITHOUT_PATTERN}", hybrid.line, hybrid.flag)
        return
    _derive(t, source, pattern)


def _derive(t: FlagState, source: Occurrence, pattern: str) -> None:
    def fail(message: str, occurrence: Occurrence = source) -> None:
        raise InputError(message, file=t.file, line=occurrence.line, key=occurrence.flag)

    try:
        parsed = parse_pattern(pattern)
    except ValueError as exc:
        fail(f"{exc} (pattern {short_repr(pattern)})")
    count = len(parsed.main)
    num_layers = t.last.get("--num-layers")
    if num_layers is not None and t.mapping.get("num_layers") != count:
        t.note(f"--num-layers {t.mapping.get('num_layers')}: ignored; Megatron takes the layer "
               f"count from the pattern ({count})", num_layers.line, num_layers.flag,
               no_effect=True)
    t.set("num_layers", count, source.line, source.flag)
    mtp = t.last.get("--mtp-num-layers")
    if parsed.mtp_depths:
        if mtp is not None and t.mapping.get("mtp_num_layers") != parsed.mtp_depths:
            t.note(f"--mtp-num-layers {t.mapping.get('mtp_num_layers')}: Megatron uses the "
                   f"pattern's {parsed.mtp_depths} MTP depths instead", mtp.line, mtp.flag)
        t.set("mtp_num_layers", parsed.mtp_depths, source.line, source.flag)
    elif t.mapping.get("mtp_num_layers"):
        t.note("--mtp-num-layers: a hybrid model builds MTP layers only from the pattern's '/' "
               "part, which it lacks: no MTP is built", mtp.line, mtp.flag)
        t.mapping.pop("mtp_num_layers")
    for flag in _REJECTED_WITH_PATTERN + (_REJECTED_WITH_PIPES if parsed.has_pipes else ()):
        if flag in t.last:
            fail("cannot be used with a hybrid layer pattern (Megatron rejects it: the "
                 "pattern's '|' separators define the pipeline stages)", t.last[flag])
    stages = t.mapping.get("pipeline_model_parallel_size", 1)
    if parsed.has_pipes and isinstance(stages, int) and stages > 0:
        if len(parsed.segments) % stages:
            fail(f"{len(parsed.segments)} '|' segments do not split over "
                 f"--pipeline-model-parallel-size {stages} (Megatron rejects it)")
        if len(parsed.segments) > stages:
            t.set("virtual_pipeline_model_parallel_size", len(parsed.segments) // stages,
                  source.line, source.flag)
    if "share_embeddings_and_output_weights" not in t.mapping:
        # The command line ties them unless --untie-embeddings-and-output-weights is given;
        # the YAML route's default would be HybridModel's (untied).
        t.set("share_embeddings_and_output_weights", True, source.line, source.flag)
