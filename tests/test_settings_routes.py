"""One table of unmodelled settings, the same answer on every input route (qaudit/load/unmodelled.py).

A TransformerConfig YAML and a MODEL_ARGS file (which becomes the same flags a launch script
passes) must warn about the same settings with the same reason, and agree on the TE settings
qaudit models."""

from __future__ import annotations

from pathlib import Path

import pytest

from qaudit.commands.check import load_inputs
from qaudit.load.config import ACCEPTED_FIELDS, MODELLED_FIELDS
from qaudit.load.sources import megatron_flags as flags
from qaudit.load.sources.upstream_flags import UPSTREAM_FLAGS
from qaudit.load.unmodelled import UNMODELLED, field_of_dest

BASE_FIELDS = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
BASE_FLAGS = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4}
YAML_FIELDS = MODELLED_FIELDS | ACCEPTED_FIELDS


def _sample(kind: str):
    """A value that turns a setting of this argparse kind on (switches: their stored value)."""
    if kind == "T":
        return True
    if kind == "F":
        return False
    value = {"i": 2, "f": 2.0}.get(kind[-1:], "full_iteration")
    return [value] if kind[:1] in ("+", "*") else value


def _yaml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return str(value)


def _reasons(config) -> list[str]:
    """The QA090 reasons, without the part naming the setting as written."""
    return [note.message.split(": ", 1)[1] for note in config.source.notes]


def _load(path: Path):
    return load_inputs(str(path))[0]


def _load_or_refusal(path: Path):
    """(config, None), or (None, the refusal's message) for an exit-2 input."""
    from qaudit.errors import InputError

    try:
        return _load(path), None
    except InputError as exc:
        return None, exc.message


def _write_yaml(tmp_path: Path, name: str, value) -> Path:
    path = tmp_path / "config.yaml"
    lines = [f"{k}: {v}" for k, v in BASE_FIELDS.items()] + [f"{name}: {_yaml_value(value)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_model_args(tmp_path: Path, flag: str, kind: str, value) -> Path:
    path = tmp_path / "model_config.yaml"
    lines = [f"  {k}: {v}" for k, v in BASE_FLAGS.items()]
    if kind in ("T", "F"):
        lines.append(f"  {flag}: true")  # a switch: the bare flag
    elif isinstance(value, list):
        lines.append(f"  {flag}: \"[{' '.join(str(v) for v in value)}]\"")
    else:
        lines.append(f"  {flag}: {value}")
    path.write_text("MODEL_ARGS:\n" + "\n".join(lines) + "\n")
    return path


def _flags_of_accepted_fields() -> list[tuple[str, str, str]]:
    """(flag, field, kind) for every Megatron flag that sets a field the YAML route accepts
    without modelling it, or one of the unmodelled table."""
    out = []
    for flag, (dest, kind) in sorted(UPSTREAM_FLAGS.items()):
        name = field_of_dest(dest)
        if name in ACCEPTED_FIELDS or (name in UNMODELLED and name in YAML_FIELDS):
            out.append((flag, name, kind))
    return out


def test_no_flag_only_warning_for_a_field_the_yaml_route_accepts():
    """A flag whose field the YAML route accepts warns only through the shared table: any
    flag-only note (megatron_flags.UNMODELLED) would make the routes disagree."""
    offenders = [flag for flag, (dest, _) in UPSTREAM_FLAGS.items()
                 if field_of_dest(dest) in YAML_FIELDS and flags.note_for(flag) is not None]
    assert offenders == []


def test_every_table_entry_is_reachable_from_some_route():
    dests = {field_of_dest(dest) for dest, _ in UPSTREAM_FLAGS.values()}
    assert [name for name in UNMODELLED if name not in YAML_FIELDS and name not in dests] == []


def test_every_known_field_and_flag_gets_the_same_warning_on_both_routes(tmp_path):
    """Walk every flag that sets an accepted field (about 300): the same value given as a YAML
    field and as a MODEL_ARGS flag yields the same QA090 reasons, and the table's entries do
    warn (so the walk cannot pass by warning about nothing)."""
    pairs = _flags_of_accepted_fields()
    assert len(pairs) > 200
    warned, refused = set(), set()
    for flag, name, kind in pairs:
        value = _sample(kind)
        if name == "transformer_impl":
            value = "inference_optimized"  # `local` exits 2 on both routes (tested below)
        yaml_config, yaml_refusal = _load_or_refusal(_write_yaml(tmp_path, name, value))
        flag_config, flag_refusal = _load_or_refusal(
            _write_model_args(tmp_path, flag, kind, value))
        # Upstream's cross-field refusals (qaudit/load/upstream_checks.py: a parallel size of 2
        # without experts, group-limited routing without groups) refuse both routes alike.
        # validate_args runs on a command line only: its start-up refusals
        # (qaudit/load/sources/startup_refusals.py) have no YAML counterpart.
        if yaml_refusal is None and flag_refusal and \
                "Megatron's validate_args refuses it at start-up" in flag_refusal:
            if _reasons(yaml_config):  # e.g. --tp-comm-overlap alone: no sequence parallelism
                warned.add(name)
            continue
        assert yaml_refusal == flag_refusal, (flag, name)
        if yaml_refusal:
            if "upstream refuses this at start-up" in yaml_refusal:
                refused.add(name)  # e.g. deferral at pipeline size 1 (issue 48)
            continue
        assert _reasons(yaml_config) == _reasons(flag_config), (flag, name)
        if _reasons(yaml_config):
            warned.add(name)
            assert yaml_config.source.notes[0].message.startswith(f"{name} ")
            assert flag_config.source.notes[0].message.startswith((f"{flag} ", f"{flag}:"))
    in_table = {name for _, name, _ in pairs if name in UNMODELLED}
    # Predicates that reject the sample value (fp8_wgrad: only False warns; a size of 2 is
    # above one) still warn for their sample; every entry reachable by a flag warned.
    assert in_table - refused <= warned and refused <= {"defer_embedding_wgrad_compute"}
    # is_hybrid_model warns only without a pattern (unmodelled.HYBRID_WITHOUT_PATTERN)
    assert warned <= set(UNMODELLED) | {"is_hybrid_model"}


@pytest.mark.parametrize("value, warns", [(True, False), (False, True)])
def test_predicate_applies_on_both_routes(tmp_path, value, warns):
    """fp8_wgrad warns only when switched off: `fp8_wgrad: true` and no flag say nothing."""
    yaml_config = _load(_write_yaml(tmp_path, "fp8_wgrad", value))
    assert bool(_reasons(yaml_config)) is warns


def test_transformer_impl_local_exits_2_on_both_routes(tmp_path):
    from qaudit.errors import InputError

    with pytest.raises(InputError, match="no TE modules"):
        _load(_write_yaml(tmp_path, "transformer_impl", "local"))
    with pytest.raises(InputError, match="no TE modules"):
        _load(_write_model_args(tmp_path, "--transformer-impl", "1s", "local"))


def test_the_issue_example_warns_on_both_routes(tmp_path):
    """The issue's report: YAML with delay_wgrad_compute and cuda_graph_impl was silent while
    the flags warned. Both are modelled now; the overlap schedule delayed wgrad needs is not,
    and both routes say so with one reason."""
    path = tmp_path / "c.yaml"
    path.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
                    "delay_wgrad_compute: true\noverlap_moe_expert_parallel_comm: true\n"
                    "cuda_graph_impl: transformer_engine\n")
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 4 --delay-wgrad-compute "
                      "--overlap-moe-expert-parallel-comm --cuda-graph-impl transformer_engine\n")
    yaml_config, flag_config = _load(path), _load(script)
    assert _reasons(yaml_config) == _reasons(flag_config) == [UNMODELLED[
        "overlap_moe_expert_parallel_comm"].why]
    for name in ("delay_wgrad_compute", "cuda_graph_impl"):
        assert getattr(yaml_config, name) == getattr(flag_config, name)


MODELLED_PAIRS = [
    ("delay_wgrad_compute: true", "--delay-wgrad-compute: true"),
    ("cuda_graph_impl: local", "--cuda-graph-impl: local"),
    ("enable_cuda_graph: true", "--enable-cuda-graph: true"),
    ("external_cuda_graph: true", "--external-cuda-graph: true"),
    ("cuda_graph_impl: transformer_engine\ncuda_graph_modules: [attn, moe]",
     "--cuda-graph-impl: transformer_engine\n  --cuda-graph-modules: \"[attn moe]\""),
    ("cuda_graph_impl: local\ncuda_graph_scope: mlp",
     "--cuda-graph-impl: local\n  --cuda-graph-scope: \"[mlp]\""),
    ("fp8: e4m3\nfp8_param: true", "--fp8-format: e4m3\n  --fp8-param-gather: true"),
    ("freeze_all_layers: true", "--freeze-all-layers: true"),
]


@pytest.mark.parametrize("yaml_text, flag_text", MODELLED_PAIRS)
def test_modelled_te_settings_mean_the_same_on_both_routes(tmp_path, yaml_text, flag_text):
    path = tmp_path / "c.yaml"
    path.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n" + yaml_text + "\n")
    args = tmp_path / "model_config.yaml"
    args.write_text("MODEL_ARGS:\n  --num-layers: 2\n  --hidden-size: 64\n"
                    "  --num-attention-heads: 4\n  " + flag_text + "\n")
    yaml_config, flag_config = _load(path), _load(args)
    for attr in ("delay_wgrad_compute", "graph_impl", "fp8_param", "freeze_all_layers"):
        assert getattr(yaml_config, attr) == getattr(flag_config, attr), attr
    assert sorted(yaml_config.graph_modules()) == sorted(flag_config.graph_modules())
    assert _reasons(yaml_config) == _reasons(flag_config) == []


@pytest.mark.parametrize("text, key", [
    ("fp8_param: true", "fp8_param"),
    ("enable_cuda_graph: true\ncuda_graph_impl: local", "enable_cuda_graph"),
    ("cuda_graph_modules: [attn, everything]", "cuda_graph_modules"),
])
def test_te_settings_upstream_rejects_exit_2(tmp_path, text, key):
    from qaudit.errors import InputError

    path = tmp_path / "c.yaml"
    path.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n" + text + "\n")
    with pytest.raises(InputError) as info:
        _load(path)
    assert info.value.key == key
