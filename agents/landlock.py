"""Landlock (linux/landlock.h) through ctypes: a process gives up file and network rights for itself
and everything it starts; used by the skill checks and by the terminal where bubblewrap is missing.

Landlock is an allow-list: every right of a handled kind is refused except beneath the folders a
rule names. Lookups are not controlled (a path may be walked through, not read or written), nor are
connections to named unix sockets; TCP bind and connect from ABI 4, abstract unix sockets and
signals to processes outside the domain from ABI 6.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_AND_MAKE = sum(1 << bit for bit in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
REFER, TRUNCATE = 1 << 13, 1 << 14
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = WRITE_FILE | _REMOVE_AND_MAKE
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class _Ruleset(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def fs_rights(abi: int, *, reads: bool) -> int:
    """The file-system rights handled under ABI `abi` (pure): every write (REFER from 2, TRUNCATE from
    3), and with `reads` every read and execution too."""
    if abi < 1:
        return 0
    return WRITE | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0) | (READ if reads else 0)


def net_rights(abi: int) -> int:
    """TCP bind and connect, handled from ABI 4 (pure)."""
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def scopes(abi: int) -> int:
    """Abstract unix sockets and signals, scoped to the domain from ABI 6 (pure)."""
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def readable_roots(hidden: Sequence[str], listdir: Callable[[str], list[str]], top: str = "/") -> list[str]:
    """The folders whose contents together are everything under `top` but the hidden folders (pure
    over `listdir`): Landlock allows beneath a path and cannot deny inside it, so the folders on the
    way to a hidden one are allowed entry by entry."""
    if any(_inside(top, h) for h in hidden):
        return []
    if not any(_inside(h, top) for h in hidden):
        return [top]
    found: list[str] = []
    try:
        names = listdir(top)
    except OSError:
        return []
    for name in sorted(names):
        found += readable_roots(hidden, listdir, os.path.join(top, name))
    return found


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The kernel's Landlock ABI version, or 0 when it has none (or it is disabled)."""
    return max(0, int(_libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))))


def restrict(rules: Sequence[tuple[str, int]], *, reads: bool, network: bool, writes: bool = True) -> str:
    """Give up, for this process and what it starts, every write (and with `reads` every read; without
    `writes`, reads alone) except the rights each rule grants beneath its path, and without `network`
    TCP; from ABI 6 signals and abstract unix sockets leave the domain no more. "landlock", or why
    not. A rule whose path is missing is left out (nothing beneath it can be used then)."""
    version = abi()
    if version < 1:
        return "no landlock in this kernel"
    libc = _libc()
    fs = fs_rights(version, reads=reads) & (~0 if writes else READ)
    net = 0 if network else net_rights(version)
    ruleset = _Ruleset(fs, net, scopes(version))
    size = ctypes.sizeof(_Ruleset) if version >= 6 else 16 if version >= 4 else 8
    ruleset_fd = libc.syscall(_CREATE_RULESET, ctypes.byref(ruleset), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset_fd < 0:
        return f"no landlock: {os.strerror(ctypes.get_errno())}"
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                # A file (not a folder) takes only the rights a file has.
                allowed = rights & fs & (~0 if os.path.isdir(path) else EXECUTE | READ_FILE | WRITE_FILE | TRUNCATE)
                rule = _PathBeneath(allowed, fd)
                if allowed and libc.syscall(_ADD_RULE, ruleset_fd, _RULE_PATH_BENEATH, ctypes.byref(rule),
                                            ctypes.c_uint32(0)):
                    return f"no landlock: {path}: {os.strerror(ctypes.get_errno())}"
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.syscall(_RESTRICT_SELF, ruleset_fd,
                                                                        ctypes.c_uint32(0)):
            return f"no landlock: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset_fd)
    return "landlock"
