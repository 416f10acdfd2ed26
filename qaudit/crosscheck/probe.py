"""The record of one upstream build's calls: which module each is in upstream's model, and
what it received. Fed by the stand-in TE package (qaudit/runtime/standin/te_package.py,
`probing`) or by TE's own forwards (te_side.py, `observing`)."""

from __future__ import annotations

import torch

from qaudit.model.probe import Recorder


class CallProbe:
    """Names the stand-in modules and records their calls for one upstream build."""

    def __init__(self) -> None:
        self.recorder = Recorder()
        self.names: dict[int, str] = {}  # id(module) -> its name in upstream's model

    def name_of(self, module: torch.nn.Module) -> str | None:
        return self.names.get(id(module))
