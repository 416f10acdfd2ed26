"""The stand-in room's one boot entry (qaudit/runtime/standin/boot.py, `enter`) as its users
see it."""

from __future__ import annotations

import sys

import pytest


@pytest.mark.parametrize("user", ["guard", "cross-check"])
def test_a_refused_boot_is_worded_by_the_user_that_asked(monkeypatch, user):
    """The room's one boot refuses in one line that each user words as its own: the guard's
    --cpu said `--cross-check:` while it borrowed the cross-check's boot."""
    from qaudit.crosscheck.build_scope import upstream_environment
    from qaudit.errors import EnvironmentProblem
    from qaudit.guard import cpu
    from qaudit.runtime.standin import side, te_package

    te_cpu = side.TESide("te-cpu", "2.20.2")
    monkeypatch.setattr(side, "decide", lambda: te_cpu)
    monkeypatch.setitem(sys.modules, "transformer_engine",
                        te_package.package().modules["transformer_engine"])
    monkeypatch.setattr(cpu, "_stack", None)
    with pytest.raises(EnvironmentProblem) as refused:
        if user == "guard":
            cpu.boot()
        else:
            with upstream_environment(te_cpu):
                pass
    prefix = "qaudit guard --cpu: " if user == "guard" else "--cross-check: "
    assert str(refused.value) == (prefix + "qaudit's stand-in TE was imported earlier in this "
                                  "process; run qaudit in a fresh process")
    assert cpu._stack is None
