"""The fence of the start-up/cross-check worker (qaudit/crosscheck/fence.py) as a normal user
(issue 44): qaudit run under uid/gid 65534 (`setpriv`, when the tests run as root) or as the
user the tests run as, when that is not root. A planted Megatron tries what a same-user process
can do to qaudit (tests/test_hostile_round5.py's reproducer, plus reading /proc/<ppid>/mem
and environ and process_vm_readv) and writes down the kernel's answers. Measured with the
whole fence, and with one of its two OS layers switched off, to know which layer holds what
(docs/security.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_hostile_round5 import GPT, HOSTILE_INIT
from tests.test_startup_checks import READ_FILES

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux fence")

NOBODY = 65534

# Appended before the reproducer writes its marker: memory and environment of qaudit.
MEMORY = r'''
for what in ("mem", "environ"):
    try:
        with open(f"/proc/{ppid}/{what}", "rb") as f:
            lines.append(what + " opened")
    except OSError as exc:
        lines.append(what + " " + name(exc.errno))
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 8), iovec(ctypes.c_void_p(4096), 8)
ok = libc.process_vm_readv(ppid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) >= 0
lines.append("vmread " + ("read" if ok else name(ctypes.get_errno())))
lines.append(f"uid {os.getuid()}")
'''

# qaudit's own entry point with one layer of the fence switched off (for the measurement).
DRIVER = """
import sys
from qaudit.crosscheck import fence
layer = sys.argv.pop(1)
if layer == "no-seccomp":
    fence._seccomp = lambda: False
elif layer == "dumpable":
    fence.parent_fenced = fence.parent_unfenced = lambda: None
from qaudit.cli import main
sys.argv[0] = "qaudit"
main()
"""


def _as_normal_user() -> tuple[list[str], str | None]:
    """The command prefix that runs as a normal user here, or why there is none."""
    if os.getuid() != 0:
        return [], None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return [], "running as root and setpriv is not installed"
    prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import qaudit, torch"],
                           capture_output=True, text=True, timeout=300, cwd="/")
    if probe.returncode != 0:
        return [], f"uid {NOBODY} cannot run this Python and qaudit: {probe.stderr[-300:]}"
    return prefix, None


@pytest.fixture
def workdir():
    """A directory the normal user owns (pytest's tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="qaudit-fence-user-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _measure(megatron: Path, work: Path, layer: str, signals: str
             ) -> tuple[list[str], str, str]:
    prefix, why = _as_normal_user()
    if why:
        pytest.skip(why)
    root = work / "checkout"
    for name in READ_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes((megatron / name).read_bytes())
    (root / "megatron" / "__init__.py").write_text("")
    marker = work / "fence.txt"
    attempts = HOSTILE_INIT.replace("with open(MARKER", MEMORY + "with open(MARKER")
    if signals == "probe":  # signal 0 only: where a signal would land, without landing it
        attempts = attempts.replace("((ppid, 0), (ppid, signal.SIGINT), "
                                    "(-os.getpgid(ppid), signal.SIGINT))",
                                    "((ppid, 0), (-os.getpgid(ppid), 0))")
        assert "signal.SIGINT" not in attempts
    (root / "megatron" / "core" / "__init__.py").write_text(
        f"MARKER = {str(marker)!r}\n" + attempts)
    (work / "gpt.yaml").write_text(GPT)
    # qaudit's stdout and stderr are files of the user's own, as a terminal or a CI log
    # would be: a pipe this (root) process made would refuse the user's reopening by itself.
    (work / "out.txt").touch()
    (work / "err.txt").touch()
    if os.getuid() == 0:
        for path in [work, *work.rglob("*")]:
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    env = {**os.environ, "PYTHONPATH": str(root), "HOME": str(work)}
    with open(work / "out.txt", "w") as out, open(work / "err.txt", "w") as err:
        done = subprocess.run([*prefix, sys.executable, "-c", DRIVER, layer, "check",
                               str(work / "gpt.yaml"), "--startup-checks", "-f", "json"],
                              stdout=out, stderr=err, env=env, cwd=work, timeout=600,
                              start_new_session=True)
    stdout, stderr = (work / "out.txt").read_text(), (work / "err.txt").read_text()
    seen = marker.read_text().splitlines()
    assert done.returncode in (0, 1), (done.returncode, stderr[-2000:], seen)
    return seen, stdout, stderr


def test_the_whole_fence_holds_for_a_normal_user(megatron, workdir):
    seen, stdout, stderr = _measure(megatron, workdir, "whole", "sigint")
    assert f"uid {os.getuid() or NOBODY}" in seen
    assert "FORGED" not in stdout + stderr
    assert json.loads(stdout)["megatron"]["startup_checks"]  # qaudit's own report, whole
    assert "ptrace EPERM" in seen, seen
    assert seen.count("procfd EACCES") + seen.count("procfd EPERM") == 2, seen
    assert [line for line in seen if line.startswith("kill")] == ["kill EPERM"] * 3, seen
    assert "mem EACCES" in seen and "environ EACCES" in seen, seen
    assert "vmread EPERM" in seen, seen
    assert "NoNewPrivs:\t1" in seen and "CapEff:\t0000000000000000" in seen, seen
    assert "Seccomp:\t2" in seen, seen


def test_without_seccomp_the_non_dumpable_parent_alone_still_refuses_ptrace_and_proc(
        megatron, workdir):
    """Where seccomp is unavailable: ptrace, /proc/<qaudit>/fd, mem, environ and
    process_vm_readv are still refused (qaudit is not dumpable while the worker lives); a
    signal by pid is not (signal 0 only is sent here, so the measurement cannot end qaudit)."""
    seen, stdout, stderr = _measure(megatron, workdir, "no-seccomp", "probe")
    assert "FORGED" not in stdout + stderr
    json.loads(stdout)
    assert "Seccomp:\t0" in seen, seen
    assert "ptrace EPERM" in seen, seen
    assert seen.count("procfd EACCES") + seen.count("procfd EPERM") == 2, seen
    assert "mem EACCES" in seen and "environ EACCES" in seen, seen
    assert "vmread EPERM" in seen, seen
    assert [line for line in seen if line.startswith("kill")] == ["kill sent"] * 2, seen


def _yama() -> int | None:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None


def test_with_a_dumpable_parent_seccomp_alone_refuses_ptrace_signals_and_vm_reads(
        megatron, workdir):
    """The other layer alone: the filter refuses ptrace, process_vm_readv and the signals,
    but opening /proc/<qaudit>/fd/1, mem and environ is a path it does not see: without the
    non-dumpable parent (and without Yama) they open: a forged write would reach qaudit's
    output. This also shows the measurement sees such an open when one happens."""
    seen, _, _ = _measure(megatron, workdir, "dumpable", "probe")
    assert "Seccomp:\t2" in seen, seen
    assert "ptrace EPERM" in seen and "vmread EPERM" in seen, seen
    assert [line for line in seen if line.startswith("kill")] == ["kill EPERM"] * 2, seen
    if _yama() in (None, 0):
        assert seen.count("procfd opened") == 2, seen
        assert "mem opened" in seen and "environ opened" in seen, seen
