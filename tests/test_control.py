"""The control protocol's decisions, without a supervisor: who may connect, what a request is; and
the control server on a real socket, with a handler standing in for the supervisor."""

from __future__ import annotations

import json
import math
import os
import selectors
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hermes_sup.supervisor.config.workspace import private_dir
from hermes_sup.supervisor.control import ControlServer, down_timeout, parse_request, peer_allowed


def test_only_our_own_user_or_root_may_talk_to_the_supervisor():
    assert peer_allowed(1000, 1000) and peer_allowed(0, 1000) and peer_allowed(0, 0)
    assert not peer_allowed(65534, 1000) and not peer_allowed(65534, 0) and not peer_allowed(1001, 1000)


@pytest.mark.parametrize("line", [b"\xff\xfe", b"{not json", b"[" * 100_000, b"[1, 2]", b'"down"', b"null", b"3"])
def test_a_request_that_is_not_a_json_object_is_a_clear_error(line):
    with pytest.raises(ValueError):
        parse_request(line)


def test_a_request_is_a_json_object_and_an_empty_line_an_empty_one():
    assert parse_request(b'{"cmd": "status"}') == {"cmd": "status"}
    assert parse_request(b"  ") == {}


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, True, "5", [5], 1e12])
def test_a_down_timeout_that_would_never_end_or_is_not_a_number_is_refused(value):
    with pytest.raises(ValueError):
        down_timeout(value)


def test_a_down_timeout_in_range_is_taken():
    assert down_timeout(None) is None and down_timeout(0) == 0.0 and down_timeout(2.5) == 2.5


def test_the_socket_folder_is_made_private_and_what_squats_its_name_is_moved_aside(tmp_path):
    old = os.umask(0)
    try:
        folder = private_dir(tmp_path / "sockets")
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o777)
    assert stat.S_IMODE(private_dir(folder).stat().st_mode) == 0o700, "a loosened folder is tightened"
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o777)
    folder.symlink_to(tmp_path / "elsewhere")
    private_dir(folder)
    assert folder.is_dir() and not folder.is_symlink()
    assert [p.name.startswith("sockets.suspect-") for p in tmp_path.iterdir() if p.is_symlink()] == [True]


def test_a_socket_too_deep_for_sun_path_is_bound_and_reached_through_its_folder(tmp_path):
    import errno
    import socket

    from hermes_sup.agents.notify import unix_address
    from hermes_sup.supervisor.control import bind_private

    folder = tmp_path / ("x" * 120)
    folder.mkdir()
    path = folder / "control.sock"
    with unix_address(tmp_path / "short.sock") as address:
        assert address == str(tmp_path / "short.sock")  # what fits is used as it is
    server = bind_private(path, socket.SOCK_STREAM)
    try:
        server.listen(1)
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client, unix_address(path) as address:
            client.connect(address)
            server.setblocking(True)
            server.accept()[0].close()
    finally:
        server.close()
    with pytest.raises(OSError) as raised, unix_address(folder / ("n" * 120)):
        pass
    assert raised.value.errno == errno.ENAMETOOLONG and raised.value.filename == str(folder / ("n" * 120))
    assert "shorter workspace path" in raised.value.strerror


def test_a_request_whose_handling_raises_is_answered_to_that_client_and_the_next_one_is_served():
    def handle(request: dict) -> dict:
        if request.get("cmd") == "boom":
            raise RuntimeError("the handler broke")
        return {"ok": True, "message": "fine"}

    said: list[str] = []
    replies: dict[str, dict] = {}
    selector = selectors.DefaultSelector()
    with tempfile.TemporaryDirectory(prefix="hs-") as folder:  # a short path: sun_path holds 108 bytes
        path = Path(folder) / "control.sock"
        server = ControlServer(path, selector, handle, said.append)

        def clients() -> None:
            for name in ("boom", "status"):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(10)
                    sock.connect(str(path))
                    sock.sendall(json.dumps({"cmd": name}).encode() + b"\n")
                    replies[name] = json.loads(sock.makefile("rb").readline() or b"{}")

        thread = threading.Thread(target=clients, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        try:
            while thread.is_alive() and time.monotonic() < deadline:  # the supervisor's loop, in short
                for key, _ in selector.select(timeout=0.1):
                    key.data()
        finally:
            thread.join(timeout=10)
            server.close()
            selector.close()
    assert replies["boom"]["ok"] is False and "RuntimeError: the handler broke" in replies["boom"]["message"]
    assert replies["status"] == {"ok": True, "message": "fine"}
    assert any("the handler broke" in line for line in said), said
