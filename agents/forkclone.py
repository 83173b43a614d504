"""The fork server's fast fork: one clone3(2) made as os.fork() is made, whose child is the
supervisor's own (CLONE_PARENT) and born in the agent's cgroup (CLONE_INTO_CGROUP).

Without it an agent takes a middle process (forked, moved into the cgroup, forking the agent, exiting
so the agent is reparented): two forks of a large process and a move between cgroups, which waits for
an RCU grace period (15-40 ms on a 2-core machine) unless the cgroup2 mount has `favordynmods`. A
clone3 into the cgroup takes no such wait. The kernel may refuse it (before Linux 5.7, or a seccomp
profile such as Docker's that answers ENOSYS): then `clone` raises Unsupported and the server goes
back to the middle process.
"""

from __future__ import annotations

import ctypes
import errno
import os

CLONE_PARENT = 0x8000
CLONE_INTO_CGROUP = 0x2_0000_0000
# clone3's number in the generic system call table (since Linux 5.3), which these machines use.
_SYS_CLONE3 = {"x86_64": 435, "aarch64": 435, "i686": 435, "armv7l": 435, "riscv64": 435, "ppc64le": 435,
               "s390x": 435}.get(os.uname().machine)
# What the kernel answers when it does not know clone3 or these flags, or the struct's size (E2BIG).
_REFUSED = frozenset({errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM})


class Unsupported(OSError):
    """The kernel (or a seccomp filter) refuses clone3 or its flags: use the middle process."""


class _CloneArgs(ctypes.Structure):
    """struct clone_args of <linux/sched.h>, every field a 64-bit integer (CLONE_ARGS_SIZE_VER2)."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls",
        "set_tid", "set_tid_size", "cgroup")]


# PyDLL: the GIL stays held across the call, as os.fork holds it (no other thread may run, and the
# child must come back holding it). pythonapi is a PyDLL too.
_syscall = ctypes.PyDLL(None, use_errno=True).syscall
_syscall.restype = ctypes.c_long
_api = ctypes.pythonapi
for _name in ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child"):
    getattr(_api, _name).restype = None
    getattr(_api, _name).argtypes = []


def clone(cgroup: int | None) -> int:
    """Fork this process as os.fork() does (its at-fork hooks, the import lock, the interpreter's state
    reset in the child): 0 in the child, the child's pid in this process. The child's parent is this
    process's parent; `cgroup`, an open cgroup v2 folder, is the cgroup it is born in (None: ours).
    The exit signal is this process's own (SIGCHLD, to our parent): clone3 takes none with CLONE_PARENT."""
    if _SYS_CLONE3 is None:
        raise Unsupported(errno.ENOSYS, f"no clone3 number known for {os.uname().machine}")
    flags = CLONE_PARENT | (CLONE_INTO_CGROUP if cgroup is not None else 0)
    args = _CloneArgs(flags=flags, cgroup=cgroup if cgroup is not None else 0)
    _api.PyOS_BeforeFork()
    pid = _syscall(ctypes.c_long(_SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    if pid == 0:
        _api.PyOS_AfterFork_Child()
        return 0
    error = ctypes.get_errno()
    _api.PyOS_AfterFork_Parent()
    if pid > 0:
        return pid
    if error in _REFUSED:
        raise Unsupported(error, os.strerror(error))
    raise OSError(error, os.strerror(error))
