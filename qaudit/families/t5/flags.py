"""Encoder-decoder (T5) flags, handled as Megatron's `validate_args` and `pretrain_t5.py` do
(docs/t5.md).

`--encoder-num-layers` or `--decoder-num-layers` marks a T5 model. `validate_args` makes
`--num-layers` and `--encoder-num-layers` one value (both given: assertion), and
`pretrain_t5.py` builds the encoder with it and the decoder with `config.num_layers`, the same
value: `--decoder-num-layers` is never read. Sequence lengths change no module.

Only `pretrain_t5.py` builds a T5Model: when the launch names a GPT training script
(`pretrain_gpt.py`, ...), `--encoder-num-layers` is just the layer count of that GPT (the same
validate_args rule) and the model is not T5.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qaudit.errors import InputError

if TYPE_CHECKING:
    from qaudit.load.sources.flag_state import FlagState

T5_FLAGS = ("--encoder-num-layers", "--decoder-num-layers")


def apply(t: FlagState) -> None:
    encoder, decoder = t.last.get("--encoder-num-layers"), t.last.get("--decoder-num-layers")
    if encoder is None and decoder is None:
        return
    num_layers = t.last.get("--num-layers")
    if t.entry.builds_gpt:
        _gpt_layer_count(t, encoder, decoder, num_layers)
        return
    if encoder is not None and num_layers is not None:
        raise InputError("cannot be given together with --num-layers (Megatron asserts 'cannot "
                         "have both num-layers and encoder-num-layers specified')",
                         file=t.file, line=encoder.line, key=encoder.flag)
    source = encoder or num_layers
    if source is None:
        raise InputError("a T5 model needs --encoder-num-layers or --num-layers (Megatron "
                         "asserts one of them; the decoder gets the same count)",
                         file=t.file, line=decoder.line, key=decoder.flag)
    count = t.mapping.get("num_layers") if encoder is None else t.mapping.get("encoder_num_layers")
    # The decoder is built with config.num_layers, which validate_args sets to the encoder's.
    t.set("num_layers", count, source.line, source.flag)
    t.set("encoder_num_layers", count, source.line, source.flag)
    if decoder is not None and all(v.known for v in decoder.values):  # never read: need not be known
        given = [v.text for v in decoder.values]
        if [g.strip() for g in given] != [str(count)]:
            t.note(f"--decoder-num-layers {' '.join(given)}: pretrain_t5.py never reads it; the "
                   f"decoder is built with num_layers ({count} layers), as the encoder",
                   decoder.line, decoder.flag)
    if "share_embeddings_and_output_weights" not in t.mapping:
        # The command line ties them unless --untie-embeddings-and-output-weights is given;
        # the YAML route's default would be T5Model's (untied).
        t.set("share_embeddings_and_output_weights", True, source.line, source.flag)


def _gpt_layer_count(t: FlagState, encoder, decoder, num_layers) -> None:
    """A GPT entry script: validate_args' rule without the T5 model around it."""
    script = t.entry.name
    if encoder is not None:
        if num_layers is not None:
            raise InputError("cannot be given together with --num-layers (Megatron asserts "
                             "'cannot have both num-layers and encoder-num-layers specified')",
                             file=t.file, line=encoder.line, key=encoder.flag)
        count = t.mapping.pop("encoder_num_layers", None)
        t.flag_of.pop("encoder_num_layers", None)
        t.set("num_layers", count, encoder.line, encoder.flag)
    given = [v.text.strip() for v in decoder.values] if decoder is not None else []
    if decoder is not None and all(v.known for v in decoder.values) \
            and given != [str(t.mapping.get("num_layers"))]:
        t.note(f"--decoder-num-layers {' '.join(given)}: {script} builds a GPT model and never "
               f"reads it; the model has {t.mapping.get('num_layers')} layers", decoder.line,
               decoder.flag)
