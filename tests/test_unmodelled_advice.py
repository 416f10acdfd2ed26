"""QA090's advice per unmodelled setting; settings shown to change nothing are QA091 (issue 39,
item 2)."""

from __future__ import annotations

from pathlib import Path

from qaudit.commands.check import audit_files
from qaudit.judge import unmodelled_advice
from qaudit.load.unmodelled import UNMODELLED
from qaudit.render import render
from qaudit.run.options import AuditOptions

REPO = Path(__file__).resolve().parents[1]
FAST = AuditOptions(steps=1, microbatches=1)
BASE = "num_layers: 2\nhidden_size: 128\nnum_attention_heads: 4\n"


def test_every_unmodelled_setting_has_its_own_advice():
    missing = sorted(set(UNMODELLED) - set(unmodelled_advice.ADVICE))
    assert missing == []


def test_one_setting_one_name_whatever_the_route():
    for key in ("--tp-comm-overlap", "model.tp_comm_overlap", "tp_comm_overlap"):
        assert unmodelled_advice.advice_for(key) is unmodelled_advice.ADVICE["tp_comm_overlap"]


def test_qa090_fix_says_what_is_unseen_how_to_check_and_whether_it_matters(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(BASE + "tp_comm_overlap: true\ntensor_model_parallel_size: 2\n")
    report = audit_files(str(config), None, FAST)
    [finding] = [f for f in report.findings if f.rule == "QA090"]
    assert finding.fix.startswith("qaudit cannot see TE's userbuffer overlap")
    assert "qaudit guard -- LAUNCH_COMMAND" in finding.fix
    assert "can it change this verdict: not through is_first_microbatch" in finding.fix
    assert "check the audit's result by hand" not in finding.fix


def test_a_setting_shown_to_change_nothing_is_info_not_a_warning():
    report = audit_files(str(REPO / "configs" / "bridge-lightning-mtp-bf16.yaml"), None, FAST)
    assert not [f for f in report.findings if f.rule == "QA090"]
    [note] = [f for f in report.findings if f.rule == "QA091"]
    assert note.severity == "info" and "keep_mtp_spec_in_bf16" in note.message
    assert report.exit_code("warning") == report.exit_code("error")  # no warning left


def test_the_verdict_wraps_a_long_setting_line_instead_of_cutting_it(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(BASE + "use_transformer_engine_op_fuser: true\n")
    report = audit_files(str(config), None, FAST)
    text = render(report, report.exit_code(), "table", width=80)
    verdict = text.split("\nmodule ")[0]
    assert "~" not in verdict
    joined = " ".join(line.strip() for line in verdict.splitlines())
    assert "or overwrite it where the parameter has overwrite_main_grad (Megatron-FSDP), and "\
        "ignore per-module recipes; not modelled" in joined


def test_the_op_fuser_note_says_megatron_fsdp_overwrites_and_names_qa051(tmp_path):
    """TE's op fuser adds into main_grad only without overwrite_main_grad (ops/_common.py
    get_accumulate_flag_in_param); under Megatron-FSDP it overwrites, and TE 2.14's fused
    grouped MLP did not write main_grad at all there: "always accumulate" was wrong."""
    config = tmp_path / "c.yaml"
    config.write_text(BASE + "use_transformer_engine_op_fuser: true\n")
    report = audit_files(str(config), None, FAST)
    [note] = [f for f in report.findings if f.rule == "QA090"
              and "use_transformer_engine_op_fuser" in f.message]
    assert "always accumulate" not in note.message + note.fix
    assert "overwrite_main_grad (Megatron-FSDP)" in note.message
    assert "QA051" in note.fix and "2.14.1" in note.fix
