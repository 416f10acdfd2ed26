"""What the model's modules share during one audit run: runtime, policy, recorder."""

from __future__ import annotations

from dataclasses import dataclass, field

from qaudit.plan.policies import TrackingPolicy
from qaudit.model.probe import Recorder
from qaudit.runtime.protocol import Runtime
from qaudit.plan.upstream.te import NEWEST_TE, TEBehaviour, te_behaviour


@dataclass
class Session:
    runtime: Runtime
    policy: TrackingPolicy
    recorder: Recorder = field(default_factory=Recorder)
    # The Transformer Engine behaviour audited for (qaudit/plan/upstream/te.py).
    te: TEBehaviour = field(default_factory=lambda: te_behaviour(NEWEST_TE))
    # Whether anything reads the run's tensor values (--verify on the reference runtime, and
    # every other runtime): without, weights hold no values (qaudit/runtime/value_free.py).
    values_read: bool = True
    # Identical sequential experts of a layer run once, the others inferred from it
    # (docs/observed-once.md): only where no value is read.
    observe_once: bool = False
