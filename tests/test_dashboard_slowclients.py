"""A client that sends its request a byte at a time (slowloris) is dropped at the request deadline, on a
new connection and on a kept-alive one, while the dashboard still serves everyone else (real sockets)."""

from __future__ import annotations

import http.client
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hermes_sup.supervisor.config.workspace import find_workspace
from hermes_sup.supervisor.dashboard.app import Server, Settings
from hermes_sup.supervisor.dashboard.slowclients import DeadlineH11Protocol

from .conftest import wait_until
from .test_dashboard import init

DEADLINE = 1.5  # the request deadline in these tests (seconds)
BOUND = 20.0  # how long a dripping client is kept at it before the test gives up on its being dropped


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setattr(DeadlineH11Protocol, "request_timeout", DEADLINE)
    served = Server(find_workspace(init(tmp_path / "ws")), Settings(host="127.0.0.1", port=0))
    served.start_thread()
    wait_until(lambda: served.server.started, timeout=30)
    yield served
    served.stop()


def page_status(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/", headers={"Host": f"127.0.0.1:{port}"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def drip_until_dropped(sock: socket.socket, port: int) -> tuple[float, list[int]]:
    """Send a request's head one byte every 0.1 s (never its end) until the server closes the connection;
    meanwhile load the page on other connections. Seconds it took, and the pages' statuses."""
    started = time.monotonic()
    header = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 10_000
    statuses = []
    for byte in header:
        assert time.monotonic() - started < BOUND, f"a client dripping its request was held for {BOUND:g} s"
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        if select.select([sock], [], [], 0.1)[0]:
            try:
                if sock.recv(1 << 16) == b"":
                    break
            except ConnectionResetError:
                break
        if len(statuses) < 3:
            statuses.append(page_status(port))
    return time.monotonic() - started, statuses


def test_a_client_dripping_its_request_is_dropped_while_others_are_served(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        took, statuses = drip_until_dropped(slow, server.port)
    assert DEADLINE * 0.8 <= took < BOUND
    assert statuses == [200, 200, 200]
    assert page_status(server.port) == 200


def test_a_kept_alive_connection_gets_a_deadline_for_its_next_request_too(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        slow.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        answer = b""
        while b"</html>" not in answer.lower():
            chunk = slow.recv(1 << 16)
            assert chunk, "the first request was answered"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        took, statuses = drip_until_dropped(slow, server.port)
    assert took < BOUND and statuses == [200, 200, 200]
