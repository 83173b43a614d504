"""Linux inotify(7) over ctypes: watches by path, the events read raw or by folder, the kernel's overflow included.

Why not watchdog's observer for the board: it spent 100 to 200 us of Python on each event (move
pairing through a delayed queue, event objects, a dispatch thread), and every process that waits
on the board pays it for every file any process writes there: with 16 agents, their watchers were
half of what an idle agent did while others drained. It also drops the kernel's queue-overflow
event, which this reader hands on (as `OVERFLOW`) so the board rescans.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
from collections.abc import Iterator
from typing import NamedTuple

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_CLOEXEC = 0o2000000
IN_NONBLOCK = 0o4000

HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
BUFFER = 64 * 1024

_libc: ctypes.CDLL | None = None


class Event(NamedTuple):
    folder: str  # the watched folder's path ("" for an overflow)
    name: str  # the entry's name in it ("" for the folder itself)
    mask: int


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        import ctypes.util  # here, not at import: it costs every command that never watches a folder

        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def parse_events(data: bytes) -> list[tuple[int, int, str]]:
    """The (watch, mask, name) of each event in a read of an inotify descriptor (pure)."""
    events, at = [], 0
    while at + HEADER.size <= len(data):
        wd, mask, _cookie, length = HEADER.unpack_from(data, at)
        name = data[at + HEADER.size:at + HEADER.size + length].split(b"\0", 1)[0]
        at += HEADER.size + length
        events.append((wd, mask, os.fsdecode(name)))
    return events


class Inotify:
    """One inotify instance: `watch_folder` then `events(timeout)` as they come, `shutdown()`, `close()`;
    or `add` and `read` for a caller that selects on `fd` itself."""

    def __init__(self) -> None:
        fd = libc().inotify_init1(IN_CLOEXEC | IN_NONBLOCK)
        if fd < 0:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number))
        self.fd = fd
        self._folders: dict[int, str] = {}
        # One descriptor to wake a waiting `events` (a pipe took two, and a supervisor short of
        # descriptors starts fewer agents).
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self._poll.register(self._wake, select.POLLIN)
        self.closed = False
        self._fds_open = True

    def add(self, path: str | os.PathLike[str], mask: int, *, folder: bool = True) -> int:
        """Watch the folder (or file) `path`, never through a link, for `mask`; the watch's number
        (the same for the same inode). Raises OSError (ENOENT: gone; ENOSPC: the user's watches)."""
        wd = libc().inotify_add_watch(self.fd, os.fsencode(path),
                                      mask | IN_DONT_FOLLOW | (IN_ONLYDIR if folder else 0))
        if wd < 0:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number), os.fspath(path))
        return int(wd)

    def watch_folder(self, folder: str, mask: int) -> bool:
        """Watch `folder` (not its subfolders), its events named by it in `events`; False if it is
        not (or no longer) a folder."""
        try:
            wd = self.add(folder, mask)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise
        self._folders[wd] = folder
        return True

    def folders(self) -> list[str]:
        """The folders watched now."""
        return list(self._folders.values())

    def remove(self, wd: int) -> None:
        """Stop a watch (one already gone, with its file, is no error)."""
        libc().inotify_rm_watch(self.fd, wd)

    def read(self) -> list[tuple[int, int, str]]:
        """The (watch, mask, name) of the events queued now, none if there are none (a caller that
        selects on `fd` itself)."""
        try:
            return parse_events(os.read(self.fd, BUFFER))
        except BlockingIOError:
            return []

    def events(self, timeout: float | None) -> Iterator[Event]:
        """The events that arrive within `timeout` seconds (None: until some do or `shutdown` is
        called); nothing once shut down."""
        if self.closed:
            return
        ready = self._poll.poll(None if timeout is None else int(timeout * 1000))
        if self.closed or not ready:
            return
        try:
            data = os.read(self.fd, BUFFER)
        except BlockingIOError:
            return
        except OSError:
            if self.closed:
                return
            raise
        yield from self._parse(data)

    def _parse(self, data: bytes) -> Iterator[Event]:
        for wd, mask, name in parse_events(data):
            if mask & IN_Q_OVERFLOW:
                yield Event("", "", mask)
                continue
            folder = self._folders.get(wd)
            if folder is None:
                continue
            if mask & IN_IGNORED:  # the folder went away (or its watch was removed)
                del self._folders[wd]
            yield Event(folder, name, mask)

    def shutdown(self) -> None:
        """Make a waiting `events` return, and every later one return nothing (from any thread)."""
        self.closed = True
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        """Release the descriptors: only once no thread is in `events` (after shutdown and a join)."""
        self.closed = True
        if self._fds_open:
            # A copy held by another process (an agent's supervisor holds its board watch's, see
            # supervisor/held.py) outlives this close: it must watch nothing from now on.
            for wd in list(self._folders):
                self.remove(wd)
        fds, self._fds_open = (self.fd, self._wake) if self._fds_open else (), False
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
