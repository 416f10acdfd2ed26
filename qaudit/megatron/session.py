"""What the model's modules share during one audit run: runtime, policy, recorder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qaudit.megatron.policies import TrackingPolicy
from qaudit.probe import Recorder


@dataclass
class Session:
    runtime: Any  # a runtime: module factories, autocast(), current_quant()
    policy: TrackingPolicy
    recorder: Recorder = field(default_factory=Recorder)
