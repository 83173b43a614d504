"""A seccomp filter that takes the network from a process and all it starts: `socket()` of every
family is refused (EACCES), and so is io_uring, which creates sockets without that call. What
Landlock's TCP rule misses (UDP, MPTCP, raw and netlink sockets) is covered, and so are named unix
sockets, which Landlock cannot hide (the supervisor's control socket, a docker.sock); socketpair(),
which reaches nothing outside (asyncio's self-pipe), stays. Used by the Landlock launcher
(agents/confine.py) for a command without the `network` capability.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_X32 = 0x40000000  # x86_64's x32 calls: the same numbers with this bit, refused whole
IO_URING_SETUP = 425
# machine -> (AUDIT_ARCH_*, the number of socket())
ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Filter))]


def program(arch: int, socket_nr: int) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) rows (pure): a call of another architecture (i386's int 0x80
    on x86_64) or an x32 call is refused whole; socket() and io_uring_setup refused; everything else
    allowed."""
    deny = (_RET, 0, 0, _ERRNO | errno.EACCES)
    return [
        (_LD_ABS, 0, 0, 4),                  # 0: arch
        (_JEQ, 0, 5, arch),                  # 1: another architecture -> 7
        (_LD_ABS, 0, 0, 0),                  # 2: the call's number
        (_JGE, 3, 0, _X32),                  # 3: x32 -> 7
        (_JEQ, 2, 0, socket_nr),             # 4: socket() -> 7
        (_JEQ, 1, 0, IO_URING_SETUP),        # 5: io_uring -> 7
        (_RET, 0, 0, _ALLOW),                # 6
        deny,                                # 7
    ]


def no_network() -> str:
    """Install the filter on this process; "seccomp", or why not."""
    arch = ARCHES.get(platform.machine())
    if arch is None:
        return f"no seccomp filter for {platform.machine()}"
    rows = program(*arch)
    filters = (_Filter * len(rows))(*[_Filter(*row) for row in rows])
    prog = _Program(len(rows), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER,
                                                                   ctypes.byref(prog), 0, 0):
        return f"no seccomp: {os.strerror(ctypes.get_errno())}"
    return "seccomp"
