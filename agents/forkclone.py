"""The fork server's fast fork: one clone3(2) made as os.fork() is made, whose child is the
supervisor's own (CLONE_PARENT) and born in the agent's cgroup (CLONE_INTO_CGROUP).

Without it an agent takes a middle process (forked, moved into the cgroup, forking the agent, exiting
so the agent is reparented): two forks of a large process and a move between cgroups, which waits for
an RCU grace period (15-40 ms on a 2-core machine) unless the cgroup2 mount has `favordynmods`. A
clone3 into the cgroup takes no such wait. The kernel may refuse it (before Linux 5.7, or a seccomp
profile such as Docker's that answers ENOSYS), or kill the child at birth (Linux 6.18, in a cgroup
once killed through cgroup.kill): then `clone` raises Unsupported and the server goes back to the
middle process.

glibc's fork() also writes the child's thread id into the thread's descriptor (what pthread_kill,
pthread_setaffinity_np and the like act on); a raw clone3 leaves the server's there, so the kernel
is asked to write it (CLONE_CHILD_SETTID) at the descriptor's field, found once by `probe`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import threading

CLONE_PIDFD = 0x1000
CLONE_PARENT = 0x8000
CLONE_CHILD_SETTID = 0x0100_0000
CLONE_INTO_CGROUP = 0x2_0000_0000
# clone3's number in the generic system call table (since Linux 5.3), which these machines use.
_SYS_CLONE3 = {"x86_64": 435, "aarch64": 435, "i686": 435, "armv7l": 435, "riscv64": 435, "ppc64le": 435,
               "s390x": 435}.get(os.uname().machine)
# What the kernel answers when it does not know clone3 or these flags, or the struct's size (E2BIG).
_REFUSED = frozenset({errno.ENOSYS, errno.EINVAL, errno.E2BIG, errno.EPERM})
_DESCRIPTOR_SPAN = 1024  # bytes of the thread's descriptor searched for its thread id (720 on x86_64 glibc 2.36)
ALIVE_WITHIN = 5.0  # seconds a new child has to say it runs; a bound only, it takes microseconds
DEAD_WITHIN = 5.0  # seconds a SIGKILLed clone has to be gone; a bound only


class Unsupported(OSError):
    """The kernel (or a seccomp filter) refuses clone3 or its flags, or killed the child at birth:
    use the middle process."""


class KilledAtBirth(Unsupported):
    """The kernel killed the clone before it ran (its zombie is our parent's to reap): `pid`."""

    def __init__(self, pid: int) -> None:
        super().__init__(errno.ECHILD, f"the agent cloned as pid {pid} was killed at birth")
        self.pid = pid


class _CloneArgs(ctypes.Structure):
    """struct clone_args of <linux/sched.h>, every field a 64-bit integer (CLONE_ARGS_SIZE_VER2)."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls",
        "set_tid", "set_tid_size", "cgroup")]


# PyDLL: the GIL stays held across the call, as os.fork holds it (no other thread may run, and the
# child must come back holding it). pythonapi is a PyDLL too.
_libc = ctypes.PyDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_pthread_self = _libc.pthread_self
_pthread_self.restype = ctypes.c_void_p
_api = ctypes.pythonapi
for _name in ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child"):
    getattr(_api, _name).restype = None
    getattr(_api, _name).argtypes = []


def _tid_at(offsets: list[int]) -> list[int]:
    base = _pthread_self()
    return [ctypes.c_int.from_address(base + offset).value for offset in offsets]


def probe() -> int | None:
    """`_probe`, None if it fails in any way (the server then forks the slower way, never dies of it)."""
    try:
        return _probe()
    except Exception:
        return None


def _probe() -> int | None:
    """Where glibc keeps this thread's id in its descriptor, as an offset from pthread_self(), or None
    if it cannot be told (then `clone` refuses, and the server forks the slower way). The candidates
    are the ints equal to our thread id; the field is the one a child made by fork() finds its own
    id in. Run once in the single-threaded server, before any clone (the probe forks once)."""
    tid = threading.get_native_id()
    candidates = [offset for offset in range(0, _DESCRIPTOR_SPAN, 4) if _tid_at([offset])[0] == tid]
    if not candidates:
        return None
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # glibc's fork wrote our new id in the field: report which candidates hold it
        try:
            pid = os.getpid()
            os.write(write_end, bytes(int(value == pid) for value in _tid_at(candidates)))
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        found = os.read(read_end, len(candidates) + 1)
    finally:
        os.close(read_end)
        os.waitpid(child, 0)
    hits = [offset for offset, hit in zip(candidates, found, strict=False) if hit]
    return hits[0] if len(hits) == 1 else None


def clone(cgroup: int | None, tid_offset: int | None) -> int:
    """Fork this process as os.fork() does for Python (its at-fork hooks, the import lock, the
    interpreter's state reset in the child) and glibc's thread id: 0 in the child, the child's pid in
    this process, returned once the child runs. Unlike glibc's fork, C-level pthread_atfork handlers
    do not run and robust mutexes are not registered again (the server uses neither). The child's
    parent is this process's parent; `cgroup`, an open cgroup v2 folder, is the cgroup it is born in
    (None: ours). The exit signal is this process's own (SIGCHLD, to our parent): clone3 takes none
    with CLONE_PARENT."""
    if _SYS_CLONE3 is None:
        raise Unsupported(errno.ENOSYS, f"no clone3 number known for {os.uname().machine}")
    if tid_offset is None:
        raise Unsupported(errno.ENOTSUP, "where glibc keeps a thread's id is not known here")
    pidfd = ctypes.c_int(-1)
    flags = CLONE_PARENT | CLONE_PIDFD | CLONE_CHILD_SETTID | (CLONE_INTO_CGROUP if cgroup is not None else 0)
    args = _CloneArgs(flags=flags, pidfd=ctypes.addressof(pidfd), child_tid=_pthread_self() + tid_offset,
                      cgroup=cgroup if cgroup is not None else 0)
    # No signal handler may run between the at-fork calls (a raise there would skip the parent's, or
    # unwind the child into the server's loop): signals wait, blocked, until both sides are done.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    # The child says it runs: one killed at birth never returns to user space, and only its exit
    # closes its end. Nothing in /proc is read (it may hide other processes: hidepid).
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    _api.PyOS_BeforeFork()
    pid = _syscall(ctypes.c_long(_SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    if pid == 0:
        try:  # first, so the server waits for our scheduling only (one thread: nothing to reset for it)
            os.write(write_end, b"1")
            _api.PyOS_AfterFork_Child()
            os.close(read_end)
            os.close(write_end)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        except BaseException:  # never back into the server's loop, as a second server
            os._exit(127)
        return 0
    error = ctypes.get_errno()
    _api.PyOS_AfterFork_Parent()
    os.close(write_end)
    try:
        if pid < 0:
            raise (Unsupported if error in _REFUSED else OSError)(error, os.strerror(error))
        if select.select([read_end], [], [], ALIVE_WITHIN)[0] and os.read(read_end, 1) == b"1":
            return pid
        _make_sure_dead(pid, pidfd.value, read_end)
        raise KilledAtBirth(pid)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read_end)
        if pidfd.value >= 0:
            os.close(pidfd.value)


def _make_sure_dead(pid: int, pidfd: int, read_end: int) -> None:
    """A clone that did not say it runs (killed at birth, or slower than ALIVE_WITHIN) is killed and
    seen gone (its end of the pipe closed) before the server forks a replacement: never two processes
    for one agent. OSError (no fallback: the supervisor then gives the agent up) if that cannot be."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # a no-op on a dead one
    except ProcessLookupError:
        pass
    except OSError as exc:
        raise OSError(exc.errno, f"the agent cloned as pid {pid} did not run and cannot be killed") from None
    while select.select([read_end], [], [], DEAD_WITHIN)[0]:
        if not os.read(read_end, 1):
            return
    raise OSError(errno.ETIMEDOUT, f"the agent cloned as pid {pid} did not die of SIGKILL")
