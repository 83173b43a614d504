"""Linux inotify through ctypes: a descriptor that becomes readable when a watched folder changes."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct

IN_MODIFY = 0x002
IN_MOVE_SELF = 0x800
IN_DELETE_SELF = 0x400
IN_CREATE = 0x100
IN_MOVED_TO = 0x080
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len of the name that follows


def parse_events(data: bytes) -> list[tuple[int, int, str]]:
    """The (watch, mask, name) of each event in a read of an inotify descriptor (pure)."""
    events, offset = [], 0
    while offset + _HEADER.size <= len(data):
        wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        name = data[offset:offset + length].split(b"\0", 1)[0]
        offset += length
        events.append((wd, mask, os.fsdecode(name)))
    return events


class Inotify:
    """One inotify instance; `fd` is for select, `read` returns what happened since the last read."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd

    def add(self, path: str | os.PathLike[str], mask: int, *, folder: bool = True) -> int:
        """Watch the folder (or file) `path`, never through a link, for `mask`; the watch's number
        (the same for the same inode)."""
        wd = self._add(self.fd, os.fsencode(path), mask | IN_DONT_FOLLOW | (IN_ONLYDIR if folder else 0))
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
        return int(wd)

    def remove(self, wd: int) -> None:
        """Stop a watch (one already gone, with its file, is no error)."""
        self._rm(self.fd, wd)

    def read(self) -> list[tuple[int, int, str]]:
        """The events queued now (none if there are none)."""
        try:
            return parse_events(os.read(self.fd, 65536))
        except BlockingIOError:
            return []

    def close(self) -> None:
        os.close(self.fd)
