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


# --- items 1 and 8: the fence as an OS boundary ---------------------------------------------

# A planted Megatron that tries everything a same-user fork can do to qaudit, and writes down
# what the kernel answered (a word per line: "attached"/"opened"/"sent" or the errno's name).
HOSTILE_INIT = r'''
import ctypes, errno, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
ppid = os.getppid()
lines = []
def name(code):
    return errno.errorcode.get(code, str(code))
if libc.ptrace(16, ppid, 0, 0) == 0:  # PTRACE_ATTACH
    time.sleep(0.2)
    libc.ptrace(17, ppid, 0, 0)  # PTRACE_DETACH: leave qaudit running
    lines.append("ptrace attached")
else:
    lines.append("ptrace " + name(ctypes.get_errno()))
for fd in (1, 2):
    try:
        out = os.open(f"/proc/{ppid}/fd/{fd}", os.O_WRONLY)
        os.write(out, b'FORGED {"verdict": "clean"}\n')
        lines.append("procfd opened")
    except OSError as exc:
        lines.append("procfd " + name(exc.errno))
for target, number in ((ppid, 0), (ppid, signal.SIGINT), (-os.getpgid(ppid), signal.SIGINT)):
    try:
        os.kill(target, number)
        lines.append("kill sent")
    except OSError as exc:
        lines.append("kill " + name(exc.errno))
for fd in os.listdir("/proc/self/fd"):
    try:
        lines.append("fd " + os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        pass
with open("/proc/self/status") as status:
    lines += [line.strip() for line in status
              if line.startswith(("CapEff", "NoNewPrivs", "Seccomp:"))]
with open(MARKER, "w") as handle:
    handle.write("\n".join(lines) + "\n")
'''


def _ptrace_allowed_here() -> str | None:
    """Why a forked child cannot PTRACE_ATTACH its (dumpable) parent here, or None if it can."""
    import subprocess
    import sys

    probe = ("import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "pid = os.fork()\nif pid == 0:\n"
             "    ok = libc.ptrace(16, os.getppid(), 0, 0) == 0\n"
             "    time.sleep(0.1)\n    ok and libc.ptrace(17, os.getppid(), 0, 0)\n"
             "    os._exit(0 if ok else 1)\n"
             "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    return None if result.stdout.strip() == "0" else "ptrace of a parent is not permitted here"


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="Linux fence")
def test_upstream_code_cannot_touch_qaudits_process(megatron, tmp_path):
    import subprocess
    import sys

    from tests.test_startup_checks import _checkout

    marker = tmp_path / "fence.txt"
    secret = tmp_path / "secret.txt"
    root = _checkout(tmp_path, megatron, f"MARKER = {str(marker)!r}\n" + HOSTILE_INIT)
    config = _config(tmp_path)
    env = {**os.environ, "PYTHONPATH": root}
    with open(secret, "w") as held:  # a descriptor qaudit inherits: never the worker's
        result = subprocess.run(
            [sys.executable, "-m", "qaudit", "check", config, "--startup-checks", "-f", "json"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
            start_new_session=True, pass_fds=(held.fileno(),))
    assert result.returncode in (0, 1), (result.returncode, result.stderr)
    assert "FORGED" not in result.stdout + result.stderr
    json.loads(result.stdout)  # qaudit's own output, whole
    seen = marker.read_text().splitlines()
    assert seen.count("procfd EACCES") + seen.count("procfd EPERM") == 2, seen
    assert [line for line in seen if line.startswith("kill")] == ["kill EPERM"] * 3, seen
    assert not any(str(secret) in line for line in seen), seen
    assert "NoNewPrivs:\t1" in seen and "CapEff:\t0000000000000000" in seen, seen
    assert "Seccomp:\t2" in seen, seen
    why = _ptrace_allowed_here()
    if why is None:
        assert "ptrace EPERM" in seen, seen
    else:
        pytest.skip(f"the rest held; ptrace not checked: {why}")


def test_qaudit_is_dumpable_again_after_the_worker():
    from qaudit.crosscheck import fence, worker

    before = fence.dumpable()
    job = worker.ForkedWorker(fence.dumpable, (), worker.WorkerLimits(timeout_s=60),
                              "test worker")
    assert job.result() is False  # the fork inherits qaudit's fenced state
    assert fence.dumpable() == before


# --- items 9 and 10: the channel decoder and the Bridge recipe reader, bounded -------------


def test_a_result_of_a_million_empty_lists_is_refused_before_it_is_built():
    from qaudit.crosscheck import plain

    payload = b"[" + b"[]," * plain.MAX_CONTAINERS + b"[]]"  # 3 MB, far under the byte cap
    with pytest.raises(plain.NotPlain, match="lists and objects"):
        plain.decode(payload, ())
    elements = b"[" + b"0," * (plain.MAX_ELEMENTS + 1) + b"0]"
    with pytest.raises(plain.NotPlain, match="elements"):
        plain.decode(elements, ())
    assert plain.decode(b"[[], [0, 1], {\"map\": []}]", ()) == [[], [0, 1], {}]


def _recipes_file(fields: int, names: int, derived: bool) -> str:
    lines = ["class MixedPrecisionConfig:"] + [f"    f{i}: int = 0" for i in range(fields)]
    lines += ["def base():", "    return MixedPrecisionConfig()"]
    table = []
    for i in range(names):
        if derived:  # each name its own recipe, derived from base with one field changed
            lines += [f"def r{i}():", "    cfg = base()", "    cfg.f1 = 1", "    return cfg"]
        table.append(f"'n{i}': {f'r{i}' if derived else 'base'}")
    return "\n".join(lines + ["MIXED_PRECISION_RECIPES = {" + ", ".join(table) + "}"]) + "\n"


def test_one_recipe_under_many_names_is_read_once():
    import ast
    import tracemalloc

    from qaudit.plan.upstream.bridge_recipes import evaluate

    tree = ast.parse(_recipes_file(2_000, 1_000, derived=False))
    tracemalloc.start()
    try:
        _, recipes = evaluate(tree, "mixed_precision.py")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(recipes) == 1_000 and recipes["n7"]["f1999"] == 0
    assert peak < 16 << 20, peak  # one 2,000-field recipe, not 1,000 copies (150 MB before)


def test_recipes_writing_past_the_field_budget_are_unreadable():
    import ast

    from qaudit.plan.upstream.bridge_recipes import UnreadableRecipes, evaluate

    with pytest.raises(UnreadableRecipes, match="write more than"):
        evaluate(ast.parse(_recipes_file(2_000, 600, derived=True)), "mixed_precision.py")
    _, recipes = evaluate(ast.parse(_recipes_file(30, 40, derived=True)), "mixed_precision.py")
    assert recipes["n3"]["f1"] == 1 and recipes["n3"]["f2"] == 0


# --- item 15: audit(obj) whose __getattribute__ raises ---------------------------------------


class _RaisesForEverything:
    def __getattribute__(self, name):
        raise RuntimeError(f"no {name}")


class _RaisesForClass(dict):
    def __getattribute__(self, name):
        if name == "__class__":
            raise RuntimeError("no class")
        return dict.__getattribute__(self, name)


@pytest.mark.parametrize("make", [_RaisesForEverything, lambda: _RaisesForClass(num_layers=2)],
                         ids=["every name", "__class__"])
def test_a_raising_getattribute_is_an_input_error(make):
    from qaudit import audit
    from qaudit.errors import InputError

    with pytest.raises(InputError) as caught:
        audit(make(), steps=1, microbatches=1)
    assert "RuntimeError" in caught.value.message


# --- item 11: the start-up worker's memory ---------------------------------------------------


def test_the_start_up_worker_has_a_gigabyte(megatron, tmp_path, monkeypatch):
    """docs/security.md: 1 GiB of address space past what the worker inherits (megatron-core
    0.19.2's start-up needs 520-640 MiB of it); 1.5 GiB is a MemoryError, said as not run."""
    from tests.test_startup_checks import _checkout

    marker = tmp_path / "allocated"
    init = f"held = bytearray(1536 << 20)\nopen({str(marker)!r}, 'w').close()\n"
    _on_pythonpath(monkeypatch, _checkout(tmp_path, megatron, init))
    status = _startup(tmp_path, "--startup-checks")
    assert not marker.exists()
    assert status.startswith("not run: ") and "MemoryError" in status, status


# --- item 16: usage errors are one line --------------------------------------------------------


@pytest.mark.parametrize("argv,words", [
    (["check", "x.yaml", "--steps", "0"], ["'--steps'", "greater than or equal to 1"]),
    (["check", "x.yaml", "--fail-on", "bogus"], ["'--fail-on'", "'bogus'"]),
    (["check", "x.yaml", "--bogus"], ["no such option: --bogus"]),
    (["guard", "--mode", "pause", "--", "true"], ["'--mode'", "'pause'"]),
    (["nosuch"], ["no such command 'nosuch'"]),
], ids=["steps 0", "fail-on bogus", "unknown option", "guard mode pause", "unknown command"])
def test_a_usage_error_is_one_error_line_and_exit_2(argv, words):
    from tests.test_hostile_round2 import one_error_line

    one_error_line(cli(*argv), *words)
