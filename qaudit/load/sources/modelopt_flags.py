"""Megatron's ModelOpt builder: when it builds the model, and with which spec
(docs/upstream-model.md, "The modelopt spec").

`megatron/post_training/model_builder.py` (`modelopt_gpt_hybrid_builder`) builds the model of
every script in `examples/post_training/modelopt/`, and of `pretrain_gpt.py` /
`pretrain_hybrid.py` once ModelOpt is on (`--export-kd-teacher-load`; a ModelOpt checkpoint
under `--load`, which the file cannot show). It builds ModelOpt's spec (Megatron's own linears)
unless `--export-default-te-spec`, which builds the TE spec with two differences from the
training scripts: the GPT decoder uses one layer spec for every layer (MoE everywhere when the
model has experts) and experts are grouped unless the entry script is `prune.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qaudit.errors import InputError

if TYPE_CHECKING:
    from qaudit.load.sources.flag_state import FlagState

# Options of ModelOpt's own parser (`megatron/post_training/arguments.py`, add_modelopt_args,
# Megatron-LM d98e8a64): known, not Megatron's training parser. The value: why the audit
# cannot follow it, or None when it changes nothing the audit looks at (or is handled here).
MODELOPT_FLAGS: dict[str, str | None] = {
    "--export-model-type": None,
    "--export-legacy-megatron": None,
    "--export-te-mcore-model": None,  # checkpoint key remapping only
    "--export-default-te-spec": None,
    "--export-force-local-attention": None,  # core attention only, not a linear
    "--export-kv-cache-quant": None,
    "--export-real-quant-cfg": "ModelOpt's real-quantized transformer layers are not modelled",
    "--export-quant-cfg": "ModelOpt's own quantizers (not TE's) are not modelled",
    "--export-kd-teacher-load": "the distillation teacher is a second model; only the student "
                                "is audited",
    "--export-kd-teacher-model-config": None,
    "--export-kd-teacher-ckpt-format": None,
    "--export-kd-cfg": None,
    "--finetune-hf-dataset": None,
    "--finetune-data-split": None,
    "--finetune-data-files": None,
    "--qad-train-target": "frozen weights (QAD train target) produce no gradients; not modelled",
    "--freeze-base-for-mtp": "frozen weights produce no gradients; not modelled",
    "--export-qk-l2-norm": None,  # a norm, not a linear
    "--export-moe-apply-probs-on-input": None,
    "--export-offline-model": "offline speculative-decoding models build no decoder layers; "
                              "not modelled",
    "--modelopt-enabled": None,
    "--enable-gpt-oss": None,
}
_ON_FLAGS = ("--export-kd-teacher-load", "--modelopt-enabled")
_SPEC = "layer_spec"


def known_modelopt_flag(flag: str) -> bool:
    return flag in MODELOPT_FLAGS


def note_modelopt_flags(t: FlagState) -> None:
    """One QA090 note per ModelOpt option the audit cannot follow."""
    for flag, why in MODELOPT_FLAGS.items():
        occurrence = t.last.get(flag)
        if occurrence is None or why is None:
            continue
        if flag == "--export-real-quant-cfg" and [v.text for v in occurrence.values] == ["None"]:
            continue
        t.note(f"{flag}: {why}", occurrence.line, flag)


def apply_modelopt(t: FlagState) -> None:
    """Set the layer spec the ModelOpt builder would use, when it builds the model."""
    reason = t.entry.modelopt_location()
    switch = next((t.last[f] for f in _ON_FLAGS if f in t.last), None)
    if reason is None and switch is None:
        return
    # Where the spec comes from, for messages: the switch, else the entry point.
    line = switch.line if switch is not None else t.entry.line
    flag = switch.flag if switch is not None else (t.entry.name or "ModelOpt example")
    spec = t.last.get("--spec")
    if spec is not None:
        raise InputError("ModelOpt's builder raises 'ModelOpt integration does not support "
                         "custom args.spec'", file=t.file, line=spec.line, key=spec.flag)
    model_type = t.last.get("--export-model-type")
    declared = t.needed(model_type)[0] if model_type is not None and model_type.values else "GPTModel"
    if declared == "GPTModel" and "hybrid_layer_pattern" in t.mapping:
        raise InputError("ModelOpt's builder builds a GPTModel for --export-model-type GPTModel "
                         "(the default) and drops the hybrid layer pattern; not modelled: pass "
                         "--export-model-type HybridModel", file=t.file, line=line,
                         key="--export-model-type")
    default_te = t.last.get("--export-default-te-spec")
    if default_te is None:
        t.set(_SPEC, "modelopt", line, flag)
        if t.mapping.get("fp8") or t.mapping.get("fp4") or t.mapping.get("quant_recipe"):
            t.note("the modelopt spec builds Megatron's own linears in the decoder: TE's fp8/fp4 "
                   "settings and recipes reach only the TE modules (MTP layers of a GPT)",
                   line, flag)
        return
    _default_te_spec(t, default_te)


def _default_te_spec(t: FlagState, occurrence) -> None:
    """`--export-default-te-spec`: the TE spec as ModelOpt's builder asks for it."""
    def fail(message: str, key: str) -> None:
        raise InputError(message, file=t.file, line=occurrence.line, key=key)

    grouped = t.entry.name != "prune.py"  # prune.py passes disable_moe_grouped_gemm=True
    experts = t.mapping.get("num_moe_experts")
    if not experts:
        return
    if "hybrid_layer_pattern" in t.mapping:
        if not grouped:
            fail("prune.py's sequential experts in a hybrid model are not modelled",
                 occurrence.flag)
        return
    if t.mapping.get("mla_down_proj_fusion"):
        fail("with --export-default-te-spec the GPT decoder is built without the fused MLA "
             "down projection but its MTP layers with it; not modelled", "--mla-down-proj-fusion")
    if t.mapping.get("mtp_num_layers") and bool(t.mapping.get("moe_grouped_gemm")) != grouped:
        # The MTP block's spec reads --moe-grouped-gemm, the decoder's the builder's choice.
        fail("with --export-default-te-spec the GPT decoder's experts are "
             f"{'grouped' if grouped else 'sequential'} whatever --moe-grouped-gemm says, its "
             "MTP layers' follow the flag; not modelled", occurrence.flag)
    t.set("moe_grouped_gemm", grouped, occurrence.line, occurrence.flag)
    freq = t.mapping.get("moe_layer_freq", 1)
    all_moe = all(freq) if isinstance(freq, list) else freq == 1
    if not all_moe:
        # One layer spec for every decoder layer: MoE everywhere. The MTP layer follows the
        # per-layer pattern's last layer, which must then be MoE too for qaudit to model it.
        last_is_moe = freq[-1] if isinstance(freq, list) else \
            (t.mapping.get("num_layers", 1) - 1) % freq == 0
        if t.mapping.get("mtp_num_layers") and not last_is_moe:
            fail("with --export-default-te-spec every GPT decoder layer is MoE while the MTP "
                 "layer follows the last layer of --moe-layer-freq (dense); not modelled",
                 "--moe-layer-freq")
        t.set("moe_layer_freq", 1, occurrence.line, occurrence.flag)
