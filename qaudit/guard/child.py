"""The guard's start in a process of the launch command (`qaudit guard -- ...`): read the
options the launcher left in the environment and attach to Megatron as it is imported.
Called by the guard's sitecustomize at the process's first import of `megatron` or
`transformer_engine`, never before (qaudit/guard/site/sitecustomize.py)."""

from __future__ import annotations

import json
import os

ENVIRONMENT = "QAUDIT_GUARD"


def settings() -> dict:
    return json.loads(os.environ[ENVIRONMENT])


def start_from_environment() -> None:
    chosen = settings()
    if chosen.get("cpu"):
        from qaudit.guard import cpu

        # Booted here, not armed: this runs inside the finder of that first import.
        cpu.boot()
    from qaudit.guard import hooks, session

    options = session.GuardOptions(mode=chosen["mode"], steps=chosen["steps"],
                                   report=chosen.get("report"), numeric=chosen["numeric"],
                                   fail_on=chosen["fail_on"], results=chosen["results"])
    hooks.attach(session.start(options))
