"""Python's cyclic garbage collector and a large model. Building a model with sequential
experts creates hundreds of thousands of objects that live as long as the audit; every
collection of the oldest generation walks all of them, and the collector runs again and again
while they are being made: 1.7 s of Kimi-K2's 5.9 s audit, for no garbage (turning the
collector off changed its peak memory by 3 %).

So the collector pauses while the model is built, and the built objects are then frozen
(`gc.freeze()`: moved where collections do not look) for the rest of the audit (the run, the
rules, the report); leaving the outermost audit unfreezes them, so a caller that audits many
models in one process still collects each one's cycles once it is dropped.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside (reference counting still frees what it can)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_depth = 0  # audits in progress: an audit re-audits (--suggest, --compare-policies)


@contextlib.contextmanager
def built_objects_set_aside() -> Iterator[None]:
    """Whatever is frozen inside (the built model, by `_run_audit`) is unfrozen on the way
    out of the outermost such scope: collectable again, in the oldest generation."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()
