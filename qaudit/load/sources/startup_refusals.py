"""Command lines Megatron refuses at start-up, before any model exists (docs/upstream-checks.md).

Two kinds, both exit 2 with upstream's own message and the line of the option it names:
- argparse's: an `int`/`float` option whose value does not convert (a functional test's
  `--hierarchical-context-parallel-sizes: 2 2` reaches the parser as the one word "2 2"), an
  option missing its value;
- `validate_args`' (megatron/training/arguments.py) and the determinism check it calls
  (megatron/training/determinism.py): refusals on settings the audit otherwise ignores, read in
  megatron-core 0.19.2 and in Megatron-LM main at d98e8a64 (same conditions in both).

A value the file takes from outside, or an option passed under an undecided condition, makes
the checks that read it skip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qaudit.errors import InputError
from qaudit.load.sources.argv import Occurrence
from qaudit.load.sources.upstream_flags import UPSTREAM_FLAGS

if TYPE_CHECKING:
    from qaudit.load.sources.flag_state import FlagState

UNKNOWN = object()
_CONVERT = {"i": (int, "int"), "f": (float, "float")}


def refuse_unconvertible_values(t: FlagState) -> None:
    """argparse's `type=int`/`type=float` conversion and value count, on every option of
    Megatron's parser the file passes (any entry script parses them with that parser)."""
    for occurrence in t.last.values():
        spec = UPSTREAM_FLAGS.get(occurrence.flag)
        if spec is None or spec[1] in ("T", "F") or occurrence.word.condition:
            continue
        kind = spec[1]
        count = kind[:-1]
        if (count.isdigit() and len(occurrence.values) < int(count)
                or count == "+" and not occurrence.values):
            wanted = "one argument" if count == "1" else \
                "at least one argument" if count == "+" else f"{count} arguments"
            _refuse(t, occurrence, f"argument {occurrence.flag}: expected {wanted}", "parse_args")
        if kind[-1] not in _CONVERT:
            continue
        convert, name = _CONVERT[kind[-1]]
        for value in occurrence.values:
            if value.depends_on():
                continue
            try:
                convert(value.text)
            except ValueError:
                _refuse(t, occurrence, f"argument {occurrence.flag}: invalid {name} value: "
                        f"{value.text!r}", "parse_args")


def refuse_validate_args(t: FlagState) -> None:
    """validate_args' refusals of settings outside the model (0.19.2 line numbers)."""
    value = _Values(t)
    sizes = value.occurrence("--hierarchical-context-parallel-sizes")
    cp = value.get("context_parallel_size")
    if sizes is not None and sizes.values and cp is not UNKNOWN:
        product = 1
        for size in sizes.values:
            product *= int(size.text)  # converted by refuse_unconvertible_values already
        if product != cp:  # arguments.py:562-564, a bare assert
            _refuse(t, sizes, f"assert args.context_parallel_size == "
                    f"prod(args.hierarchical_context_parallel_sizes) ({cp} != {product}; "
                    "Megatron's assertion has no message)", "validate_args", "AssertionError")
    # Whatever their values: argparse's `global_batch_size is not None` is all it takes.
    schedule, batch = value.occurrence("--step-batch-size-schedule", any_value=True), \
        value.occurrence("--global-batch-size", any_value=True)
    if schedule and batch:  # arguments.py:680, a ValueError
        _refuse(t, batch, "Cannot specify both --step-batch-size-schedule and "
                "--global-batch-size", "validate_args", f"--step-batch-size-schedule is set at "
                f"line {schedule.line}")
    fsdp2 = value.occurrence("--use-torch-fsdp2")
    if fsdp2 is not None and value.get("use_torch_fsdp2") is True:
        # arguments.py:997-1013, in upstream's order (the torch version assert aside).
        for dest, bad, message in (
                ("pipeline_model_parallel_size", lambda v: v != 1,
                 "--use-torch-fsdp2 is not supported with pipeline parallelism"),
                ("expert_model_parallel_size", lambda v: v != 1,
                 "--use-torch-fsdp2 is not supported with expert parallelism"),
                ("use_distributed_optimizer", bool,
                 "--use-torch-fsdp2 is not supported with MCore's distributed optimizer"),
                ("gradient_accumulation_fusion", bool,
                 "--use-torch-fsdp2 is not supported with gradient accumulation fusion"),
                ("ckpt_format", lambda v: v not in ("torch_dist", "torch_dcp"),
                 "--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp"),
                ("untie_embeddings_and_output_weights", lambda v: not v,
                 "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"),
                ("fp16", bool, "--use-torch-fsdp2 not supported with fp16 yet")):
            setting = value.get(dest)
            if setting is UNKNOWN:
                return  # upstream stops at the first failing assert: later ones undecided
            if bad(setting):
                _refuse(t, fsdp2, message, "validate_args", "AssertionError")
    fp16, bf16 = value.occurrence("--fp16"), value.occurrence("--bf16")
    if fp16 and bf16:  # arguments.py:1172-1173, a bare `assert not args.bf16`
        _refuse(t, max(fp16, bf16, key=lambda o: o.line or 0), "assert not args.bf16 (with "
                "--fp16; Megatron's assertion has no message: only one of --fp16 and --bf16 "
                "may be given)", "validate_args", "AssertionError")
    overlap = value.occurrence("--tp-comm-overlap")
    if overlap is not None and value.get("tp_comm_overlap") is True:
        # arguments.py:1393-1402: TP 1 turns sequence parallelism off first.
        tp, sp = value.get("tensor_model_parallel_size"), value.get("sequence_parallel")
        if tp is not UNKNOWN and sp is not UNKNOWN and not (sp and tp != 1):
            why = "" if not sp else f" (--tensor-model-parallel-size {tp} turned it off)"
            _refuse(t, overlap, "Tensor parallel communication/GEMM overlap can happen only "
                    f"when sequence parallelism is enabled{why}", "validate_args",
                    "AssertionError")
    deterministic = value.occurrence("--deterministic-mode")
    if deterministic is not None and value.get("deterministic_mode") is True:
        # determinism.py::apply_determinism_to_args (ARG_VALUES_REQUIRED_FOR_DETERMINISM),
        # called from validate_args (arguments.py:1653).
        wrong = [f"{dest}=False (got True)" for dest in ("cross_entropy_loss_fusion",
                                                         "tp_comm_overlap")
                 if value.get(dest) is True]
        if wrong and all(value.get(d) is not UNKNOWN for d in ("cross_entropy_loss_fusion",
                                                              "tp_comm_overlap")):
            _refuse(t, deterministic, f"--deterministic-mode requires: {', '.join(wrong)}. "
                    "Adjust these options to continue.", "validate_args", "AssertionError")


class _Values:
    """argparse's value of a destination: the last option written for it, else the parser's
    default; UNKNOWN when the file takes it from outside."""

    DEFAULTS: dict[str, Any] = {
        "pipeline_model_parallel_size": 1, "expert_model_parallel_size": 1,
        "use_distributed_optimizer": False, "gradient_accumulation_fusion": True,
        "ckpt_format": "torch_dist", "untie_embeddings_and_output_weights": False,
        "fp16": False, "use_torch_fsdp2": False, "deterministic_mode": False,
        "cross_entropy_loss_fusion": False, "tp_comm_overlap": False,
        "tensor_model_parallel_size": 1, "sequence_parallel": False,
        "context_parallel_size": 1,
    }

    def __init__(self, t: FlagState) -> None:
        self.t = t
        self.open_ended = any(word.unknown for word in t.loose)

    def occurrence(self, flag: str, any_value: bool = False) -> Occurrence | None:
        """The option as passed, None when it is not (or not surely, or, unless `any_value`,
        with a value from outside)."""
        occurrence = self.t.last.get(flag)
        if occurrence is None or occurrence.word.condition \
                or not any_value and any(v.depends_on() for v in occurrence.values):
            return None
        return occurrence

    def get(self, dest: str) -> Any:
        written = [o for flag, o in self.t.last.items()
                   if UPSTREAM_FLAGS.get(flag, ("",))[0] == dest]
        if not written:
            return UNKNOWN if self.open_ended else self.DEFAULTS[dest]
        last = written[-1]  # self.t.last keeps argv order of each option's last occurrence
        if last.word.condition or any(v.depends_on() for v in last.values):
            return UNKNOWN
        kind = UPSTREAM_FLAGS[last.flag][1]
        if kind in ("T", "F"):
            return kind == "T"
        texts = [v.text for v in last.values]
        if not texts:
            return UNKNOWN  # refuse_unconvertible_values reports it
        return int(texts[0]) if kind.endswith("i") else texts[0]


def _refuse(t: FlagState, occurrence: Occurrence, message: str, where: str,
            kind: str = "") -> None:
    upstream = {"parse_args": "Megatron's argument parser stops at start-up",
                "validate_args": "Megatron's validate_args refuses it at start-up"}[where]
    detail = f" ({kind})" if kind and kind != "AssertionError" else ""
    raise InputError(f"{upstream}: {message!r}{detail}", file=t.file, line=occurrence.line,
                     key=occurrence.flag)
