"""torchrun: one pipeline stage per process, merged report on rank 0, one exit code (issue 6)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch.distributed

from qaudit.run import distributed
from qaudit.run.distributed import World, agreed, world_from_environment
from qaudit.errors import EnvironmentProblem, InputError
from tests.cli_helpers import REPO, run_in_process

needs_gloo = pytest.mark.skipif(not torch.distributed.is_available()
                                or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

# Two stages x two virtual chunks, FP8, a repeated MTP layer on the last stage (QA001),
# MTP's embedding copy on the last stage.
PIPELINED_MTP = """\
num_layers: 8
hidden_size: 128
num_attention_heads: 4
mtp_num_layers: 2
mtp_use_repeated_layer: true
fp8: e4m3
pipeline_model_parallel_size: 2
virtual_pipeline_model_parallel_size: 2
"""

# Four stages, the first and last with one layer each, grouped MoE, tied embeddings (the last
# stage keeps its own output weight) and MTP, whose embedding copy sums gradients with stage 0.
UNEVEN_MOE = """\
num_layers: 6
hidden_size: 128
num_attention_heads: 4
num_moe_experts: 4
moe_router_topk: 2
moe_grouped_gemm: true
mtp_num_layers: 1
fp8: e4m3
fp8_recipe: mxfp8
share_embeddings_and_output_weights: true
pipeline_model_parallel_size: 4
num_layers_in_first_pipeline_stage: 1
num_layers_in_last_pipeline_stage: 1
"""


def torchrun(processes: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", "-m", "qaudit", "check", *args,
                           "--runtime", "reference"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def one_process_then_torchrun(monkeypatch, capsys, config: str, processes: int
                              ) -> tuple[int, str, subprocess.CompletedProcess]:
    """The JSON audit of `config` in this process (exit code, stdout), then under torchrun."""
    code, out, _ = run_in_process(monkeypatch, capsys, "check", config, "--format", "json",
                                  "--runtime", "reference")
    return code, out, torchrun(processes, config, "--format", "json")


def worker_exit_codes(stderr: str) -> list[int]:
    """Each failed worker's code, from torchrun's failure summary."""
    return [int(code) for code in re.findall(r"^\s*exitcode\s+:\s*(-?\d+)", stderr, re.M)]


@pytest.mark.parametrize("env, expected", [({}, None), ({"WORLD_SIZE": "1", "RANK": "0"}, None),
                                           ({"WORLD_SIZE": "4", "RANK": "3"}, World(3, 4))])
def test_world_comes_from_torchruns_variables(monkeypatch, env, expected):
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert world_from_environment() == expected


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "two", "RANK": "0"}, {"WORLD_SIZE": "2"},
                                 {"WORLD_SIZE": "2", "RANK": "2"}])
def test_inconsistent_torchrun_variables_are_environment_problems(monkeypatch, env):
    monkeypatch.delenv("RANK", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(EnvironmentProblem):
        world_from_environment()


def _gathered(monkeypatch, outcomes):
    monkeypatch.setattr(distributed, "all_gather", lambda own: outcomes)


def test_agreed_phase_returns_its_value_when_every_rank_succeeds(monkeypatch):
    _gathered(monkeypatch, [None, None])
    assert agreed(World(1, 2), lambda: "built") == "built"


def test_a_failure_on_another_rank_fails_this_one_too(monkeypatch):
    _gathered(monkeypatch, [None, ("InputError", "cfg.yaml:3: bad")])
    with pytest.raises(InputError, match=r"^rank 1: cfg.yaml:3: bad$"):
        agreed(World(0, 2), lambda: "built")


def test_the_lowest_failing_rank_wins_and_keeps_its_own_error(monkeypatch):
    own = InputError("bad value", file="cfg.yaml", line=3, key="hidden_size")

    def fail():
        raise own

    _gathered(monkeypatch, [("InputError", str(own)), ("EnvironmentProblem", "no CUDA")])
    with pytest.raises(InputError) as raised:
        agreed(World(0, 2), fail)
    assert raised.value is own
    _gathered(monkeypatch, [None, ("EnvironmentProblem", "no CUDA")])
    with pytest.raises(EnvironmentProblem, match="rank 1: no CUDA"):
        agreed(World(0, 2), lambda: None)


def test_verify_is_refused_under_torchrun_before_any_work(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(distributed, "join", lambda world: None)
    exits = []
    monkeypatch.setattr(distributed, "exit_together", lambda code: exits.append(code))
    code, out, err = run_in_process(monkeypatch, capsys, "check", "configs/gpt-small-bf16.yaml",
                                    "--verify")
    assert (code, exits) == (2, [2])
    assert out == err == ""  # rank 1 says nothing; rank 0 prints the message


@needs_gloo
@pytest.mark.slow  # real torchrun processes
def test_each_stage_in_its_own_process_gives_the_single_process_report(
        write_yaml, monkeypatch, capsys):
    single_code, single_out, result = one_process_then_torchrun(
        monkeypatch, capsys, write_yaml("pp2.yaml", PIPELINED_MTP), 2)
    assert single_code == 1 and '"QA001"' in single_out
    assert result.stdout == single_out  # rank 0 alone prints, byte for byte the same report
    assert result.returncode != 0
    assert worker_exit_codes(result.stderr) == [1, 1]


@needs_gloo
@pytest.mark.slow  # real torchrun processes
def test_uneven_stages_with_moe_tied_weights_and_mtp_over_four_processes(
        write_yaml, monkeypatch, capsys):
    single_code, single_out, result = one_process_then_torchrun(
        monkeypatch, capsys, write_yaml("pp4.yaml", UNEVEN_MOE), 4)
    assert (single_code, result.returncode) == (0, 0)
    assert result.stdout == single_out
    assert '"stage3/mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1"' in single_out


@needs_gloo
@pytest.mark.slow  # real torchrun processes
def test_a_process_count_that_is_not_the_stage_count_fails_every_rank_with_one_message(write_yaml):
    config = write_yaml("pp2.yaml", PIPELINED_MTP)
    result = torchrun(3, config)
    assert result.stdout == ""
    messages = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert messages == [f"error: {config}:7: key 'pipeline_model_parallel_size': torchrun "
                        "started 3 processes but the model has 2 pipeline stage(s) "
                        "(pipeline_model_parallel_size): qaudit runs one stage per process, "
                        "so start it with --nproc-per-node 2"]
    assert worker_exit_codes(result.stderr) == [2, 2, 2]


def test_full_size_counts_every_process_on_the_machine(write_yaml, monkeypatch):
    """Each torchrun process builds the whole model before keeping its stage."""
    from qaudit.run.audit import check_full_size_fits
    from qaudit.commands.check import load_inputs
    from qaudit.plan.sizes import FULL_SIZE_BYTES_PER_PARAM, model_params

    config, _ = load_inputs(write_yaml("pp2.yaml", PIPELINED_MTP))
    one_build = model_params(config) * FULL_SIZE_BYTES_PER_PARAM
    monkeypatch.setattr("qaudit.run.audit.available_memory_bytes", lambda: int(one_build * 1.5))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    check_full_size_fits(config, processes_here=distributed.processes_on_this_machine(None))
    with pytest.raises(InputError, match="for 2 processes"):
        check_full_size_fits(config, processes_here=distributed.processes_on_this_machine(World(0, 2)))
