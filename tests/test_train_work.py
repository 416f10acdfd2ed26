"""Work the training loop does per audit, counted (never timed: speed is scripts/bench's)."""

from __future__ import annotations

from pathlib import Path

from qaudit.commands.check import audit_config, load_inputs
from qaudit.run import train
from qaudit.run.options import AuditOptions

REPO = Path(__file__).resolve().parent.parent


def test_the_model_is_walked_for_delayed_wgrad_modules_once_per_audit(monkeypatch):
    walks = []
    real = train.delayed_wgrad_modules

    def counted(model):
        walks.append(model)
        return real(model)

    monkeypatch.setattr(train, "delayed_wgrad_modules", counted)
    config, recipe = load_inputs(str(REPO / "configs" / "gpt-small-bf16.yaml"))
    options = AuditOptions()
    report = audit_config(config, recipe, options)
    assert report.modules
    assert options.steps * options.microbatches >= 4
    assert len(walks) == 1  # not once per microbatch


def test_queued_weight_gradients_still_run_after_every_microbatch(monkeypatch):
    """delay_wgrad_compute: each microbatch's queued GEMMs run before the next one starts."""
    runs = []
    real = train.run_backward_dw

    def counted(model, modules=None):
        runs.append(sum(len(m.wgrad_store) for m in modules))
        real(model, modules)
        assert all(len(m.wgrad_store) == 0 for m in modules)

    monkeypatch.setattr(train, "run_backward_dw", counted)
    config, recipe = load_inputs(str(REPO / "configs" / "gpt-small-bf16.yaml"))
    config = type(config)(**{**vars(config), "delay_wgrad_compute": True})
    audit_config(config, recipe, AuditOptions())
    options = AuditOptions()
    assert len(runs) == options.steps * options.microbatches
    assert all(queued > 0 for queued in runs)
