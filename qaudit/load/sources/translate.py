"""Megatron flag occurrences -> a `YamlMap` of TransformerConfig fields plus notes.

Mirrors what upstream's `core_transformer_config_from_args` and `validate_args` do with the
modelled flags, keeps each field's source line (the flag's line), and decides what an unknown
value means: an error when the audit needs it, a note or nothing otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qaudit.load.config import MODELLED_FIELDS, SourceNote
from qaudit.errors import InputError
from qaudit.load.sources import megatron_flags as flags
from qaudit.load.sources.argv import Argv, Occurrence
from qaudit.load.sources.checked_flags import apply_checked
from qaudit.load.sources.entry import Entry
from qaudit.load.sources.flag_state import FlagState
from qaudit.families import parts as family_parts
from qaudit.load.sources.modelopt_flags import apply_modelopt, known_modelopt_flag, note_modelopt_flags
from qaudit.load.sources.parser_refusals import refuse_unknown_options
from qaudit.load.sources.startup_refusals import refuse_unconvertible_values, refuse_validate_args
from qaudit.load.sources.megatron_flags import to_int
from qaudit.load.sources.upstream_flags import PARSER_COMMIT, UPSTREAM_FLAGS
from qaudit.load.unmodelled import (INFERENCE_ONLY_FLAGS, INFERENCE_ONLY_WHY, NO_EFFECT,
                                    UNMODELLED, field_of_dest, no_effect_reason,
                                    note_for_setting)
from qaudit.load.yamlio import YamlMap, short_repr

REQUIRED_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads")
# Features that replace the GPT decoder stack; without --num-layers nothing can be built.
# (A hybrid pattern gives the layer count itself: qaudit.families.hybrid.flags; a T5 model's
# encoder count does: qaudit.families.t5.flags.)
_STACK_FEATURES = {
    "--heterogeneous-layers-config-path": "heterogeneous layer configs",
}


@dataclass
class Translation:
    mapping: YamlMap
    notes: list[SourceNote]
    flag_of: dict[str, str]  # field -> flag


class Translator(FlagState):
    """One file's flags translated: the state and its helpers are `FlagState`'s."""

    # --- the translation -------------------------------------------------------------------
    def run(self) -> Translation:
        refuse_unknown_options(self)  # argparse refuses before anything else runs
        refuse_unconvertible_values(self)
        refuse_validate_args(self)
        self.check_transformer_impl()
        for flag, occurrence in sorted(self.last.items(), key=lambda kv: kv[1].line or 0):
            if flag in self.modelled:
                self.apply_modelled(occurrence, self.modelled[flag])
            self.classify(occurrence)
        self.apply_special()
        apply_checked(self)
        self.check_required()
        self.note_loose_words()
        return Translation(self.mapping, self.notes, self.flag_of)

    def check_transformer_impl(self) -> None:
        occurrence = self.last.get("--transformer-impl")
        if occurrence and self.needed(occurrence) == ["local"]:
            raise InputError("transformer-impl local: no TE modules, nothing to audit",
                             file=self.file, line=occurrence.line, key="--transformer-impl")

    def apply_modelled(self, occurrence: Occurrence, spec: flags.Modelled) -> None:
        if occurrence.flag == "--num-query-groups" and not self.given("--group-query-attention"):
            return  # upstream ignores it without --group-query-attention
        if occurrence.flag == "--vocab-size" and self.given("--padded-vocab-size"):
            return
        values = self.needed(occurrence)
        if spec.convert is None:
            self.set(spec.field, spec.value, occurrence.line, occurrence.flag)
            return
        if not values:
            raise InputError("expects a value", file=self.file, line=occurrence.line,
                             key=occurrence.flag)
        try:
            value = [spec.convert(v) for v in values] if spec.many else spec.convert(values[0])
        except ValueError as exc:
            raise InputError(str(exc), file=self.file, line=occurrence.line,
                             key=occurrence.flag) from None
        if occurrence.flag == "--recompute-granularity" and self.given("--recompute-activations"):
            return  # validate_args: --recompute-activations wins
        self.set(spec.field, value, occurrence.line, occurrence.flag)

    def classify(self, occurrence: Occurrence) -> None:
        flag = occurrence.flag
        if self.note_setting(occurrence):
            return
        note = flags.note_for(flag)
        if note is not None:
            if note.requires and not self.given(note.requires):
                return
            texts = [v.text if v.known else "<unknown>" for v in occurrence.values]
            if note.when is not None and all(v.known for v in occurrence.values) \
                    and not note.when(texts):
                return
            shown = f"{flag} {short_repr(' '.join(texts), 40)[1:-1]}".rstrip()
            self.note(f"{shown}: {note.why}", occurrence.line, flag)
        elif flag in INFERENCE_ONLY_FLAGS and flag not in UPSTREAM_FLAGS:
            self.note(f"{flag}: {INFERENCE_ONLY_WHY}", occurrence.line, flag, no_effect=True)
        elif flag not in UPSTREAM_FLAGS and flag not in self.modelled \
                and not known_modelopt_flag(flag):
            where = f"; {self.entry.name} may add it (a custom entry point)" \
                if self.entry.name else ""
            self.note(f"{flag}: not an option of Megatron-LM's training parser (commit "
                      f"{PARSER_COMMIT[:8]}){where}; the audit ignores it", occurrence.line, flag)

    def note_setting(self, occurrence: Occurrence) -> bool:
        """A flag that sets a config field or argument in the shared table of unmodelled
        settings gets that table's warning (the same as the YAML route's). True when the flag
        is in the table (noted or not)."""
        flag = occurrence.flag
        if flag not in UPSTREAM_FLAGS:
            return False
        dest, kind = UPSTREAM_FLAGS[flag]
        name = field_of_dest(dest)
        texts = [v.text if v.known else "<unknown>" for v in occurrence.values]
        if name in NO_EFFECT:
            known = all(v.known for v in occurrence.values) and not occurrence.word.condition
            # Unknown or conditional values: whatever they are, the setting changes nothing.
            quiet = no_effect_reason(name, flag_value(kind, texts)) if known else NO_EFFECT[name].why
            if quiet is not None:
                shown = f"{flag} {short_repr(' '.join(texts), 40)[1:-1]}".rstrip()
                self.note(f"{shown}: {quiet}", occurrence.line, flag, no_effect=True)
            return True
        if name not in UNMODELLED:
            return False
        known = all(v.known for v in occurrence.values) and not occurrence.word.condition
        why = UNMODELLED[name].why
        if known:
            why = note_for_setting(name, flag_value(kind, texts))
        if why is not None:
            shown = f"{flag} {short_repr(' '.join(texts), 40)[1:-1]}".rstrip()
            self.note(f"{shown}: {why}", occurrence.line, flag)
        return True

    def apply_special(self) -> None:
        for family in family_parts("flags"):
            family.apply(self)
        apply_modelopt(self)
        note_modelopt_flags(self)
        gqa = self.last.get("--group-query-attention")
        if gqa is not None and "num_query_groups" in MODELLED_FIELDS:
            self.needed(gqa)
            if "num_query_groups" not in self.mapping:
                self.set("num_query_groups", 1, gqa.line, gqa.flag)  # the parser's default
        self.fill_ffn_default()
        self.check_recompute()
        self.pipeline()
        mla = self.last.get("--multi-latent-attention")
        if mla is not None and "multi_latent_attention" in self.mapping:
            # The parser's defaults, not MLATransformerConfig's: no query down-projection
            # unless --q-lora-rank is given, and a KV rank of 32.
            for field, default in (("q_lora_rank", None), ("kv_lora_rank", 32)):
                if field in MODELLED_FIELDS and field not in self.mapping:
                    self.set(field, default, mla.line, mla.flag)
        fsdp = self.last.get("--use-megatron-fsdp")
        if fsdp is not None and "data_parallel_sharding_strategy" in MODELLED_FIELDS \
                and "data_parallel_sharding_strategy" not in self.mapping:
            # The CLI default differs from the config dataclass's: full sharding.
            self.set("data_parallel_sharding_strategy", "optim_grads_params", fsdp.line,
                     fsdp.flag)

    def pipeline(self) -> None:
        """validate_args' virtual pipeline size (an explicit layout's is derived with the
        config, as TransformerConfig does)."""
        if "virtual_pipeline_model_parallel_size" not in MODELLED_FIELDS:
            return
        given = [self.last[flag] for flag in ("--num-layers-per-virtual-pipeline-stage",
                                              "--num-virtual-stages-per-pipeline-rank",
                                              "--pipeline-model-parallel-layout")
                 if flag in self.last]
        if len(given) > 1:
            later = max(given, key=lambda o: o.line or 0)
            raise InputError("no more than one of --num-layers-per-virtual-pipeline-stage, "
                             "--num-virtual-stages-per-pipeline-rank and "
                             "--pipeline-model-parallel-layout can be set (Megatron asserts it)",
                             file=self.file, line=later.line, key=later.flag)
        if "--pipeline-model-parallel-layout" in self.last:
            return
        per_chunk = self.last.get("--num-layers-per-virtual-pipeline-stage")
        if per_chunk is not None and "--num-virtual-stages-per-pipeline-rank" not in self.last:
            values = self.needed(per_chunk)
            layers = self.mapping.get("num_layers")
            stages = self.mapping.get("pipeline_model_parallel_size", 1)
            try:
                size = to_int(values[0]) if values else 0
            except ValueError as exc:
                raise InputError(str(exc), file=self.file, line=per_chunk.line,
                                 key=per_chunk.flag) from None
            if isinstance(layers, int) and isinstance(stages, int) and size > 0 and stages > 0:
                layers += bool(self.mapping.get("account_for_embedding_in_pipeline_split"))
                layers += bool(self.mapping.get("account_for_loss_in_pipeline_split"))
                if layers % stages or (layers // stages) % size:
                    raise InputError(f"{layers} layers over {stages} pipeline stages do not split "
                                     f"into chunks of {size} (Megatron rejects it)",
                                     file=self.file, line=per_chunk.line, key=per_chunk.flag)
                self.set("virtual_pipeline_model_parallel_size", layers // stages // size,
                         per_chunk.line, per_chunk.flag)
        if self.mapping.get("virtual_pipeline_model_parallel_size") == 1:
            self.mapping.pop("virtual_pipeline_model_parallel_size")  # upstream: None

    def fill_ffn_default(self) -> None:
        """validate_args: with --swiglu (only: --quick-geglu is gated too but keeps 4h) the
        default FFN width is 2/3 of 4h, rounded to 64."""
        swiglu, geglu = self.last.get("--swiglu"), self.last.get("--quick-geglu")
        if swiglu is not None and geglu is not None:
            raise InputError("cannot be combined with --swiglu (Megatron's "
                             "core_transformer_config_from_args asserts 'not args.swiglu')",
                             file=self.file, line=geglu.line, key=geglu.flag)
        hidden = self.mapping.get("hidden_size")
        if swiglu is not None and "ffn_hidden_size" not in self.mapping and isinstance(hidden, int):
            width = int((4 * hidden * 2 / 3) / 64) * 64
            if width >= 1:
                self.set("ffn_hidden_size", width, swiglu.line, swiglu.flag)

    def check_recompute(self) -> None:
        """validate_args: --recompute-activations means selective recompute, and selective
        recompute takes no --recompute-method (an assertion)."""
        method = self.last.get("--recompute-method")
        if method is None or self.mapping.get("recompute_granularity") != "selective":
            return
        why = ("--recompute-activations sets selective recompute"
               if self.given("--recompute-activations") else "recompute granularity is selective")
        raise InputError(f"cannot be used here: {why}, and Megatron's validate_args asserts "
                         "'recompute method is not yet supported for selective recomputing "
                         "granularity'", file=self.file, line=method.line, key=method.flag)

    def check_required(self) -> None:
        for flag in REQUIRED_FLAGS:
            if flag in self.last or (flag == "--num-layers" and "num_layers" in self.mapping):
                continue
            features = sorted({name for f, name in _STACK_FEATURES.items() if self.given(f)})
            if features and flag == "--num-layers":
                raise InputError(f"{features[0]} are not modelled and {flag} is not given: "
                                 f"nothing to audit", file=self.file, key=flag)
            raise InputError(f"required flag {flag} is not set (Megatron requires it); "
                             f"add it to the file", file=self.file, key=flag)

    def note_loose_words(self) -> None:
        seen: set[str] = set()
        for word in self.loose:
            for external in word.unknown:
                if external.name in seen:
                    continue
                seen.add(external.name)
                fix = f" (set it with --set {external.name}=...)" if external.settable() else ""
                self.note(f"{external.display()} may add flags the audit cannot see "
                          f"({external.why}){fix}", word.line, external.display())


def flag_value(kind: str, texts: list[str]) -> Any:
    """What argparse stores for a flag of this kind (qaudit/load/sources/upstream_flags.py), for the
    shared table's predicates; a value it cannot convert stays text (the predicates then see a
    value that is "on", so the warning is kept)."""
    if kind == "T":
        return True
    if kind == "F":
        return False
    convert = {"i": int, "f": float}.get(kind[-1:], str)
    try:
        values = [convert(text) for text in texts]
    except ValueError:
        values = list(texts)
    if kind[:1] in ("+", "*"):
        return values
    return values[0] if values else None


def translate(argv: Argv, file: str, entry: Entry | None = None) -> Translation:
    return Translator(argv, file, entry).run()

