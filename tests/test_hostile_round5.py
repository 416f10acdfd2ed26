"""Round five (issue 44): imports only from where the user said, the fence as an OS boundary,
bounded channel, recipe reader and start-up worker, override grammar, usage errors."""

from __future__ import annotations

import json
import os

import pytest

from tests.test_hostile_round2 import cli

GPT = "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nbf16: true\n"


def _config(tmp_path) -> str:
    path = tmp_path / "gpt.yaml"
    path.write_text(GPT)
    return str(path)


def _marker_code(marker) -> str:
    return f"open({str(marker)!r}, 'a').write('imported\\n')\n"


def _on_pythonpath(monkeypatch, *folders) -> None:
    """As `PYTHONPATH=a:b qaudit ...` would: the folders first on sys.path, and named by the
    variable."""
    for folder in reversed(folders):
        monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str(f) for f in folders))


def _startup(tmp_path, *flags: str) -> str:
    code, out, err = cli("check", _config(tmp_path), "-f", "json", *flags)
    assert code in (0, 1), err
    return json.loads(out)["megatron"]["startup_checks"]


# --- item 2: a dist-info beside a tree on PYTHONPATH is no install -------------------------


def test_a_dist_info_beside_a_tree_on_pythonpath_is_not_an_install(megatron, tmp_path,
                                                                    monkeypatch):
    from tests.test_startup_checks import _checkout

    marker = tmp_path / "imported"
    root = _checkout(tmp_path, megatron, _marker_code(marker))
    info = tmp_path / "checkout" / "megatron_core-0.19.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-core\n"
                                   "Version: 0.19.2\n")
    _on_pythonpath(monkeypatch, root)
    status = _startup(tmp_path)
    assert status.startswith("not run: a Megatron outside the interpreter's site-packages"), \
        status
    assert not marker.exists()


# --- item 3: nothing on PYTHONPATH shadows the installed Megatron without a flag -----------


def _shadows(tmp_path, marker) -> dict[str, object]:
    """Planted trees that would run before the installed megatron-core's own modules."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "megatron.py").write_text(_marker_code(marker))
    namespace = tmp_path / "namespace"
    (namespace / "megatron").mkdir(parents=True)
    (namespace / "megatron" / "core.py").write_text(_marker_code(marker))
    einops = tmp_path / "einops-tree"
    (einops / "einops").mkdir(parents=True)
    (einops / "einops" / "__init__.py").write_text(_marker_code(marker))
    return {"megatron.py": plain, "namespace megatron/core.py": namespace, "einops/": einops}


@pytest.mark.parametrize("shadow", ["megatron.py", "namespace megatron/core.py", "einops/"])
def test_a_shadowing_module_on_pythonpath_is_never_imported(megatron, tmp_path, monkeypatch,
                                                            shadow):
    marker = tmp_path / "imported"
    _on_pythonpath(monkeypatch, _shadows(tmp_path, marker)[shadow])
    status = _startup(tmp_path)
    assert not marker.exists(), f"{shadow} was imported: {marker.read_text()!r}"
    assert status == "accepted", status  # the installed package, from site-packages


def test_with_the_flag_the_report_credits_what_was_imported(megatron, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    _on_pythonpath(monkeypatch, _shadows(tmp_path, marker)["namespace megatron/core.py"])
    status = _startup(tmp_path, "--startup-checks")
    assert marker.exists()  # asked for: PYTHONPATH is the user's path
    assert status.startswith("not run: ") and "megatron.core was imported from" in status \
        and str(tmp_path / "namespace") in status, status


def test_the_worker_path_keeps_the_interpreters_own_entries(tmp_path):
    import sysconfig

    from qaudit.crosscheck.import_path import installed_only

    planted, stdlib = str(tmp_path), sysconfig.get_paths()["stdlib"]
    site = sysconfig.get_paths()["purelib"]
    # A PYTHONPATH entry that is site-packages itself stays: it is the interpreter's.
    kept = installed_only(["", planted, stdlib, site], {"PYTHONPATH": f"{planted}:{site}"})
    assert kept == [stdlib, site]
