"""Environment variables set for the length of one call into upstream code, then put back as
they were (absent ones removed): upstream reads some switches from the environment at the
moment it decides, and the process's own values must survive."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def temporarily_set(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
