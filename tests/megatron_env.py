"""The installed Megatron for tests: the unpacked megatron-core wheel in
QAUDIT_TEST_MEGATRON_CORE (scripts/fetch-megatron DIR makes one). Locally the tests that need
it skip when the variable is unset; under CI (CI set) they fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def megatron(monkeypatch) -> Path:
    """The unpacked megatron-core on sys.path, as a user's install would be."""
    where = os.environ.get("QAUDIT_TEST_MEGATRON_CORE")
    if not where:
        if os.environ.get("CI"):
            pytest.fail("QAUDIT_TEST_MEGATRON_CORE is not set: CI must unpack megatron-core "
                        "(scripts/fetch-megatron DIR) for the cross-check tests")
        pytest.skip("QAUDIT_TEST_MEGATRON_CORE not set (scripts/fetch-megatron DIR)")
    root = Path(where)
    if not (root / "megatron" / "core" / "__init__.py").is_file():
        pytest.fail(f"QAUDIT_TEST_MEGATRON_CORE={where} holds no megatron/core/")
    monkeypatch.syspath_prepend(str(root))
    # An install in the interpreter's site-packages (qaudit/plan/upstream/site_dirs.py): the
    # unpacked wheel stands for one.
    from qaudit.plan.upstream import site_dirs

    installed = site_dirs.site_dirs() | {os.path.realpath(root)}
    monkeypatch.setattr(site_dirs, "site_dirs", lambda: installed)
    import importlib.util

    if importlib.util.find_spec("numpy") is None:  # megatron-core's run-time dependency
        pytest.fail(f"numpy is not importable beside {root}: megatron-core needs it "
                    "(scripts/fetch-megatron DIR, or pip install --target DIR numpy)")
    return root


@pytest.fixture(scope="module", autouse=False)
def forget_megatron():
    """After a module of cross-check tests: drop the Megatron modules they imported, so that
    later tests see a process where the audit never imported Megatron (it does not, without
    --cross-check). Within the module, imports are reused (seconds per build)."""
    import sys

    before = set(sys.modules)
    yield
    for name in [n for n in sys.modules if n not in before]:
        if name == "megatron" or name.startswith(("megatron.", "transformer_engine",
                                                  "fused_weight_gradient_mlp_cuda")):
            del sys.modules[name]
