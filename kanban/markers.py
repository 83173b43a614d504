"""Reservation markers: `.pending/<id>` names the process whose transition of the task is in flight.

A marker is a hard link to its process's owner file, `.pending/.owner.<pid>.<hex>`, which holds
the process's pid and start time and is written once. A marker is thus created with its owner's
name in one step, exclusively (link() fails if the name exists), as the symlinks that were the
markers before, but creating and removing one makes and frees no inode: on ext4 without a journal
every inode freed in the last minutes makes each new one dearer (the allocator reads each such
inode before it passes over it), and a claim's marker was a third of what a task freed.

Markers of the earlier kind (symlinks whose target is the owner text) are still read. An owner file
goes when its process exits; a killed process's stays until the board's sweep (`sweep_owners`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import stat
import threading
from pathlib import Path

from .fsio import mode_for, read_bytes_nofollow
from .liveness import holder_alive, start_time

OWNER_PREFIX = ".owner."
OWNER_LIMIT = 200  # bytes of an owner text read at most: "<pid> <start time>" is about 30
# Errors that say nothing of the file (this process is short of something): its owner is not dead.
TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EIO, errno.EINTR, errno.EAGAIN})

_START_TIME: list[tuple[int, float]] = []


def own_start_time() -> float:
    """This process's start time, read once per process."""
    pid = os.getpid()
    if not _START_TIME or _START_TIME[0][0] != pid:  # recomputed after a fork
        _START_TIME[:] = [(pid, start_time(pid) or 0.0)]
    return _START_TIME[0][1]


def owner_text() -> str:
    """What a marker says of its owner: pid and process start time."""
    return f"{os.getpid()} {own_start_time()!r}"


def owner_of(path: Path) -> tuple[int, float] | None:
    """The pid and start time a marker (or an owner file) names; None if it names none. Read
    without following a link and without blocking, and only a regular file is opened: anything
    may have been put in .pending/ (a device opened has effects). OSError when it could not be
    read now (out of descriptors, an I/O error): that names no one dead."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            text = os.readlink(path)
        elif not stat.S_ISREG(info.st_mode):
            return None
        else:
            data = read_bytes_nofollow(path, OWNER_LIMIT)
            if len(data) > OWNER_LIMIT:
                return None  # not an owner's text, whatever its first bytes say
            text = data.decode("ascii")
        pid_text, started_text = text.split()
        return int(pid_text), float(started_text)
    except OSError as exc:
        if exc.errno in TRANSIENT:
            raise
        return None
    except ValueError:
        return None


def changed_at(marker: Path) -> float:
    """When the marker was made, near enough: a hard link's change time (link() sets it, on the
    inode it shares with its owner file, so a live owner's marker looks as new as its last), a
    symlink's own."""
    return marker.lstat().st_ctime


class Owner:
    """This process's owner file in one board's .pending/ folder, made on first use (again after a
    fork); one per folder and process (`owner_for`), whatever the number of board objects."""

    def __init__(self, pending: Path) -> None:
        self.pending = pending
        self.path: Path | None = None
        self.identity: tuple[int, int] | None = None  # the owner file's (device, inode): what our markers are
        self.pid = 0
        self.making = threading.Lock()

    def is_ours(self, marker: Path) -> bool:
        """Whether `marker` is a link to this process's owner file (not one placed since by another)."""
        try:
            info = os.lstat(marker)
        except OSError:
            return False
        return self.pid == os.getpid() and (info.st_dev, info.st_ino) == self.identity

    def remove_own(self, marker: Path) -> None:
        """Unlink `marker` if it is still ours: outside the lock, a transition of another process
        (a cancel) may have placed its own marker there since, which must stay."""
        if self.is_ours(marker):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(marker)

    def place(self, marker: Path) -> None:
        """Create `marker` naming this process; FileExistsError if it exists."""
        for _try in range(3):
            owner = self._file()
            try:
                os.link(owner, marker, follow_symlinks=False)
                return
            except FileNotFoundError:
                if os.path.lexists(owner):
                    raise  # .pending/ itself is gone: as a symlink's creation would
                with self.making:  # removed by hand or by a sweep that took us for dead: make another
                    if self.path == owner:  # (once, whichever thread saw it first)
                        self.path = None
        raise FileNotFoundError(f"could not keep an owner file in {self.pending}")

    def _file(self) -> Path:
        with self.making:
            return self._made()

    def _made(self) -> Path:
        if self.path is None or self.pid != os.getpid():
            path = self.pending / f"{OWNER_PREFIX}{os.getpid()}.{os.urandom(4).hex()}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                # Readable as the board's folder is, whatever the umask: a teammate's command that
                # could not read it would take every marker of this process for a dead one's.
                os.fchmod(fd, mode_for(self.pending))
                os.write(fd, owner_text().encode("ascii"))
                info = os.fstat(fd)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            os.close(fd)
            self.path, self.pid, self.identity = path, os.getpid(), (info.st_dev, info.st_ino)
        return self.path


_OWNERS: dict[str, Owner] = {}
_OWNERS_LOCK = threading.Lock()


def owner_for(pending: Path) -> Owner:
    """The process's Owner of the folder `pending`."""
    key = os.path.abspath(pending)
    with _OWNERS_LOCK:
        return _OWNERS.setdefault(key, Owner(pending))


def _forked() -> None:
    # A lock held by another thread at the fork stays held in the child for good.
    global _OWNERS_LOCK
    _OWNERS_LOCK = threading.Lock()
    for owner in _OWNERS.values():
        owner.making = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _drop_own() -> None:
    """At a clean exit this process's owner files go with it (a killed one's are swept)."""
    for owner in list(_OWNERS.values()):
        if owner.path is not None and owner.pid == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(owner.path)


atexit.register(_drop_own)


def sweep_owners(pending: Path) -> None:
    """Remove the owner files of processes that are gone (under the lock). A marker still linked
    to one keeps its text: it is the inode, not the name, that a marker shares."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(pending):
            if not entry.name.startswith(OWNER_PREFIX) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                owner = owner_of(Path(entry.path))
            except OSError:
                continue  # not readable now: not known dead
            if owner is None or holder_alive(owner[0], owner[1], None) is False:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
