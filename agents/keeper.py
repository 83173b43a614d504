"""The agent's keeper: a process sharing the agent's memory and doing nothing, so that a killed agent is
seen dead before its memory is torn down.

A SIGKILLed process is seen dead (its pidfd readable, its parent's SIGCHLD) only after the kernel has
unmapped its memory: 3-10 ms for an agent's 45 MB on a 2-core machine, most of a restart's "detect".
While a second process shares that memory (clone(2) with CLONE_VM) the unmapping waits for the last
of them, so the agent is seen dead in about a tenth of a millisecond; the memory goes when the keeper
goes, after the supervisor has seen the exit and started the replacement: the supervisor kills it with
what its agent left (the agent's cgroup, else its session), and an agent that ends itself kills it
(an exit handler). Only the supervisor's own agents have one (not a delegated child, whose killer,
its parent agent, would leave the keeper running).

The keeper runs no Python and touches none of the agent's memory: glibc's clone() calls
syscall(SYS_pause) on a stack of its own, with every signal blocked (SIGKILL and SIGSTOP cannot be),
so it never returns. Its descriptor table is a copy of the agent's at that moment, so it is made while
only stdin, stdout and stderr are open (else there is none: a copy of the board lock's descriptor, say,
would outlive the agent). `ps` shows it as hermes-keeper, and it counts for no memory of its own
(supervisor/proctable.py and cgroups.py compare processes' memory with kcmp(2)).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal

NAME = b"hermes-keeper"  # its /proc/<pid>/comm; its cmdline and environ are the agent's (the same memory)
OFF_ENV = "HERMES_SUP_NO_KEEPER"  # set to 1: no keeper (the agent's exit then waits for its memory)
_CLONE_VM = 0x100
# pause(2) takes no argument, so a one-argument call of syscall() makes it; Linux has it on x86_64
# only (other machines start no keeper: their restarts wait for the memory as before).
_SYS_PAUSE = {"x86_64": 34}.get(os.uname().machine)
_SYS_KCMP, _KCMP_VM = 312, 1  # x86_64's: the supervisor tells the keeper's memory from the agent's by it
_STACK_BYTES = 16 * 1024  # syscall() and the kernel's entry use a few hundred bytes of it
_PR_SET_NAME, _PR_GET_NAME = 15, 16
_STANDARD = frozenset({0, 1, 2})
_stacks: list[ctypes.Array[ctypes.c_char]] = []  # never freed: a keeper runs on its stack until it dies


def _only_standard_open() -> bool:
    """Whether no descriptor but 0, 1 and 2 is open (the one listing /proc/self/fd is closed again)."""
    try:
        listed = {int(name) for name in os.listdir("/proc/self/fd")}
    except (OSError, ValueError):
        return False
    for fd in listed - _STANDARD:
        try:
            os.fstat(fd)
        except OSError:
            continue  # the listing's own, closed by now
        return False
    return True


def start(environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """Start this process's keeper: its pid, or None where there is none (another machine, $HERMES_SUP_NO_KEEPER,
    a descriptor beyond the standard three open, the kernel refusing)."""
    if _SYS_PAUSE is None or environ.get(OFF_ENV, "") not in ("", "0") or not _only_standard_open():
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    me = os.getpid()
    if libc.syscall(_SYS_KCMP, me, me, _KCMP_VM, 0, 0) != 0:  # without kcmp, its memory would count twice
        return None
    stack = ctypes.create_string_buffer(_STACK_BYTES)
    top = (ctypes.addressof(stack) + _STACK_BYTES - 64) & ~0xF  # the ABI's 16-byte alignment
    syscall = ctypes.cast(libc.syscall, ctypes.c_void_p)
    libc.clone.restype = ctypes.c_int
    libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    name = ctypes.create_string_buffer(16)
    libc.prctl(_PR_GET_NAME, name, 0, 0, 0)
    # The keeper inherits this thread's signal mask and name: all blocked, and its own name.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(NAME), 0, 0, 0)
        pid = libc.clone(syscall, ctypes.c_void_p(top), _CLONE_VM | signal.SIGCHLD, ctypes.c_void_p(_SYS_PAUSE))
    finally:
        libc.prctl(_PR_SET_NAME, name, 0, 0, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pid <= 0:
        return None
    _stacks.append(stack)
    with contextlib.suppress(OSError):  # a pidfd: the keeper's pid is never taken for another process's
        atexit.register(_end, pid, os.pidfd_open(pid), me)
    return pid


def _end(pid: int, pidfd: int, owner: int) -> None:
    """The agent ends itself: its keeper goes first (no supervisor may be there to kill it), reaped so
    that no zombie is left. Not in a process the agent forked, which runs the same exit handlers."""
    if os.getpid() == owner:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.waitpid(pid, 0)  # at once: its memory is still the agent's, so it has none to tear down
