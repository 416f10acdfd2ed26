"""Stage 2, plan: pure decisions about the model to build: precision, widths, pipeline layout, tracking policies, sizes, which Megatron and TE (no torch)."""

from __future__ import annotations

from qaudit.load.config import ModelConfig


def check_plan(config: ModelConfig) -> None:
    """Refuse (InputError) a config whose plan Megatron would reject: today, a pipeline split."""
    from qaudit.plan.pipeline import pipeline_layout

    pipeline_layout(config)
