"""The supervisor's local sockets: a private folder for them, peer checks, and the control protocol.

The control protocol is one JSON object per connection, on one line, answered by one JSON line.
Every client is bounded so that none can stall or kill the event loop that serves them all: the
sockets are non-blocking, a request has a size cap, a connection has a deadline, the number of
connections is capped, and whatever handling one request raises becomes that client's error reply.
Only processes of our own user (or root) may connect: the folder is 0700, each socket 0600, and the
kernel's word on the peer (SO_PEERCRED, SCM_CREDENTIALS) is checked as well.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..agents.notify import unix_address

SOCKET_DIR = "sockets"
NOTIFY_SOCKET = "notify.sock"
CONTROL_SOCKET = "control.sock"
MAX_REQUEST = 64 * 1024       # a real request is under 200 bytes
CLIENT_DEADLINE = 5.0         # seconds for a whole exchange, from accept to the last reply byte
MAX_CLIENTS = 16              # connections served at once; more are turned away
MAX_DOWN_TIMEOUT = 24 * 3600.0
NOTIFY_MAX = 4096             # a heartbeat is under 100 bytes
_UCRED = struct.Struct("3i")  # pid, uid, gid


# -- pure decisions ------------------------------------------------------------------------------

def peer_allowed(peer_uid: int, own_uid: int) -> bool:
    """Whether a local peer may talk to the supervisor: our own user, or root (who could anyway)."""
    return peer_uid in (own_uid, 0)


def parse_request(line: bytes) -> dict[str, Any]:
    """The command in one request line; ValueError says what is wrong with it."""
    try:
        request = json.loads(line.decode("utf-8")) if line.strip() else {}
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not a JSON line: {exc}") from None
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    return request


def down_timeout(value: object) -> float | None:
    """The `timeout` of a `down` request, or None to keep each agent's own; ValueError if unusable
    (NaN or infinity would mean that SIGKILL never comes)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"timeout must be a number of seconds, not {value!r}")
    if not 0 <= value <= MAX_DOWN_TIMEOUT:
        raise ValueError(f"timeout must be between 0 and {MAX_DOWN_TIMEOUT:g} s")
    return float(value)


# -- the private folder and the sockets in it ----------------------------------------------------

def bind_private(path: Path, kind: int) -> socket.socket:
    """A non-blocking Unix socket bound at `path` (inside a private_dir) with mode 0600."""
    sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        path.unlink(missing_ok=True)
        with unix_address(path) as address:  # a workspace deeper than sun_path allows binds too
            sock.bind(address)
        os.chmod(path, 0o600)  # bind gave it the umask's mode; the 0700 folder covered the gap
    except BaseException:
        sock.close()
        raise
    return sock


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix stream socket (the kernel's word)."""
    _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid


# SO_PASSRIGHTS (Linux 6.16; the generic value, x86 and arm64 alike): 0 has the kernel refuse a
# datagram that would pass us descriptors, which the sender then gets EPERM for.
_SO_PASSRIGHTS = 83


def enable_credentials(sock: socket.socket) -> None:
    """Have the kernel attach the sender's pid and uid to every datagram received on `sock`, and
    refuse any that passes descriptors where it can: closing one can block (a socket lingering on
    close), and nothing we read needs them."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    with contextlib.suppress(OSError):  # an older kernel: what is passed is closed on receipt
        sock.setsockopt(socket.SOL_SOCKET, _SO_PASSRIGHTS, 0)


def recv_datagram(sock: socket.socket) -> tuple[bytes, int | None, int | None]:
    """One datagram with its sender's pid and uid (None if the kernel attached none). Raises
    BlockingIOError when none is waiting. File descriptors passed along are closed unused."""
    data, ancdata, _flags, _addr = sock.recvmsg(NOTIFY_MAX, socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(64),
                                                socket.MSG_CMSG_CLOEXEC)
    pid = uid = None
    for level, kind, payload in ancdata:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
            pid, uid, _gid = _UCRED.unpack(payload[:_UCRED.size])
        elif kind == socket.SCM_RIGHTS:
            for (fd,) in struct.iter_unpack("i", payload[: len(payload) - len(payload) % 4]):
                with contextlib.suppress(OSError):
                    os.close(fd)
    return data, pid, uid


# -- the server side -----------------------------------------------------------------------------

def _reply_bytes(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply, default=str).encode() + b"\n"


class _Client:
    """One connection: read one line (capped), answer it, close; all before its deadline."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn = conn
        self.deadline = deadline
        self.inbox = bytearray()
        self.outbox = b""


class ControlServer:
    """The control socket on the supervisor's selector. `handle` turns a request into a reply; it
    runs on the event loop, and anything it raises is answered to that client only."""

    def __init__(self, path: Path, selector: selectors.BaseSelector,
                 handle: Callable[[dict[str, Any]], dict[str, Any]], say: Callable[[str], None]) -> None:
        self.path = path
        self.selector = selector
        self.handle = handle
        self.say = say
        self.clients: dict[int, _Client] = {}
        self.paused_until: float | None = None  # accept() ran out of descriptors; try again then
        self.refused = 0
        self.listener = bind_private(path, socket.SOCK_STREAM)
        self.listener.listen(8)
        self.selector.register(self.listener, selectors.EVENT_READ, self._on_accept)

    # The loop asks when the next client must be dropped, and drops it then.
    def next_deadline(self) -> float | None:
        times = [c.deadline for c in self.clients.values()]
        if self.paused_until is not None:
            times.append(self.paused_until)
        return min(times, default=None)

    def expire(self, now: float) -> None:
        for client in [c for c in self.clients.values() if now >= c.deadline]:
            self._close(client)
        if self.paused_until is not None and now >= self.paused_until:
            self.paused_until = None
            self.selector.register(self.listener, selectors.EVENT_READ, self._on_accept)

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._close(client)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self.listener.close()
        self.path.unlink(missing_ok=True)

    def _on_accept(self) -> None:
        for _ in range(MAX_CLIENTS):  # a bounded batch: a connect storm cannot hold the loop
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # The pending connection stays readable: stop listening for a second rather
                    # than spin on it.
                    self.selector.unregister(self.listener)
                    self.paused_until = time.monotonic() + 1.0
                    return
                continue  # ECONNABORTED and the like concern that one client only
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        try:
            uid = peer_uid(conn)
        except OSError:
            conn.close()
            return
        if not peer_allowed(uid, os.geteuid()):
            self.refused += 1
            if self.refused == 1:  # once: a hostile user must not be able to flood the log
                self.say(f"supervisor: refused a control connection from uid {uid} (not ours); "
                         f"further refusals are not logged")
            self._send_and_close(conn, {"ok": False, "message": "refused: not the supervisor's user"})
            return
        if len(self.clients) >= MAX_CLIENTS:
            self._send_and_close(conn, {"ok": False, "message": "busy: too many control connections"})
            return
        client = _Client(conn, time.monotonic() + CLIENT_DEADLINE)
        self.clients[conn.fileno()] = client
        self.selector.register(conn, selectors.EVENT_READ, lambda c=client: self._on_readable(c))

    def _send_and_close(self, conn: socket.socket, reply: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.send(_reply_bytes(reply))
        conn.close()

    def _on_readable(self, client: _Client) -> None:
        while True:
            try:
                chunk = client.conn.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                self._close(client)
                return
            if chunk:
                client.inbox += chunk
            end = client.inbox.find(b"\n")
            if end < 0 and len(client.inbox) > MAX_REQUEST:
                self._answer(client, {"ok": False, "message": f"bad request: longer than {MAX_REQUEST} bytes"})
                return
            if end >= 0 or not chunk:  # a whole line, or the client closed its side
                self._answer(client, self._handle(bytes(client.inbox if end < 0 else client.inbox[:end])))
                return

    def _handle(self, line: bytes) -> dict[str, Any]:
        try:
            return self.handle(parse_request(line))
        except ValueError as exc:
            return {"ok": False, "message": f"bad request: {exc}"}
        except Exception as exc:  # one request's failure is that client's answer, never the loop's
            self.say(f"supervisor: a control request failed: {type(exc).__name__}: {exc}")
            return {"ok": False, "message": f"the supervisor could not do that: {type(exc).__name__}: {exc}"}

    def _answer(self, client: _Client, reply: dict[str, Any]) -> None:
        try:
            client.outbox = _reply_bytes(reply)
        except (TypeError, ValueError) as exc:
            client.outbox = _reply_bytes({"ok": False, "message": f"the reply could not be encoded: {exc}"})
        self.selector.modify(client.conn, selectors.EVENT_WRITE, lambda c=client: self._on_writable(c))
        self._on_writable(client)

    def _on_writable(self, client: _Client) -> None:
        try:
            while client.outbox:
                client.outbox = client.outbox[client.conn.send(client.outbox):]
        except BlockingIOError:
            return  # the rest when the client reads; its deadline bounds the wait
        except OSError:
            pass
        self._close(client)

    def _close(self, client: _Client) -> None:
        self.clients.pop(client.conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(client.conn)
        client.conn.close()


# -- the client side -----------------------------------------------------------------------------

def _read_line(sock: socket.socket, deadline: float, limit: int) -> bytes:
    """One line (or what came before the other side closed), within `deadline` for the whole of it:
    an answer trickled a byte at a time cannot hold the CLI longer. TimeoutError past the deadline."""
    data = bytearray()
    while b"\n" not in data and len(data) <= limit:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            raise TimeoutError(errno.ETIMEDOUT, "the supervisor's answer did not come in time") from None
        if not chunk:
            break
        data += chunk
    return bytes(data.partition(b"\n")[0])


def request(runs: Path, payload: dict[str, Any], timeout: float = 10.0) -> Any:
    """Send one command to a running supervisor: its JSON answer, whatever it is; None if none is
    listening or it said nothing; ValueError if the answer is not JSON. A socket held by another
    user (planted in place of the supervisor's) is not talked to."""
    path = runs / SOCKET_DIR / CONTROL_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            with unix_address(path) as address:
                sock.connect(address)
            if not peer_allowed(peer_uid(sock), os.geteuid()):
                return None
            sock.sendall(json.dumps(payload).encode() + b"\n")
            data = _read_line(sock, time.monotonic() + timeout, MAX_REQUEST * 64)
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    if not data:
        return None
    try:
        return json.loads(data)  # not necessarily a mapping: the caller tells garbage from silence
    except RecursionError:  # whatever listens there may nest its answer 100,000 deep
        raise ValueError("the reply is nested too deep") from None
