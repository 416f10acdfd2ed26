"""Launch scripts and MODEL_ARGS files as model configs (qaudit.load.sources)."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

from qaudit import cli
from qaudit.run.options import AuditOptions
from qaudit.commands.check import audit_files, load_inputs
from qaudit.errors import InputError
from qaudit.load.sources import megatron_flags
from qaudit.load.sources.listexpr import parse_list_expression
from qaudit.load.sources.upstream_flags import UPSTREAM_FLAGS

FAST = AuditOptions(steps=1, microbatches=1)
PACKAGE = Path(__file__).resolve().parents[1] / "qaudit"
SOURCES = PACKAGE / "load" / "sources"


@pytest.fixture
def write(tmp_path: Path):
    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return str(path)
    return write


def load(path: str, **variables: str):
    return load_inputs(path, None, variables)[0]


# --- one model, three spellings --------------------------------------------------------------

TRANSFORMER_CONFIG = """
num_layers: 4
hidden_size: 64
ffn_hidden_size: 128
num_attention_heads: 4
num_query_groups: 2
gated_linear_unit: true
num_moe_experts: 4
moe_ffn_hidden_size: 32
moe_layer_freq: [0, 1, 1, 1]
moe_grouped_gemm: true
moe_router_topk: 2
mtp_num_layers: 2
mtp_use_repeated_layer: true
fp8: hybrid
fp8_recipe: tensorwise
share_embeddings_and_output_weights: false
"""

MODEL_ARGS = """
ENV_VARS:
  LAYERS: 4
MODEL_ARGS:
  --num-layers: ${LAYERS}
  --hidden-size: 64
  --ffn-hidden-size: 128
  --num-attention-heads: 4
  --group-query-attention: true
  --num-query-groups: 2
  --swiglu: true
  --num-experts: 4
  --moe-ffn-hidden-size: 32
  --moe-layer-freq: ([0]*1+[1]*3)
  --moe-grouped-gemm: true
  --moe-router-topk: 2
  --mtp-num-layers: 2
  --mtp-use-repeated-layer: true
  --fp8-format: hybrid
  --fp8-recipe: tensorwise
  --untie-embeddings-and-output-weights: true
  --data-path: ${DATA_PATH}/text_document
  --lr: 0.0001
"""

LAUNCH_SCRIPT = """
#!/bin/bash
# the same model as a launch script
NUM_LAYERS=${NUM_LAYERS:-4}
DTYPE="fp8"
GPUS=$((2 * 4))

MODEL_ARGS=(
    --num-layers $NUM_LAYERS
    --hidden-size $(( 32 * 2 ))   # arithmetic
    --ffn-hidden-size 128
    --num-attention-heads 4 --group-query-attention --num-query-groups 2
    --swiglu
)
MOE_ARGS=(--num-experts 4 --moe-ffn-hidden-size 32 "--moe-layer-freq" '[0]*1+[1]*3'
          --moe-grouped-gemm --moe-router-topk 2)
if [[ "$DTYPE" == "fp8" ]]; then
    MODEL_ARGS+=("--fp8-format hybrid" "--fp8-recipe tensorwise")
fi
torchrun --nproc_per_node $GPUS pretrain_gpt.py \\
    ${MODEL_ARGS[@]} \\
    "${MOE_ARGS[@]}" \\
    --mtp-num-layers 2 --mtp-use-repeated-layer \\
    --untie-embeddings-and-output-weights \\
    --save "$CHECKPOINT_DIR" --lr 1e-4 2>&1 | tee log.txt
"""


def test_same_model_three_ways_gives_identical_module_rows(write):
    rows = []
    for name, text in (("model.yaml", TRANSFORMER_CONFIG), ("model_config.yaml", MODEL_ARGS),
                       ("train.sh", LAUNCH_SCRIPT)):
        report = audit_files(write(name, text), None, FAST)
        rows.append(json.dumps(report.to_dict()["modules"], sort_keys=True))
        assert report.exit_code() == 1  # repeated MTP under fp8: QA001
    assert rows[0] == rows[1] == rows[2]
    assert '"mtp.layers.0.eh_proj"' in rows[0] and "fp8/tensorwise" in rows[0]


def test_fields_keep_the_line_of_their_flag(write):
    config = load(write("train.sh", LAUNCH_SCRIPT))
    lines = config.source.mapping.key_lines
    assert (lines["num_layers"], lines["hidden_size"], lines["fp8"]) == (8, 9, 17)
    assert lines["mtp_use_repeated_layer"] == 22  # a flag written in the torchrun command
    assert config.line_of("moe_layer_freq") == 14
    config = load(write("model_config.yaml", MODEL_ARGS))
    assert config.line_of("num_layers") == 4 and config.line_of("fp8") == 18


# --- list expressions ------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("([0]*3+[1]*12)", [0] * 3 + [1] * 12),
    ("[0]*1+[1]*15", [0] + [1] * 15),
    ("([1]*3+[0]*1)*2", [1, 1, 1, 0, 1, 1, 1, 0]),
    ("[0, 1,1]", [0, 1, 1]),
    ("2*[1]+[0]", [1, 1, 0]),
    (" ( [1] * 2 ) ", [1, 1]),
])
def test_list_expressions(text, expected):
    assert parse_list_expression(text) == expected


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "[0]*3+", "[0.5]*2", "[-1]*2", "[]", "[0]*n",
    "[0]*3 if True else [1]", "[x for x in range(3)]", "[0]*10**9", "[0]*99999999", "()",
    "[0]*3+[1]*12)", "([0]*3", "'[0]'*3", "[0]*3;", "0x1*[1]",
])
def test_list_expressions_reject_anything_else(text):
    with pytest.raises(ValueError, match="not a list expression"):
        parse_list_expression(text)


def test_bad_layer_freq_names_the_flag_and_line(write):
    path = write("t.sh", "python pretrain_gpt.py --num-layers 2 --hidden-size 8 \\\n"
                         "  --num-attention-heads 2 --num-experts 2 --moe-layer-freq '[1]*2+os'\n")
    with pytest.raises(InputError, match=r"--moe-layer-freq.*not a list expression") as info:
        load(path)
    assert info.value.line == 2


# --- bash ------------------------------------------------------------------------------------

BASE = "--hidden-size 64 --num-attention-heads 4"


def test_defaults_arithmetic_conditionals_and_continuations(write):
    path = write("t.sh", f"""
        #!/usr/bin/env bash
        set -euo pipefail
        LAYERS=${{LAYERS:-6}}           # environment default
        : "${{EXPERTS:=8}}"             # assigning default
        TOPK=$(( EXPERTS / 4 ))
        PRECISION=${{1:-bf16}}          # script argument with a default
        if [ "$PRECISION" = "fp8" ]; then
            QUANT="--fp8-format e4m3"
        elif [[ $PRECISION == bf* && $TOPK -ge 2 ]]; then
            QUANT="--no-gradient-accumulation-fusion"
        else
            QUANT="--fp4-format e2m1"
        fi
        case "$LAYERS" in
            6|12) FREQ=2 ;;
            *) FREQ=1 ;;
        esac
        [ -z "$UNSET_THING" ] || exit 1
        ARGS="--num-layers $LAYERS \\
              --num-experts $EXPERTS --moe-router-topk $TOPK --moe-layer-freq $FREQ"
        torchrun pretrain_gpt.py $ARGS $QUANT {BASE}
    """)
    config = load(path)
    assert (config.num_layers, config.num_moe_experts, config.moe_router_topk) == (6, 8, 2)
    assert config.moe_layer_freq == 2 and config.fp8 is None and config.fp4 is None
    assert config.gradient_accumulation_fusion is False
    assert config.line_of("num_moe_experts") == 20  # inside the continued string
    config = load(path, **{"1": "fp8", "LAYERS": "4"})
    assert (config.fp8, config.num_layers, config.moe_layer_freq) == ("e4m3", 4, 1)


def test_quotes_comments_and_flag_equals_value(write):
    config = load(write("t.sh", f"""
        # python pretrain_gpt.py --num-layers 99   (a comment, not a launch)
        ARGS=( '--num-layers' "2" --fp8-format=hybrid --fp8-recipe "mxfp8" )
        uv run python -m torch.distributed.run --nnodes 1 train/pretrain_gpt.py "${{ARGS[@]}}" \\
            {BASE} # trailing comment --num-layers 5
    """))
    assert (config.num_layers, config.fp8, config.fp8_recipe) == (2, "hybrid", "mxfp8")


def test_argument_files_without_a_launch_use_the_flag_variables(write):
    config = load(write("conf.sh", f"""
        TOKENIZER=some/model
        MODEL_ARGS=" \\
            --num-layers 3 \\
            {BASE} \\
            --moe-layer-freq [0]*1+[1]*2 \\
            --num-experts 4 \\
        "
        EXTRA_ARGS="--mtp-num-layers 1"
    """))
    assert config.num_layers == 3 and config.moe_layer_freq == [0, 1, 1]
    assert config.mtp_num_layers == 1 and config.line_of("moe_layer_freq") == 5


def test_unset_variable_that_matters_names_file_line_and_variable(write):
    path = write("train.sh", f"""
        #!/bin/bash
        torchrun pretrain_gpt.py {BASE} \\
            --save $CHECKPOINTS \\
            --num-layers $NUM_LAYERS
    """)
    with pytest.raises(InputError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}:4: key '--num-layers'")
    assert "$NUM_LAYERS" in message and "--set NUM_LAYERS=VALUE" in message
    assert "CHECKPOINTS" not in message  # --save does not matter to the audit
    assert load(path, NUM_LAYERS="3").num_layers == 3


def test_value_from_a_command_or_an_undecided_condition(write):
    path = write("train.sh", f"""
        LAYERS=$(cat layers.txt)
        if [ -f fp8.flag ]; then FP8=(--fp8-format hybrid); fi
        python pretrain_gpt.py {BASE} --num-layers 2 "${{FP8[@]}}"
    """)
    with pytest.raises(InputError, match=r":2: key '--fp8-format': .*condition.*filesystem"):
        load(path)
    path = write("train2.sh", f"LAYERS=$(cat layers.txt)\npython x.py {BASE} --num-layers $LAYERS\n")
    with pytest.raises(InputError, match=r"\$LAYERS \(assigned from \$\(cat layers.txt\).*"
                                         r"--set LAYERS=VALUE"):
        load(path)
    assert load(path, LAYERS="5").num_layers == 5


def test_script_is_never_executed(write, tmp_path):
    marker = tmp_path / "executed"
    path = write("evil.sh", f"""
        #!/bin/bash
        NUM=$(rm -rf /)
        touch {marker}
        X=`touch {marker}`
        eval "touch {marker}"
        Y=$(touch {marker}; echo 2)
        source {marker}
        python pretrain_gpt.py {BASE} --num-layers 2 --seq-length $(touch {marker}) \\
            --lr "$(touch {marker})"
    """)
    config = load(path)
    assert config.num_layers == 2 and not marker.exists()
    notes = [n.message for n in config.source.notes]
    assert any(m.startswith("`eval") for m in notes) and any(m.startswith("`source") for m in notes)


def test_nothing_in_the_readers_can_run_a_program():
    forbidden = re.compile(r"\b(subprocess|os\.system|os\.popen|os\.exec\w*|eval\(|exec\(|"
                           r"(?<!re\.)compile\(|__import__|importlib|pty|shlex)\b")
    readers = sorted(SOURCES.glob("*.py")) + sorted(PACKAGE.glob("families/*/flags.py"))
    assert len(readers) > 10  # the readers are where this test looks
    for path in readers:
        assert not forbidden.search(path.read_text()), path


def test_unmodelled_flag_becomes_a_qa090_warning(write):
    # A custom entry script may add options of its own: an unknown one is a warning naming it.
    path = write("train.sh", f"""
        python my_train.py {BASE} --num-layers 2 \\
            --overlap-grad-reduce \\
            --recompute-activations \\
            --my-custom-flag 3 \\
            --pipeline-model-parallel-size 1 --cuda-graph-impl none
    """)
    report = audit_files(path, None, FAST)
    warnings = {(f["rule"], f["line"], f["message"].split(":")[0])
                for f in report.to_dict()["findings"] if f["severity"] == "warning"}
    assert not any(w[2] == "--overlap-grad-reduce" for w in warnings)  # read, no effect: QA091
    assert ("QA090", 4, "--my-custom-flag") in warnings
    custom = [f["message"] for f in report.to_dict()["findings"]
              if f["message"].startswith("--my-custom-flag")]
    assert custom and "my_train.py may add it (a custom entry point)" in custom[0]
    assert not any(w[2].startswith(("--pipeline", "--cuda-graph", "--recompute")) for w in warnings)
    assert report.exit_code() == 0


@pytest.mark.parametrize("entry", ["pretrain_gpt.py", "pretrain_mamba.py", "pretrain_hybrid.py",
                                   "examples/t5/pretrain_t5.py", "pretrain_bert.py"])
@pytest.mark.parametrize("written, nearest", [("--fp8-formt hybrid", "--fp8-format"),
                                              ("--num-layer 4", "--num-layers"),
                                              ("--bf1", "--bf16"),
                                              ("--zz-qq-unknown 1", None)])
def test_megatron_entry_points_refuse_unknown_options(write, entry, written, nearest):
    """Megatron's parser (allow_abbrev=False) refuses an unknown option or an abbreviation
    before anything runs; qaudit names the file, line, option and the nearest real one."""
    layers = "" if written.startswith("--num-layer ") else "--num-layers 2 "
    path = write("train.sh", f"""
        torchrun --nproc-per-node 8 {entry} {BASE} {layers}\\
            --mtp-num-layers 1 \\
            {written}
    """)
    with pytest.raises(InputError) as error:
        load(path)
    flag = written.split()[0]
    assert (error.value.line, error.value.key) == (3, flag)
    assert f"unrecognized arguments: {flag}" in error.value.message
    if nearest:
        assert error.value.message.endswith(f"did you mean {nearest}?")
    else:
        assert "did you mean" not in error.value.message


def test_model_args_inference_files_keep_unknown_options_as_warnings(write):
    """An inference test's MODEL_ARGS (MODE: inference) runs a script that adds options of its
    own: an option Megatron's training parser does not know stays a QA090 warning."""
    path = write("model_config.yaml", """
        MODE: inference
        MODEL_ARGS:
          --num-layers: 2
          --hidden-size: 64
          --num-attention-heads: 4
          --top-n-logprobs: 5
    """)
    notes = [n.message for n in load(path).source.notes]
    assert any(m.startswith("--top-n-logprobs: not an option") for m in notes)


@pytest.mark.parametrize("typo, line, nearest", [
    ("--mtp-num-layer: 2", 6, "--mtp-num-layers"),
    ("--num-layer: 16", 6, "--num-layers")])
def test_model_args_training_files_refuse_unknown_options(write, typo, line, nearest):
    """Issue 48: a training MODEL_ARGS file (no MODE, or pretraining) goes to Megatron's
    training parser, which stops at an unknown option; the typo is exit 2 at its line with the
    nearest option, not a warning that drops the setting (MTP silently off before)."""
    first = "" if typo.startswith("--num-layer:") else "  --num-layers: 2\n"
    path = write("model_config.yaml", "ENV_VARS:\n  A: 1\nMODEL_ARGS:\n  --hidden-size: 64\n"
                 f"  --num-attention-heads: 4\n  {typo}\n{first}  --mtp-use-repeated-layer: true\n")
    with pytest.raises(InputError) as error:
        load(path)
    assert (error.value.line, error.value.key) == (line, typo.split(":")[0])
    assert f"did you mean {nearest}?" in error.value.message
    assert "unrecognized arguments" in error.value.message


@pytest.mark.parametrize("folder, mode, held", [
    ("test_cases/gpt/x", "", True), ("test_cases/gpt/x", "MODE: pretraining\n", True),
    ("test_cases/gpt/x", "MODE: rl\n", False), ("test_cases/gpt/x", "MODE: inference\n", False),
    ("test_cases/multimodal-llava/x", "", False), ("test_cases/mimo/x", "", False),
    ("copies", "", True)])
def test_model_args_entry_point_follows_mode_and_group(tmp_path, folder, mode, held):
    """Which MODEL_ARGS files are held to the training parser: upstream's recipes run
    pretrain_vlm.py for multimodal-llava, examples/mimo/train.py for mimo, inference and RL
    scripts for those MODEs; each adds options of its own."""
    path = tmp_path / folder / "model_config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(f"{mode}MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n"
                    "  --num-attention-heads: 4\n  --their-own-option: 1\n")
    if held:
        with pytest.raises(InputError, match="--their-own-option"):
            load(str(path))
    else:
        assert any("--their-own-option" in n.message for n in load(str(path)).source.notes)


def test_model_args_flextron_options_are_its_scripts(write):
    """--flextron: the recipe runs pretrain_hybrid_flex.py, whose extra-args provider adds the
    flextron options (known), and still refuses anything else."""
    base = ("MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n  --num-attention-heads: 4\n"
            "  --flextron: true\n  --router-beta: 1.0\n")
    assert load(write("model_config.yaml", base)).num_layers == 2
    with pytest.raises(InputError, match="did you mean --router-beta") as error:
        load(write("model_config.yaml", base + "  --router-betta: 1.0\n"))
    assert "pretrain_hybrid_flex.py" in error.value.message


def test_transformer_impl_local_exits_2(write, monkeypatch, capsys):
    path = write("train.sh", f"python pretrain_gpt.py {BASE} --num-layers 2 "
                             f"--transformer-impl local\n")
    monkeypatch.setattr(sys, "argv", ["qaudit", "check", path])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "transformer-impl local: no TE modules, nothing to audit" in capsys.readouterr().err


def test_cli_set_option(write, monkeypatch, capsys):
    path = write("train.sh", f"python pretrain_gpt.py {BASE} --num-layers $N\n")
    for args, code in ((["--set", "N=2"], 0), ([], 2), (["--set", "not a name=1"], 2)):
        monkeypatch.setattr(sys, "argv", ["qaudit", "check", path, "--steps", "1",
                                          "--microbatches", "1", *args])
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
        assert exit_info.value.code == code, capsys.readouterr()
    assert "--set expects NAME=VALUE" in capsys.readouterr().err


def test_megatron_defaults_that_differ_from_the_dataclass(write):
    config = load(write("t.sh", """
        python pretrain_gpt.py --num-layers 2 --hidden-size 960 --num-attention-heads 4 \\
            --group-query-attention --swiglu --use-megatron-fsdp --num-query-groups 4 \\
            --num-query-groups 2
    """))
    assert config.num_query_groups == 2  # last occurrence wins, as in argparse
    assert config.ffn_hidden_size == 2560  # SwiGLU default: 4h * 2/3 rounded down to 64
    assert config.data_parallel_sharding_strategy == "optim_grads_params"
    config = load(write("u.sh", f"python pretrain_gpt.py --num-layers 2 {BASE} "
                                f"--num-query-groups 2\n"))
    assert config.num_query_groups == 4  # ignored without --group-query-attention


def test_error_from_the_config_names_the_flag(write):
    path = write("t.sh", f"python pretrain_gpt.py --num-layers 2 {BASE} --num-experts 2 \\\n"
                         f"  --moe-router-topk 4\n")
    with pytest.raises(InputError, match=r":2: key '--moe-router-topk': cannot exceed"):
        load(path)


def test_hybrid_pattern_in_a_launch_script_gives_num_layers(write):
    # Unquoted, as the Nemotron-H scripts write it: no file matches the glob, bash keeps it.
    path = write("t.sh", "MODEL_ARGS=\"--hybrid-layer-pattern M*M- --hidden-size 256 "
                         "--num-attention-heads 2\"\n")
    config = load(path)
    assert (config.hybrid_layer_pattern, config.num_layers) == ("M*M-", 4)


# --- MODEL_ARGS details ----------------------------------------------------------------------

def test_model_args_placeholders_duplicates_merges_and_lists(write):
    path = write("model_config.yaml", """
        ENV_VARS:
          NVTE_FLAG: 1
        BASE: &BASE
          --num-layers: 8
          --hidden-size: 64
          --num-attention-heads: 4
          --fp8-format: e4m3
        MODEL_ARGS:
          <<: *BASE
          --num-layers: 4
          --fp8-format: ${PRECISION}
          --hidden-size: 32
          --hidden-size: 64
          --recompute-granularity: selective
          --recompute-modules: "[mlp moe]"
          --swiglu: false
          --load: ${CHECKPOINT_LOAD_PATH}
    """)
    with pytest.raises(InputError, match=r":11: key '--fp8-format'.*--set PRECISION=VALUE"):
        load(path)
    config = load(path, PRECISION="hybrid")
    assert (config.num_layers, config.hidden_size, config.fp8) == (4, 64, "hybrid")
    assert config.recompute_modules == ["mlp", "moe"] and config.gated_linear_unit is False
    assert config.line_of("hidden_size") == 13


def test_plain_transformer_config_yaml_is_unchanged(write):
    config = load(write("c.yaml", TRANSFORMER_CONFIG))
    assert config.num_layers == 4 and config.source.notes == []


# --- the flag table --------------------------------------------------------------------------

def test_flag_table_matches_the_upstream_parser():
    modelled = megatron_flags.modelled_flags()
    for flag in list(modelled) + list(megatron_flags.UNMODELLED) + list(megatron_flags.SPECIAL):
        assert flag in UPSTREAM_FLAGS or flag == "--use-kitchen", flag
    assert UPSTREAM_FLAGS["--fp8-format"] == ("fp8", "1s")
    assert UPSTREAM_FLAGS["--no-gradient-accumulation-fusion"][1] == "F"
    for flag in ("--num-layers", "--mtp-use-repeated-layer", "--fp8-output-proj",
                 "--first-last-layers-bf16", "--te-precision-config-file"):
        assert flag in modelled


def test_every_modelled_field_has_a_flag():
    """A field qaudit.load.config starts modelling needs its Megatron flag in megatron_flags."""
    from qaudit.load.config import MODELLED_FIELDS
    mapped = {spec.field for spec in megatron_flags.modelled_flags().values()}
    no_flag = {"disable_parameter_transpose_cache",  # a config field without a CLI flag
               # HybridModel arguments: the ratios have no flag at the parser's commit, the
               # override flag is translated to hybrid_layer_pattern (sources/hybrid_flags.py).
               "hybrid_attention_ratio", "hybrid_mlp_ratio", "hybrid_override_pattern",
               # the entry point decides it (sources/modelopt_flags.py), no single flag
               "layer_spec"}
    assert MODELLED_FIELDS - mapped - no_flag == set()


def test_multi_latent_attention_gets_the_parser_defaults(write):
    config = load(write("t.sh", f"python pretrain_gpt.py --num-layers 2 {BASE} "
                                f"--multi-latent-attention --v-head-dim 64\n"))
    assert config.multi_latent_attention and config.v_head_dim == 64
    assert (config.q_lora_rank, config.kv_lora_rank) == (None, 32)  # not MLATransformerConfig's
    assert config.source.notes == []


# --- moe_layer_recompute: one rule for both routes -----------------------------------------

@pytest.mark.parametrize("yaml_extra, flag_extra", [
    ("", ""),
    ("recompute_granularity: selective\nrecompute_modules: [mlp]\n",
     "  --recompute-granularity: selective\n  --recompute-modules: mlp\n"),
])
def test_moe_layer_recompute_is_selective_moe_on_both_routes(write, yaml_extra, flag_extra):
    base = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nnum_moe_experts: 2\n"
    yaml_config = load(write("c.yaml", base + "moe_layer_recompute: true\n" + yaml_extra))
    flags_config = load(write("model_config.yaml", "MODEL_ARGS:\n  --num-layers: 2\n"
                              "  --hidden-size: 64\n  --num-attention-heads: 4\n"
                              "  --num-experts: 2\n  --moe-layer-recompute: true\n" + flag_extra))
    for config in (yaml_config, flags_config):
        assert config.recompute_granularity == "selective"
        assert config.selective_recompute("moe")
    assert yaml_config.recompute_modules == flags_config.recompute_modules
    assert yaml_config.recompute_modules == (["mlp", "moe"] if yaml_extra else ["core_attn", "moe"])


def test_moe_layer_recompute_with_full_recompute_is_refused_on_both_routes(write):
    with pytest.raises(InputError, match=r"c.yaml:4: key 'moe_layer_recompute': cannot be "
                                         r"combined with full recompute"):
        load(write("c.yaml", "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
                   "moe_layer_recompute: true\nrecompute_granularity: full\n"
                   "recompute_method: uniform\nrecompute_num_layers: 1\n"))
    with pytest.raises(InputError, match=r"key '--moe-layer-recompute': cannot be combined"):
        load(write("model_config.yaml", "MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n"
                   "  --num-attention-heads: 4\n  --recompute-granularity: full\n"
                   "  --recompute-method: uniform\n  --recompute-num-layers: 1\n"
                   "  --moe-layer-recompute: true\n"))


# The hybrid and T5 families, each written the three ways (the flag route through Megatron's
# own argument rules: the pattern gives --num-layers; --encoder-num-layers marks T5).
HYBRID_THREE_WAYS = (
    "hybrid_layer_pattern: 'M*-ME/*E'\nhidden_size: 64\nnum_attention_heads: 4\n"
    "mamba_num_heads: 16\nmamba_head_dim: 16\nmamba_num_groups: 2\nmamba_state_dim: 16\n"
    "num_moe_experts: 4\nmoe_router_topk: 2\nmoe_ffn_hidden_size: 32\n"
    "fp8: e4m3\nfp8_recipe: tensorwise\n",
    "MODEL_ARGS:\n  --hybrid-layer-pattern: M*-ME/*E\n  --hidden-size: 64\n"
    "  --num-attention-heads: 4\n  --mamba-num-heads: 16\n  --mamba-head-dim: 16\n"
    "  --mamba-num-groups: 2\n  --mamba-state-dim: 16\n  --num-experts: 4\n"
    "  --moe-router-topk: 2\n  --moe-ffn-hidden-size: 32\n  --fp8-format: e4m3\n"
    "  --fp8-recipe: tensorwise\n  --untie-embeddings-and-output-weights: true\n",
    "#!/bin/bash\nPATTERN='M*-ME/*E'\ntorchrun pretrain_hybrid.py --hybrid-layer-pattern "
    "\"$PATTERN\" \\\n  --hidden-size 64 --num-attention-heads 4 --mamba-num-heads 16 \\\n"
    "  --mamba-head-dim 16 --mamba-num-groups 2 --mamba-state-dim 16 --num-experts 4 \\\n"
    "  --moe-router-topk 2 --moe-ffn-hidden-size 32 --fp8-format e4m3 --fp8-recipe tensorwise "
    "\\\n  --untie-embeddings-and-output-weights\n")
T5_THREE_WAYS = (
    "encoder_num_layers: 2\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
    "fp8: e4m3\nfp8_recipe: tensorwise\n",
    "MODEL_ARGS:\n  --encoder-num-layers: 2\n  --decoder-num-layers: 2\n  --hidden-size: 64\n"
    "  --num-attention-heads: 4\n  --fp8-format: e4m3\n  --fp8-recipe: tensorwise\n",
    "#!/bin/bash\ntorchrun pretrain_t5.py --encoder-num-layers 2 --decoder-num-layers 2 \\\n"
    "  --hidden-size 64 --num-attention-heads 4 --fp8-format e4m3 --fp8-recipe tensorwise\n")


@pytest.mark.parametrize("texts, expected_name", [
    (HYBRID_THREE_WAYS, '"decoder.layers.0.mixer.in_proj"'),
    (T5_THREE_WAYS, '"decoder.layers.1.cross_attention.linear_kv"')], ids=["hybrid", "t5"])
def test_hybrid_and_t5_models_three_ways_give_identical_module_rows(write, texts, expected_name):
    rows = []
    for name, text in zip(("model.yaml", "model_config.yaml", "train.sh"), texts):
        report = audit_files(write(name, text), None, FAST)
        rows.append(json.dumps(report.to_dict()["modules"], sort_keys=True))
    assert rows[0] == rows[1] == rows[2]
    assert expected_name in rows[0] and "fp8/tensorwise" in rows[0]


@pytest.mark.parametrize("route", ["train.sh", "model_config.yaml"])
def test_settings_shown_to_change_nothing_are_one_info_note_not_warnings(tmp_path, route):
    """--overlap-grad-reduce, --overlap-param-gather and the inference scripts' generation
    flags are read, shown to change nothing (docs/no-effect-settings.md) and listed once."""
    from hostile_inputs import write_three_ways

    write_three_ways(tmp_path, {}, "--overlap-grad-reduce --overlap-param-gather "
                                   "--use-distributed-optimizer --temperature 1.0 --top_k 1 "
                                   "--num-tokens-to-generate 30 --tp-comm-overlap "
                                   # what validate_args needs for TP comm overlap
                                   "--tensor-model-parallel-size 2 --sequence-parallel",
                     entry="examples/inference/advanced/gpt_static_inference.py")
    report = audit_files(str(tmp_path / route), None, FAST)
    findings = report.to_dict()["findings"]
    warned = [f["message"].split(":")[0] for f in findings if f["rule"] == "QA090"]
    assert warned == ["--tp-comm-overlap"]  # could change a verdict: still a warning
    quiet = [f for f in findings if f["rule"] == "QA091"]
    assert len(quiet) == 1 and quiet[0]["severity"] == "info"
    listed = quiet[0]["message"].split(". ", 1)[0]
    for flag in ("--overlap-grad-reduce", "--overlap-param-gather", "--temperature", "--top_k",
                 "--num-tokens-to-generate"):
        assert flag in listed
    assert "docs/no-effect-settings.md" in quiet[0]["message"]
    assert report.exit_code("warning") == 1  # the --tp-comm-overlap warning
