"""Writing a functional-test `model_config.yaml` (a MODEL_ARGS map of Megatron flags)."""

from __future__ import annotations

import textwrap


def write_model_args(write_yaml, body: str) -> str:
    """`body`: `--flag: value` lines; returns the path of the written model_config.yaml."""
    return write_yaml("model_config.yaml", "MODEL_ARGS:\n" + textwrap.indent(
        textwrap.dedent(body), "  "))
