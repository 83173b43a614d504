"""Telling the supervisor we are alive, the way systemd's sd_notify does: one datagram per message
to a Unix socket the supervisor binds (`$HERMES_SUP_NOTIFY`).

A send never blocks: with no supervisor listening it fails at once (the agent then counts how long
it has been orphaned), and with a full queue the message is dropped (the next heartbeat follows).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Iterator

NOTIFY_ENV = "HERMES_SUP_NOTIFY"
# The agent's exit status when it stopped itself, having heard from no supervisor for orphan_grace: a
# supervisor alive to see it (busy, its socket away) restarts it and says so (supervisor/exits.py).
# sysexits' EX_TEMPFAIL ("try again later"): not a status a crash is likely to have.
ORPHANED = 75
# sun_path holds 108 bytes with its terminating NUL: a socket deeper than that is reached through its folder.
SUN_PATH_MAX = 107


@contextlib.contextmanager
def unix_address(path: str | os.PathLike[str]) -> Iterator[str]:
    """An address bind, connect and sendto accept for the Unix socket at `path`, however deep: the path
    itself when it fits in sun_path, else the same name inside its folder reached through an O_PATH
    descriptor (/proc/self/fd/N/name), held open while the context lasts. OSError (ENAMETOOLONG,
    naming the path) if even that does not fit; what opening the folder raises otherwise."""
    text = os.fspath(path)
    if len(os.fsencode(text)) <= SUN_PATH_MAX:
        yield text
        return
    folder, name = os.path.split(text)
    fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        address = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(address)) > SUN_PATH_MAX or not os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENAMETOOLONG, f"a Unix socket path may have at most {SUN_PATH_MAX} bytes "
                                              f"(and /proc is needed to reach a deeper one); use a shorter "
                                              f"workspace path", text)
        yield address
    finally:
        os.close(fd)


class Notifier:
    def __init__(self, path: str | None, name: str) -> None:
        self.path = path
        self.name = name
        self._sock: socket.socket | None = None
        self._making = threading.Lock()  # the heartbeat thread and the one that hands a watch over

    def send(self, **fields: object) -> bool:
        """Send NAME=..., PID=... and `fields`; True if a supervisor received it."""
        if not self.path:
            return False
        with self._making:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
        lines = [f"NAME={self.name}", f"PID={os.getpid()}"]
        lines += [f"{key.upper()}={value}" for key, value in fields.items()]
        try:
            # The folder is looked up again each time: a new supervisor may have made a new one.
            with unix_address(self.path) as address:
                self._sock.sendto("\n".join(lines).encode(), address)
            return True
        except BlockingIOError:
            return True  # the supervisor is there, only busy: this heartbeat is dropped
        except OSError as exc:
            # EACCES/EPERM: the supervisor's socket is private to its user, and we are not it (a
            # command run as someone else). That is no supervisor for us, not a crash.
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK, errno.ENOTDIR, errno.EACCES,
                             errno.EPERM):
                return False
            raise

    def hold(self, fd: int) -> bool:
        """Ask the supervisor to hold our inotify instance `fd` (it copies it out of this process,
        see supervisor/held.py): our death then does not wait for the kernel's teardown of it.
        True if a supervisor received the message; a speed-up only, so nothing is retried."""
        return self.send(HOLD=fd)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def parse(datagram: bytes) -> dict[str, str]:
    """The fields of one notify message (what the supervisor reads)."""
    fields: dict[str, str] = {}
    for line in datagram.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip().upper()] = value.strip()
    return fields
