"""The fenced worker as an OS boundary where the OS offers one (docs/security.md).

The worker is a fork of qaudit with the same user, so by default the kernel lets it
`PTRACE_ATTACH` qaudit, open `/proc/<qaudit>/fd/1` and signal it. On Linux:

- qaudit's side (`parent_fenced`): while any worker runs, qaudit's process is not dumpable
  (PR_SET_DUMPABLE 0). The kernel then refuses ptrace and `/proc/<pid>/fd`, `mem`, `environ`
  to any process of the same user that lacks CAP_SYS_PTRACE. The previous setting is
  restored when the last worker and its group are gone.
- the worker's side (`fence_worker`, first thing after the fork): its own session (signals to
  its group never reach qaudit, and it has no controlling terminal); every inherited
  descriptor but its channel pointed at /dev/null (numbers kept, so an inherited file object
  can never close a descriptor the worker opens later); no new privileges; every capability
  dropped (the bounding and ambient sets too, so root's CAP_SYS_PTRACE, CAP_KILL and
  CAP_DAC_OVERRIDE are gone and an exec cannot bring them back); and a seccomp filter that
  refuses with EPERM: ptrace, process_vm_readv/writev, pidfd_getfd, pidfd_send_signal,
  tkill, the terminal-injection ioctl TIOCSTI, other ABIs' system calls, and any signal
  (kill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo) to qaudit, to qaudit's process group,
  or to every process (-1).

Upstream code legitimately starts and manages processes of its own (torch's compile runs
ninja, which puts each job in its own process group and signals it; subprocess timeouts kill
their child), so the worker's own children may still be signalled and may leave its group
(setsid, setpgid): such a grandchild outlives a timed-out worker's group kill, which
docs/security.md says.

Each step is best effort: where the kernel refuses one (no seccomp, an unknown architecture,
not Linux), the others still hold; docs/security.md says what holds where.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import struct
import sys
import threading

_LINUX = sys.platform.startswith("linux")
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
TIOCSTI = 0x5412

# Per architecture: the audit arch seccomp sees, and the system call numbers the filter names.
_ARCHES = {
    "x86_64": dict(arch=0xC000003E, x32=True, ptrace=101, process_vm_readv=310,
                   process_vm_writev=311, pidfd_getfd=438, pidfd_send_signal=424, tkill=200,
                   ioctl=16, kill=62, rt_sigqueueinfo=129,
                   tgkill=234, rt_tgsigqueueinfo=297),
    "aarch64": dict(arch=0xC00000B7, x32=False, ptrace=117, process_vm_readv=270,
                    process_vm_writev=271, pidfd_getfd=438, pidfd_send_signal=424, tkill=130,
                    ioctl=29, kill=129, rt_sigqueueinfo=138,
                    tgkill=131, rt_tgsigqueueinfo=240),
}
_DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
           "pidfd_send_signal", "tkill")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _prctl(*arguments: int) -> int:
    libc = _libc()
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    return libc.prctl(*arguments, *([0] * (5 - len(arguments))))


# ------------------------------------------------------------------------------ qaudit's side

_lock = threading.Lock()
_holders = 0
_saved: int | None = None


def parent_fenced() -> None:
    """Before a fork: qaudit not dumpable until the matching `parent_unfenced`."""
    global _holders, _saved
    if not _LINUX:
        return
    with _lock:
        _holders += 1
        if _holders > 1:
            return
        with contextlib.suppress(Exception):
            previous = _prctl(PR_GET_DUMPABLE)
            if previous >= 0 and _prctl(PR_SET_DUMPABLE, 0) == 0:
                _saved = previous


def parent_unfenced() -> None:
    """After a worker and everything in its group are gone."""
    global _holders, _saved
    if not _LINUX:
        return
    with _lock:
        _holders = max(0, _holders - 1)
        if _holders or _saved is None:
            return
        with contextlib.suppress(Exception):
            _prctl(PR_SET_DUMPABLE, _saved)
        _saved = None


def dumpable() -> bool | None:
    """This process's dumpable flag (None where it cannot be read)."""
    if not _LINUX:
        return None
    with contextlib.suppress(Exception):
        return _prctl(PR_GET_DUMPABLE) == 1
    return None


# ------------------------------------------------------------------------------ the worker's side


def fence_worker(keep: set[int]) -> list[str]:
    """In the forked worker, before anything of upstream runs. Returns the steps the kernel
    refused (for tests and debugging; each is best effort)."""
    refused = []
    with contextlib.suppress(OSError):
        os.setsid()
    _null_inherited(keep)
    if not _LINUX:
        return ["not Linux: no capabilities or seccomp"]
    for name, step in (("no_new_privs", _no_new_privs), ("capabilities", _drop_capabilities),
                       ("seccomp", _seccomp)):
        try:
            if not step():
                refused.append(name)
        except Exception:  # noqa: BLE001 - best effort: the other steps still hold
            refused.append(name)
    return refused


def _null_inherited(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            if fd in keep or fd == null or fd < 3:
                continue
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _no_new_privs() -> bool:
    return _prctl(PR_SET_NO_NEW_PRIVS, 1) == 0


def _drop_capabilities() -> bool:
    for cap in range(64):  # the bounding set first: dropping it needs CAP_SETPCAP
        if _prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two {effective, permitted, inheritable}: all empty
    header_buf = ctypes.create_string_buffer(header, len(header))
    data_buf = ctypes.create_string_buffer(data, len(data))
    return _libc().capset(header_buf, data_buf) == 0


def _seccomp() -> bool:
    numbers = _ARCHES.get(platform.machine())
    if numbers is None:
        return False
    parent = os.getppid()
    program = _filter(numbers, parent, os.getpgid(parent))
    buffer = ctypes.create_string_buffer(b"".join(program), len(program) * 8)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program), ctypes.addressof(buffer))
    libc = _libc()
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _DENY = 0x7FFF0000, 0x00050000 | errno.EPERM
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (low words)


def _filter(numbers: dict, parent: int, parent_group: int) -> list[bytes]:
    """A classic BPF program; jumps are written to the labels "allow" and "deny"."""
    code: list[tuple] = [(_LD_ABS, 0, 0, _ARCH), (_JEQ, 0, "deny", numbers["arch"]),
                         (_LD_ABS, 0, 0, _NR)]
    if numbers["x32"]:
        code.append((_JGE, "deny", 0, 0x40000000))
    for name in _DENIED:
        code.append((_JEQ, "deny", 0, numbers[name]))
    # qaudit, its process group, every process; pids compared as seccomp sees the low word.
    qaudits = {parent, (-parent) & 0xFFFFFFFF, (-parent_group) & 0xFFFFFFFF, 0xFFFFFFFF}

    def first_argument_not_in(values: set[int]) -> list[tuple]:
        checks = [(_LD_ABS, 0, 0, _ARG0)]
        checks += [(_JEQ, "deny", 0, value) for value in sorted(values)]
        return checks + [(_RET, 0, 0, _ALLOW)]

    # Each signalling call jumps over the others' checks to its own block.
    blocks = [("kill", first_argument_not_in(qaudits)),
              ("rt_sigqueueinfo", first_argument_not_in(qaudits)),
              ("tgkill", first_argument_not_in({parent})),
              ("rt_tgsigqueueinfo", first_argument_not_in({parent})),
              ("ioctl", [(_LD_ABS, 0, 0, _ARG1), (_JEQ, "deny", "allow", TIOCSTI)])]
    dispatch_at = len(code)
    code += [None] * len(blocks) + [(_RET, 0, 0, _ALLOW)]
    for index, (name, block) in enumerate(blocks):
        code[dispatch_at + index] = (_JEQ, ("at", len(code)), 0, numbers[name])
        code += block
    labels = {"allow": len(code), "deny": len(code) + 1}
    code += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, _DENY)]
    out = []
    for at, (op, jt, jf, k) in enumerate(code):
        def offset(target):
            if isinstance(target, int):
                return target
            where = target[1] if isinstance(target, tuple) else labels[target]
            return where - at - 1
        out.append(struct.pack("=HBBI", op, offset(jt), offset(jf), k))
    return out
