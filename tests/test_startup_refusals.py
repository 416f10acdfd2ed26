"""What Megatron refuses at start-up, qaudit refuses (issue 37): argparse's value conversion,
validate_args' refusals of settings outside the model, TransformerConfig's bf16 + fp16.
Each message is upstream's own (checked against megatron-core 0.19.2 by
test_each_refusal_is_upstreams_own) and names the file, line and option."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from qaudit.commands.check import load_inputs
from qaudit.errors import InputError

BASE = "--num-layers 2 --hidden-size 64 --num-attention-heads 4"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "megatron"


def load(path: Path):
    return load_inputs(str(path), None, {})[0]


def script(tmp_path: Path, flags: str, entry: str = "pretrain_gpt.py") -> Path:
    path = tmp_path / "train.sh"
    path.write_text(f"#!/bin/bash\ntorchrun {entry} {BASE} \\\n  " +
                    " \\\n  ".join(flags.split(" ; ")) + "\n")
    return path


# (flags, one line per ' ; ' group from line 3 on; the refused option; its line; upstream's text)
REFUSED = {
    "batch-size ramp beside a global batch size": (
        "--global-batch-size 1536 ; --step-batch-size-schedule 0:16_1B:32",
        "--global-batch-size", 3,
        "Cannot specify both --step-batch-size-schedule and --global-batch-size"),
    "FSDP2 with tied embeddings": (
        "--use-torch-fsdp2 ; --no-gradient-accumulation-fusion",
        "--use-torch-fsdp2", 3,
        "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"),
    "FSDP2 with gradient accumulation fusion (the default)": (
        "--untie-embeddings-and-output-weights ; --use-torch-fsdp2",
        "--use-torch-fsdp2", 4,
        "--use-torch-fsdp2 is not supported with gradient accumulation fusion"),
    "deterministic mode with TP comm overlap": (
        "--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap ; "
        "--deterministic-mode",
        "--deterministic-mode", 4,
        "--deterministic-mode requires: tp_comm_overlap=False (got True)"),
    "TP comm overlap without sequence parallelism": (
        "--tensor-model-parallel-size 2 ; --tp-comm-overlap",
        "--tp-comm-overlap", 4,
        "Tensor parallel communication/GEMM overlap can happen only when sequence "
        "parallelism is enabled"),
    "TP comm overlap at TP 1": (
        "--sequence-parallel ; --tp-comm-overlap",
        "--tp-comm-overlap", 4,
        "Tensor parallel communication/GEMM overlap can happen only when sequence "
        "parallelism is enabled"),
    "a batch-size ramp beside a global batch size from outside": (
        "--global-batch-size $GBS ; --step-batch-size-schedule 0:16",
        "--global-batch-size", 3,
        "Cannot specify both --step-batch-size-schedule and --global-batch-size"),
    "a space-separated list passed as one word": (
        "--hierarchical-context-parallel-sizes '2 2'",
        "--hierarchical-context-parallel-sizes", 3,
        "argument --hierarchical-context-parallel-sizes: invalid int value: '2 2'"),
    "hierarchical context-parallel sizes that do not multiply to the CP size": (
        "--context-parallel-size 2 ; --hierarchical-context-parallel-sizes 2 2",
        "--hierarchical-context-parallel-sizes", 4, "(2 != 4;"),
    "an int option without its value": (
        "--bf16 ; --global-batch-size",
        "--global-batch-size", 4,
        "argument --global-batch-size: expected one argument"),
    "bf16 with fp16": (
        "--bf16 ; --fp16", "--fp16", 4, "assert not args.bf16"),
}

ACCEPTED = {
    "a ramp alone": "--step-batch-size-schedule 0:16_1B:32",
    "FSDP2 as upstream wants it": "--use-torch-fsdp2 --untie-embeddings-and-output-weights "
                                  "--no-gradient-accumulation-fusion",
    "deterministic mode alone": "--deterministic-mode",
    "TP comm overlap as upstream wants it": "--tensor-model-parallel-size 2 --sequence-parallel "
                                            "--tp-comm-overlap",
    "a list as separate words": "--context-parallel-size 4 "
                                "--hierarchical-context-parallel-sizes 2 2",
    "FSDP2 whose fusion setting comes from outside": "--use-torch-fsdp2 $EXTRA",
}


@pytest.mark.parametrize("case", REFUSED, ids=REFUSED)
def test_refused_with_upstreams_message_file_and_line(tmp_path, case):
    flags, flag, line, text = REFUSED[case]
    with pytest.raises(InputError) as error:
        load(script(tmp_path, flags))
    assert (error.value.line, error.value.key) == (line, flag), str(error.value)
    assert text in error.value.message
    assert "start-up" in error.value.message or "TransformerConfig" in error.value.message


def _qaudit_message(case: str) -> str:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        try:
            load(script(Path(folder), REFUSED[case][0]))
        except InputError as exc:
            return exc.message
    return ""


@pytest.mark.parametrize("case", ACCEPTED, ids=ACCEPTED)
def test_accepted_where_upstream_accepts(tmp_path, case):
    assert load(script(tmp_path, ACCEPTED[case])).num_layers == 2


def test_bf16_with_fp16_on_the_yaml_and_model_args_routes(tmp_path):
    plain = tmp_path / "model.yaml"
    plain.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nbf16: true\n"
                     "fp16: true\n")
    args = tmp_path / "model_config.yaml"
    args.write_text(json.dumps({"MODEL_ARGS": {"--num-layers": 2, "--hidden-size": 64,
                                               "--num-attention-heads": 4, "--bf16": True,
                                               "--fp16": True}}))
    # TransformerConfig raises on a YAML config; a command line stops at validate_args first.
    for path, key, text in ((plain, "fp16", "Only one of fp16 and bf16"),
                            (args, "--fp16", "assert not args.bf16")):
        with pytest.raises(InputError) as error:
            load(path)
        assert error.value.key == key and error.value.line is not None
        assert text in error.value.message


def test_model_args_bracketed_list_is_several_values_a_spaced_one_is_one(tmp_path):
    """_run_training.sh strips `[ ]` into several words but quotes a value with a space."""
    for value, refused in (("\"[2 2]\"", False), ("2 2", True)):
        path = tmp_path / "model_config.yaml"
        path.write_text(textwrap.dedent(f"""\
            MODEL_ARGS:
              --num-layers: 2
              --hidden-size: 64
              --num-attention-heads: 4
              --context-parallel-size: 4
              --hierarchical-context-parallel-sizes: {value}
            """))
        if refused:
            with pytest.raises(InputError, match="invalid int value: '2 2'"):
                load(path)
        else:
            load(path)


CORPUS_REFUSED = {
    "functional_tests/gpt__gpt3_mcore_te_tp1_pp2_cp4_a2a_p2p_nondeterministic.yaml":
        (42, "invalid int value: '2 2'"),
    "functional_tests/gpt__gpt3_mcore_tp1_pp1_fsdp2_resume_torch_dist_te.yaml":
        (42, "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"),
    "functional_tests/gpt__gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap.yaml":
        (46, "--deterministic-mode requires: tp_comm_overlap=False"),
    "launch_scripts/gpt3__train_gpt3_175b_distributed.sh":
        (39, "Cannot specify both --step-batch-size-schedule and --global-batch-size"),
}
# Named by issue 37 but accepted by megatron-core 0.19.2 in a real run: the inference script
# parses under torch.inference_mode() (upstream's assert allows "inference mode"), and the
# CLI's core_transformer_config_from_args sets the yarn_* attributes GPTModel reads.
CORPUS_ACCEPTED = (
    "functional_tests/gpt__gpt_static_inference_tp1_pp1_583m_fp8_cudagraphs.yaml",
    "functional_tests/moe__gpt_dynamic_inference_tp2_pp2_ep2_gptoss_20b_swa.yaml",
)


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
def test_corpus_files_megatron_refuses_are_refused():
    for name, (line, text) in CORPUS_REFUSED.items():
        with pytest.raises(InputError) as error:
            load(CORPUS / name)
        assert error.value.line == line and text in error.value.message, (name, error.value)
    for name in CORPUS_ACCEPTED:
        assert load(CORPUS / name).num_layers > 0


@pytest.mark.slow
@pytest.mark.usefixtures("forget_megatron")
@pytest.mark.parametrize("case", [*REFUSED, *ACCEPTED])
def test_each_refusal_is_upstreams_own(megatron, case):
    """The same command line through megatron-core 0.19.2's own parse_args, validate_args and
    core_transformer_config_from_args: refused with the same text, or accepted."""
    import shlex

    from qaudit.crosscheck.build_scope import upstream_environment
    from qaudit.runtime.standin.side import TESide
    from qaudit.crosscheck.upstream_config import ArgumentsRejected, upstream_arguments

    flags = REFUSED[case][0] if case in REFUSED else ACCEPTED[case]
    if case == "FSDP2 whose fusion setting comes from outside":
        return  # nothing to compare: qaudit skips the check, upstream sees one value
    # Upstream's own required settings qaudit does not read.
    needed = "--micro-batch-size 1 --seq-length 64 --max-position-embeddings 64"
    words = shlex.split(f"{BASE} {needed} {flags.replace(' ; ', ' ').replace('$GBS', '8')}")
    expected = REFUSED[case][3] if case in REFUSED else None
    if expected and "Megatron's assertion has no message" in _qaudit_message(case):
        expected = "validate_args: AssertionError: "  # upstream's assert has no message
    with upstream_environment(TESide("standin")):
        try:
            upstream_arguments(words, {"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
            refused = None
        except ArgumentsRejected as exc:
            refused = str(exc)
    if expected is None:
        assert refused is None, refused
    else:
        assert refused is not None and expected in refused, refused


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
@pytest.mark.usefixtures("forget_megatron")
@pytest.mark.parametrize("name", CORPUS_ACCEPTED)
def test_the_cross_check_starts_the_accepted_files_as_upstream_does(megatron, name):
    """--cross-check hands both files to megatron-core 0.19.2's own start-up as their runner
    does: the inference test under torch.inference_mode(), and the config's non-field
    attributes (yarn_*) kept for the rebuilt TransformerConfig."""
    from qaudit.crosscheck.build_scope import upstream_environment
    from qaudit.runtime.standin.side import TESide
    from qaudit.crosscheck.upstream_config import argv_strings, from_arguments

    config = load(CORPUS / name)
    assert config.source.inference_test
    words, _ = argv_strings(config.source.argv)
    with upstream_environment(TESide("standin")):
        upstream, _ = from_arguments(config, words, config.source.environment,
                                     config.source.inference_test)
    if "gptoss" in name:
        assert upstream.config_attributes["yarn_rotary_scaling_factor"] == 32.0
