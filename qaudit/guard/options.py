"""`qaudit guard`'s options, apart from the session (qaudit/guard/session.py): the launcher
reads them without importing torch, which only the job's processes need."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GuardOptions:
    mode: str = "stop"  # stop | warn
    steps: int = 1  # training steps watched from the first
    report: str | None = None  # JSON report (rank 0)
    numeric: bool = False
    fail_on: str = "error"
    results: str | None = None  # the launcher's private directory (qaudit/guard/launch.py)

    def __post_init__(self) -> None:
        if self.mode not in ("stop", "warn"):
            raise ValueError(f"mode must be stop or warn, not {self.mode!r}")
        if self.steps < 1:
            raise ValueError("steps must be 1 or more")
        if self.fail_on not in ("error", "warning", "info"):
            raise ValueError(f"fail_on must be error, warning or info, not {self.fail_on!r}")
