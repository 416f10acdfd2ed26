"""The guard's start in a process of the launch command (`qaudit guard -- ...`): read the
options the launcher left in the environment and attach to Megatron as it is imported."""

from __future__ import annotations

import json
import os

ENVIRONMENT = "QAUDIT_GUARD"


def start_from_environment() -> None:
    settings = json.loads(os.environ[ENVIRONMENT])
    if settings.get("cpu"):
        from qaudit.guard import cpu

        cpu.arm()
    from qaudit.guard import hooks, session

    options = session.GuardOptions(mode=settings["mode"], steps=settings["steps"],
                                   report=settings.get("report"), numeric=settings["numeric"],
                                   fail_on=settings["fail_on"], results=settings["results"])
    hooks.attach(session.start(options))
