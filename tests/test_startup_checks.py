"""The installed Megatron's own start-up checks in the plain audit (qaudit/crosscheck/startup.py):
megatron-core 0.19.2 (QAUDIT_TEST_MEGATRON_CORE) on sys.path, as a user's install."""

from __future__ import annotations

import json

import pytest

from tests.test_hostile_round2 import cli, one_error_line

pytestmark = pytest.mark.usefixtures("forget_megatron")

GPT = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nbf16: true\n"
# TransformerConfig.__post_init__ refuses DeepEP without the flex dispatcher (0.19.2's
# transformer_config.py); qaudit's own table of refusals does not hold this one.
DEEPEP = GPT + ("num_moe_experts: 4\nmoe_router_topk: 2\nmoe_enable_deepep: true\n"
                "moe_token_dispatcher_type: alltoall\n")
# validate_args: --fp8-param-gather needs a distributed optimizer outside inference mode.
SCRIPT = ("#!/bin/bash\ntorchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 \\\n"
          "  --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \\\n"
          "  --micro-batch-size 1 --bf16 --fp8-format hybrid \\\n  --fp8-param-gather\n")


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_an_accepted_config_says_so(megatron, tmp_path):
    code, out, err = cli("check", _write(tmp_path, "gpt.yaml", GPT), "-f", "json")
    assert code in (0, 1), err
    assert json.loads(out)["megatron"]["startup_checks"] == "accepted"


def test_a_config_upstream_refuses_is_exit_2_with_its_words(megatron, tmp_path):
    path = _write(tmp_path, "deepep.yaml", DEEPEP)
    one_error_line(cli("check", path), "refuses this config at start-up",
                   "DeepEP backend is only supported with flex token dispatcher")
    code, out, err = cli("check", path, "--no-startup-checks", "-f", "json")
    assert code in (0, 1) and "startup_checks" not in json.loads(out)["megatron"], err


def test_a_launch_script_upstream_refuses_names_the_flags_line(megatron, tmp_path):
    path = _write(tmp_path, "train.sh", SCRIPT)
    err = one_error_line(cli("check", path), "validate_args", "--fp8-param-gather only supported")
    assert err.startswith(f"error: {path}:5: ")


def test_the_cross_check_keeps_its_own_start_up(megatron, tmp_path):
    """--cross-check runs upstream's start-up itself and reports a refusal as QA030."""
    code, out, _ = cli("check", _write(tmp_path, "deepep.yaml", DEEPEP), "--cross-check",
                       "--steps", "1", "--microbatches", "1", "-f", "json")
    report = json.loads(out)
    assert code == 1 and "startup_checks" not in report["megatron"]
    assert any(f["rule"] == "QA030" and "DeepEP" in f["message"] for f in report["findings"])


# What qaudit reads of a Megatron to know its behaviour (qaudit/plan/upstream/detect.py).
READ_FILES = ("megatron/core/package_info.py", "megatron/core/transformer/module.py",
              "megatron/core/extensions/transformer_engine.py",
              "megatron/core/transformer/transformer_config.py",
              "megatron/core/model_parallel_config.py")


def _checkout(tmp_path, megatron, init: str) -> str:
    """A Megatron-LM checkout (no installed distribution: 0.19.2's files qaudit reads, copied)
    whose import does `init`."""
    root = tmp_path / "checkout"
    for name in READ_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes((megatron / name).read_bytes())
    (root / "megatron" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "__init__.py").write_text(init)
    return str(root)


def test_a_checkout_is_imported_only_when_asked(megatron, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    monkeypatch.syspath_prepend(_checkout(tmp_path, megatron,
                                          f"open({str(marker)!r}, 'w').close()\n"))
    config = _write(tmp_path, "gpt.yaml", GPT)
    code, out, err = cli("check", config, "-f", "json")
    assert code in (0, 1), err
    assert json.loads(out)["megatron"]["startup_checks"].startswith(
        "not run: a Megatron outside the interpreter's site-packages (a checkout or a tree "
        "on PYTHONPATH) is imported only with --startup-checks")
    assert not marker.exists()
    code, out, err = cli("check", config, "--startup-checks", "-f", "json")
    assert marker.exists()  # asked for: imported, in the fenced worker
    # This checkout is no Megatron (nothing to validate with): said, and the audit goes on.
    assert code in (0, 1), err
    assert json.loads(out)["megatron"]["startup_checks"].startswith("not run: ")


def test_a_megatron_that_fails_to_import_never_decides_the_exit_code(megatron, tmp_path,
                                                                     monkeypatch):
    monkeypatch.syspath_prepend(_checkout(tmp_path, megatron, "import os\nos._exit(0)\n"))
    code, out, err = cli("check", _write(tmp_path, "gpt.yaml", GPT), "--startup-checks",
                         "-f", "json")
    assert code in (0, 1), err
    assert json.loads(out)["megatron"]["startup_checks"].startswith("not run: ")
