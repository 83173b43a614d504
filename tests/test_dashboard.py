"""The web dashboard over HTTP (its stream, its guard) and in a real browser: the system's Chromium,
driven by playwright, on a page served beside a real running example team (no API key)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import find_workspace
from hermes_sup.supervisor.dashboard import security, sse
from hermes_sup.supervisor.dashboard.app import Server, Settings

from .conftest import CLI, ROOT, gone, stop_process, supervisor_state, wait_until

CHROMIUM = Path(os.environ.get("HERMES_SUP_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "tests" / "artifacts"  # screenshots, kept for a person (gitignored)
TOKEN = "a-test-token-of-32-characters-xx"


def init(ws: Path, *options: str) -> Path:
    result = subprocess.run([*CLI, "init", *options, str(ws)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    return ws


def cli(ws: Path, *args: str, check: bool = True, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, cwd=ROOT,
                            timeout=timeout, env={**os.environ, **(env or {})})
    if check:
        assert result.returncode == 0, result.stderr
    return result


def make_workspace(where: Path) -> Path:
    """The example team, its example tasks taken out of the inbox: each test adds its own."""
    ws = init(where / "team", "--example")
    for path in (ws / "kanban" / "inbox").glob("*.json"):
        path.unlink()
    return ws


def drop(ws: Path, name: str, doc: dict) -> None:
    """A task file dropped in the inbox as a person or a script would: written aside, renamed in."""
    inbox = ws / "kanban" / "inbox"
    (inbox / f".{name}.tmp").write_text(json.dumps(doc))
    os.rename(inbox / f".{name}.tmp", inbox / f"{name}.json")


# -- server-sent events, read over a plain socket ------------------------------------------------

class Stream:
    """One client of /api/events, reading frames as they come."""

    def __init__(self, port: int, last_event_id: str | None = None, headers: dict[str, str] | None = None,
                 path: str = "/api/events") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if last_event_id is not None:
            extra += f"Last-Event-ID: {last_event_id}\r\n"
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode())
        self.buffer = b""
        head = self._until(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        self.chunked = b"transfer-encoding: chunked" in head.lower()
        self.raw = b""  # the body, de-chunked, not yet parsed into frames

    def _until(self, mark: bytes) -> bytes:
        while mark not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the stream ended")
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(mark)
        return head

    def _fill(self) -> None:
        if not self.chunked:
            data = self.buffer or self.sock.recv(65536)
            self.buffer = b""
            if not data:
                raise EOFError("the stream ended")
            self.raw += data
            return
        size = int(self._until(b"\r\n"), 16)
        while len(self.buffer) < size + 2:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the stream ended")
            self.buffer += data
        self.raw += self.buffer[:size]
        self.buffer = self.buffer[size + 2:]

    def frame(self, deadline: float) -> dict[str, str]:
        """The next frame (comments and retry lines skipped) as {id, event, data}, by `deadline`."""
        while True:
            while b"\n\n" not in self.raw:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no frame in time")
                self.sock.settimeout(remaining)
                self._fill()
            block, _, self.raw = self.raw.partition(b"\n\n")
            fields: dict[str, str] = {}
            for line in block.decode().split("\n"):
                if line.startswith(":") or not line:
                    continue
                name, _, value = line.partition(": ")
                fields[name] = value
            if "event" in fields:
                return fields

    def until(self, predicate, timeout: float = 30) -> list[dict[str, str]]:
        """Frames until one satisfies `predicate` (that one last), within `timeout` seconds in all
        (keepalive comments arriving meanwhile do not extend it)."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, str]] = []
        while True:
            try:
                frame = self.frame(deadline)
            except TimeoutError:
                raise TimeoutError(f"no such frame within {timeout} s; the last seen: {seen[-3:]}") from None
            seen.append(frame)
            if predicate(frame):
                return seen

    def close(self) -> None:
        self.sock.close()


def event_of(frame: dict[str, str]) -> dict | None:
    return json.loads(frame["data"]) if frame.get("event") == "event" else None


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Server]]:
    """A dashboard served in a thread of the test process (no team running) over a fresh workspace."""
    ws_path = init(tmp_path / "ws")
    monkeypatch.setattr(sse, "SAFETY_RECHECK", 0.2)  # many quiet rechecks within the test's time
    server = Server(find_workspace(ws_path), Settings(host="127.0.0.1", port=0))
    server.start_thread()
    wait_until(lambda: server.server.started, timeout=30)
    yield ws_path, server
    server.stop()


def test_resume_with_last_event_id_loses_nothing(served: tuple[Path, Server]) -> None:
    ws, server = served
    first = Stream(server.port)
    assert first.status == 200
    snapshot = first.until(lambda f: f["event"] == "snapshot")[-1]
    assert json.loads(snapshot["data"])["board"]["counts"]["todo"] == 0
    cli(ws, "task", "add", "one", "--id", "one", "--role", "nobody")
    seen = first.until(lambda f: (event_of(f) or {}).get("task") == "one")
    resume_at = seen[-1]["id"]
    assert int(resume_at) == json.loads(seen[-1]["data"])["cursor"]
    first.close()  # the page goes away (a network blip, a laptop lid) ...
    for name in ("two", "three"):  # ... while the board moves on
        cli(ws, "task", "add", name, "--id", name, "--role", "nobody")
    cli(ws, "task", "cancel", "two")
    again = Stream(server.port, last_event_id=resume_at)
    frames = again.until(lambda f: f["event"] == "snapshot")
    missed = [(e["task"], e["to"]) for e in map(event_of, frames) if e]
    assert missed == [("two", "todo"), ("three", "todo"), ("two", "cancelled")]
    assert frames[-1]["id"] == str(json.loads(frames[-2]["data"])["cursor"])  # the snapshot resumes there too
    again.close()
    # An id this log never gave (another board's) starts afresh, and says so.
    stranger = Stream(server.port, last_event_id="999999999")
    frames = stranger.until(lambda f: f["event"] == "snapshot")
    assert frames[0]["event"] == "reset" and not any(map(event_of, frames))
    stranger.close()


def follower_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "dashboard-board-follower"]


def test_reads_the_board_only_when_something_changed(served: tuple[Path, Server]) -> None:
    ws, server = served
    hub = server.dashboard.hub
    assert hub.builds == 0 and not hub.watching  # no client: nothing read, nothing watched
    client = Stream(server.port)
    client.until(lambda f: f["event"] == "snapshot")
    assert hub.builds == 1 and hub.watching
    # Several quiet rechecks (every 0.2 s here) read the log by cursor, but not the board.
    turns, woken = hub.turns, hub.generation
    wait_until(lambda: hub.turns >= turns + 5, timeout=30)
    assert hub.builds == 1 and hub.generation == woken
    cli(ws, "task", "add", "moved", "--id", "moved", "--role", "nobody")
    frames = client.until(lambda f: f["event"] == "snapshot")
    assert json.loads(frames[-1]["data"])["board"]["counts"]["todo"] == 1
    # Woken by the change (inotify) and read again; `task add` changes the board twice (its log line,
    # then its file), so on a loaded machine a picture may be built between the two: at most two reads.
    assert hub.builds in (2, 3) and hub.generation > woken
    client.close()
    wait_until(lambda: hub.clients == 0 and not hub.watching, timeout=15)
    wait_until(lambda: not follower_threads(), timeout=15)  # the board's follower ended too
    # Nobody connected: the watcher is gone, so a change wakes nothing and nothing reads the board.
    generation, builds = hub.generation, hub.builds
    cli(ws, "task", "add", "unseen", "--id", "unseen", "--role", "nobody")
    assert not hub.watching and hub.generation == generation and hub.builds == builds


def test_the_supervisors_state_wakes_the_stream(served: tuple[Path, Server], monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's restart changes supervisor.json only (no board event): it is watched too, so the
    page sees it at once, not at the next safety recheck (made longer than the test here)."""
    import psutil
    from hermes_sup.kanban.fsio import write_json_atomic

    ws, server = served
    monkeypatch.setattr(sse, "SAFETY_RECHECK", 3600.0)
    monkeypatch.setattr(sse, "KEEPALIVE", 3600.0)
    client = Stream(server.port)
    first = json.loads(client.until(lambda f: f["event"] == "snapshot")[-1]["data"])
    assert first["agents"] == [] and not first["supervisor"]["running"]
    me = psutil.Process()
    write_json_atomic(ws / "runs" / "supervisor.json", {
        "pid": me.pid, "pid_started": me.create_time(), "agents": {
            "worker": {"pid": None, "pid_started": None, "state": "backoff", "restarts": 3, "task": None}}})
    frames = client.until(lambda f: f["event"] == "snapshot", timeout=60)
    picture = json.loads(frames[-1]["data"])
    assert picture["supervisor"]["running"] is True
    assert [(a["name"], a["state"], a["restarts"]) for a in picture["agents"]] == [("worker", "backoff", 3)]
    client.close()


def test_the_budget_ledger_and_a_saved_breaker_wake_the_stream(served: tuple[Path, Server],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Spend and a breaker opening change files in runs/ only (no board event): both are watched
    while a client is connected, so the budgets and breakers panels change at once, not at the
    next safety recheck (made longer than the test here)."""
    from hermes_sup.kanban.fsio import write_json_atomic

    ws, server = served
    monkeypatch.setattr(sse, "SAFETY_RECHECK", 3600.0)
    monkeypatch.setattr(sse, "KEEPALIVE", 3600.0)
    (ws / "hermes.yaml").write_text((ws / "hermes.yaml").read_text() + "\nbudgets:\n  team: {total: 2}\n")
    (ws / "runs" / "worker-1").mkdir(parents=True)  # the agent's folder, there when the page connects
    client = Stream(server.port)
    first = json.loads(client.until(lambda f: f["event"] == "snapshot")[-1]["data"])
    assert first["breakers"] == []
    assert first["budgets"] == [{"scope": "team", "cap": "total", "limit": 2, "spent": 0.0, "left": 2.0}]
    with open(ws / "runs" / "budget.jsonl", "a") as ledger:  # as the agents' ledger appends a settled call
        ledger.write(json.dumps({"op": "hold", "id": "h1", "agent": "worker-1", "task": "t", "day": "2026-01-01",
                                 "amount": 0.25}) + "\n")
        ledger.write(json.dumps({"op": "settle", "id": "h1", "amount": 0.25}) + "\n")
    # Its creation wakes the stream too, maybe before the lines are in: a picture with them follows.
    client.until(lambda f: f["event"] == "snapshot" and json.loads(f["data"])["budgets"][0]["spent"] == 0.25,
                 timeout=30)
    gone = {"state": "open", "failures": 1, "opened": 1, "until": time.time() + 300, "why": "unreachable"}
    write_json_atomic(ws / "runs" / "worker-1" / "providers.json",
                      {"saved_at": "2026-01-01T00:00:00Z", "breakers": {"gone": gone}})
    frames = client.until(lambda f: f["event"] == "snapshot" and json.loads(f["data"])["breakers"], timeout=30)
    breakers = json.loads(frames[-1]["data"])["breakers"]
    assert [(b["agent"], b["provider"], b["level"]) for b in breakers] == [("worker-1", "gone", "warn")]
    assert breakers[0]["state"].startswith("open: down until "), breakers
    client.close()


def test_a_held_tasks_picture_follows_its_lease_renewed(served: tuple[Path, Server],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A renewal is no event: while a task is held the picture is built again now and then, so its
    card's lease left does not run out on the page while the holder keeps renewing it."""
    ws, server = served
    monkeypatch.setattr(sse, "HELD_RECHECK", 0.2)
    with Board(ws / "kanban") as board:
        board.add({"id": "held", "title": "Held", "role": "r"}, by="cli")
        doc = board.claim("worker-1", roles=["r"], lease=60)
        client = Stream(server.port)

        def lease_of(frame: dict[str, str]) -> float | None:
            picture = json.loads(frame["data"])
            return next((i["lease_until_ts"] for i in picture["board"]["columns"]["doing"]), None)

        first = lease_of(client.until(lambda f: f["event"] == "snapshot")[-1])
        assert first == doc["claim"]["lease_until_ts"]
        renewed = board.renew("held", doc["claim"]["token"], lease=600)["claim"]["lease_until_ts"]
        client.until(lambda f: f["event"] == "snapshot" and lease_of(f) == renewed, timeout=30)
        client.close()


def test_streams_opened_at_once_are_capped_too(served: tuple[Path, Server], monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap counted a stream once it ran, which is after every request already waiting was let
    through: a burst of requests opened as many streams as it held."""
    from hermes_sup.supervisor.dashboard import app

    _ws, server = served
    monkeypatch.setattr(app, "MAX_STREAMS", 2)
    request = f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode()
    burst = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(12)]
    try:
        for sock in burst:
            sock.sendall(request)
        statuses = []
        for sock in burst:
            head = b""
            while b"\r\n" not in head:
                data = sock.recv(4096)
                assert data, "the server closed a connection without an answer"
                head += data
            statuses.append(int(head.split(b" ", 2)[1]))
    finally:
        for sock in burst:
            sock.close()
    assert statuses.count(200) == 2 and statuses.count(503) == 10, statuses
    wait_until(lambda: server.dashboard.streams == 0, timeout=30)
    again = Stream(server.port)
    assert again.status == 200
    again.close()


def test_open_streams_are_capped(served: tuple[Path, Server], monkeypatch: pytest.MonkeyPatch) -> None:
    """A client opening stream after stream (each a coroutine reading files) gets 503 past the cap,
    and a closed stream frees its place."""
    from hermes_sup.supervisor.dashboard import app

    _ws, server = served
    monkeypatch.setattr(app, "MAX_STREAMS", 2)
    first, second = Stream(server.port), Stream(server.port)
    for stream in (first, second):
        stream.until(lambda f: f["event"] == "snapshot")
    third = Stream(server.port)
    assert third.status == 503
    third.close()
    first.close()
    wait_until(lambda: server.dashboard.streams == 1, timeout=30)
    again = Stream(server.port)
    assert again.status == 200
    again.close()
    second.close()


def test_the_drawers_log_follows_the_agents_journals(served: tuple[Path, Server]) -> None:
    """A task's tool calls reach the open drawer as the agent writes them, as `task log -f` prints them."""
    ws, server = served
    cli(ws, "task", "add", "Followed", "--id", "followed", "--role", "nobody")
    journal = ws / "runs" / "worker-9" / "tool_calls.jsonl"
    journal.parent.mkdir(parents=True)
    call = {"at": "2026-01-01T00:00:00Z", "task": "followed", "turn": "steps", "call_id": "step-1",
            "tool": "write_file", "args": {"path": "a.txt", "content": "<b>hi</b>"}, "status": "started"}
    journal.write_text(json.dumps(call) + "\n")
    log = Stream(server.port, path="/api/task/followed/log")
    assert log.status == 200
    first = json.loads(log.until(lambda f: f["event"] == "entry")[-1]["data"])
    assert first["kind"] == "tool" and "write_file" in first["lines"][0] and "<b>hi</b>" in first["lines"][0]
    with open(journal, "a") as handle:  # the agent goes on while the drawer is open
        handle.write(json.dumps({**call, "at": "2026-01-01T00:00:01Z", "status": "done", "outcome": "ok",
                                 "result": "wrote 9 characters to a.txt", "duration_s": 0.001}) + "\n")
    second = json.loads(log.until(lambda f: f["event"] == "entry")[-1]["data"])
    assert "wrote 9 characters to a.txt" in second["lines"][0]
    log.close()
    missing = Stream(server.port, path="/api/task/no-such-task/log")
    assert missing.status == 404
    missing.close()


def post(port: int, path: str, body: object) -> tuple[int, dict]:
    """One action as the page sends it: JSON, from the dashboard's own origin."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
                     .encode() + data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, rest = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(rest)


def test_task_actions_answer_comment_retry(served: tuple[Path, Server]) -> None:
    ws, server = served
    status, doc = post(server.port, "/api/task", {"title": "Ask me", "id": "ask-me", "role": "work", "priority": 3})
    assert status == 201 and doc["priority"] == 3
    with Board(ws / "kanban") as board:
        claimed = board.claim("worker-1", roles=["work"])
        assert claimed is not None and claimed["id"] == "ask-me"
        board.block("ask-me", claimed["claim"]["token"], "needs a person", question="Which quarter?")
    status, doc = post(server.port, "/api/task/ask/answer", {"text": "Q3"})  # a unique prefix, as the CLI takes
    assert status == 200 and doc["status"] == "todo" and doc["comments"][-1]["text"] == "Q3"
    status, doc = post(server.port, "/api/task/ask-me/comment", {"text": "thanks <b>all</b>"})
    assert status == 200 and doc["comments"][-1] == {**doc["comments"][-1], "text": "thanks <b>all</b>",
                                                     "by": "dashboard"}
    assert post(server.port, "/api/task/ask-me/comment", {"text": "   "})[0] == 400
    assert post(server.port, "/api/task/ask-me/comment", {"text": 7})[0] == 400
    assert post(server.port, "/api/task/ask-me/retry", {})[0] == 409  # in todo: nothing to retry
    assert post(server.port, "/api/task/ask-me/cancel", {})[1]["status"] == "cancelled"
    assert post(server.port, "/api/task/ask-me/retry", {})[1]["status"] == "todo"
    assert post(server.port, "/api/task/ask-me/explode", {})[0] == 404
    for bad in ([], {"title": ""}, {"title": "x", "priority": "high"}, {"title": "x", "depends_on": "a"},
                {"title": "x", "priority": True}):
        status, reply = post(server.port, "/api/task", bad)
        assert status == 400 and reply["error"], bad
    events = [json.loads(line) for line in (ws / "kanban" / "events.jsonl").read_text().splitlines()]
    mine = [(e["to"], e["by"]) for e in events if e.get("by") == "dashboard"]
    assert mine == [("todo", "dashboard"), ("todo", "dashboard"), ("cancelled", "dashboard"), ("todo", "dashboard")]


def test_guard_refuses_what_it_must(tmp_path: Path) -> None:
    """A non-loopback bind without a token does not start; with one, every request needs it, and
    an action needs the dashboard's own origin too."""
    ws = init(tmp_path / "ws")
    refused = cli(ws, "dashboard", "--host", "0.0.0.0", "--port", "0", check=False, timeout=30)
    assert refused.returncode == 2 and "not a loopback address" in refused.stderr and "--token-env" in refused.stderr
    unset = cli(ws, "dashboard", "--host", "0.0.0.0", "--port", "0", "--token-env", "NO_SUCH_VAR_HERE",
                check=False, timeout=30)
    assert unset.returncode == 2 and "not set" in unset.stderr
    short = cli(ws, "dashboard", "--host", "0.0.0.0", "--port", "0", "--token-env", "T", env={"T": "short"},
                check=False, timeout=30)
    assert short.returncode == 2 and "shorter" in short.stderr

    # The token is checked whatever the bind (a loopback one with --token-env too): bound on loopback
    # here, so that the suite opens nothing beyond 127.0.0.1.
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0, token=TOKEN))
    server.start_thread()
    try:
        wait_until(lambda: server.server.started, timeout=30)
        base = f"127.0.0.1:{server.port}"
        taken = cli(ws, "dashboard", "--port", str(server.port), check=False, timeout=30)
        assert taken.returncode == 1 and f"cannot listen on 127.0.0.1:{server.port}" in taken.stderr

        def ask(method: str, path: str, headers: dict[str, str], body: bytes = b"",
                length: int | None = None) -> tuple[int, dict]:
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": base, **headers}.items())
                sock.sendall(f"{method} {path} HTTP/1.1\r\n{head}Content-Length: {length or len(body)}\r\n"
                             f"Connection: close\r\n\r\n".encode() + body)
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            top, _, rest = data.partition(b"\r\n\r\n")
            return int(top.split(b" ")[1]), json.loads(rest) if rest.startswith(b"{") else {}

        for path in ("/", "/api/snapshot", "/api/events", "/static/app.js"):
            status, reply = ask("GET", path, {})
            assert status == 401 and "token" in reply["error"], path
        assert ask("GET", "/api/snapshot", {"Authorization": "Bearer wrong-token-wrong-token-wrong"})[0] == 401
        assert ask("GET", "/api/snapshot", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert ask("GET", "/api/snapshot", {"Cookie": f"{security.TOKEN_COOKIE}={TOKEN}"})[0] == 200
        # The address bar's token becomes a cookie, and leaves the address bar.
        status, _ = ask("GET", f"/?token={TOKEN}", {})
        assert status == 303
        body = json.dumps({"title": "from a script"}).encode()
        json_type = {"Content-Type": "application/json"}
        cookie = {"Cookie": f"{security.TOKEN_COOKIE}={TOKEN}"}
        # Another site's page, with the victim's cookie: refused.
        assert ask("POST", "/api/task", {**cookie, **json_type, "Origin": "http://evil.example"}, body)[0] == 403
        # A cookie alone, no Origin (a form from nowhere): refused.
        assert ask("POST", "/api/task", {**cookie, **json_type}, body)[0] == 403
        # An action without the token at all: 401 before anything else.
        assert ask("POST", "/api/task", {**json_type, "Origin": f"http://{base}"}, body)[0] == 401
        # Not JSON, or too big: refused with a JSON error, nothing added.
        status, reply = ask("POST", "/api/task", {**cookie, "Origin": f"http://{base}",
                                                  "Content-Type": "text/plain"}, body)
        assert status == 415 and "application/json" in reply["error"]
        # (announced: refused before it is sent)
        status, reply = ask("POST", "/api/task", {**cookie, **json_type, "Origin": f"http://{base}"}, b"",
                            length=2 << 20)
        assert status == 413 and "error" in reply
        status, reply = ask("POST", "/api/task", {**cookie, **json_type, "Origin": f"http://{base}"}, b"{not json")
        assert status == 400 and reply == {"error": "the body is not JSON"}
        with Board(ws / "kanban") as board:
            assert board.counts()["todo"] == 0
        # The page's own origin with the cookie, or a script with the bearer token: done, and
        # recorded in events as the CLI's actions are, by the dashboard.
        status, doc = ask("POST", "/api/task", {**cookie, **json_type, "Origin": f"http://{base}"}, body)
        assert status == 201 and doc["status"] == "todo"
        status, doc = ask("POST", f"/api/task/{doc['id']}/cancel", {"Authorization": f"Bearer {TOKEN}", **json_type})
        assert status == 200 and doc["status"] == "cancelled"
        log = [json.loads(line) for line in (ws / "kanban" / "events.jsonl").read_text().splitlines()]
        assert [(e["to"], e["by"]) for e in log] == [("todo", "dashboard"), ("cancelled", "dashboard")]
        # Errors are JSON, never a traceback.
        status, reply = ask("POST", "/api/task/no-such-task/cancel", {**cookie, **json_type, "Origin": f"http://{base}"})
        assert status == 404 and "no-such-task" in reply["error"]
        status, reply = ask("POST", "/api/agent/nobody/restart", {**cookie, **json_type, "Origin": f"http://{base}"})
        assert status == 409 and "not running" in reply["error"]
    finally:
        server.stop()


def test_loopback_answers_only_a_loopback_host() -> None:
    """DNS rebinding: a page on evil.example resolved to 127.0.0.1 sends its own name as Host."""
    verdict = security.judge(method="GET", is_action=False, host_header="evil.example:8765", origin=None,
                             scheme="http", bound_loopback=True, expected_token=None, header_token=None,
                             cookie_token=None, query_token=None)
    assert verdict.status == 403
    for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765"):
        assert security.judge(method="GET", is_action=False, host_header=host, origin=None, scheme="http",
                              bound_loopback=True, expected_token=None, header_token=None, cookie_token=None,
                              query_token=None).status == 0


def _remote(token: str | None = None, *, where: str = "header", method: str = "GET", is_action: bool = False,
            origin: str | None = None) -> security.Verdict:
    """One request to a dashboard bound beyond loopback (any Host goes: the token decides), carrying
    `token` the way `where` names: Authorization header, cookie or the address bar's ?token=."""
    return security.judge(method=method, is_action=is_action, host_header="dash.example:8765", origin=origin,
                          scheme="http", bound_loopback=False, expected_token=TOKEN,
                          header_token=token if where == "header" else None,
                          cookie_token=token if where == "cookie" else None,
                          query_token=token if where == "query" else None)


@pytest.mark.parametrize("where", ["header", "cookie", "query"])
def test_a_non_loopback_bind_serves_only_the_token(where: str) -> None:
    # Beyond loopback the Host proves nothing (anyone on the network picks it): every request must
    # carry the token, in any of the three places the Guard reads it from.
    assert _remote(None, where=where).status == 401
    assert _remote("", where=where).status == 401
    assert _remote("wrong-token-wrong-token-wrong", where=where).status == 401
    assert _remote(TOKEN[:-1], where=where).status == 401  # a prefix is not the token
    assert _remote(TOKEN, where=where) == security.ALLOWED
    # An action: the token first (401 without it, whatever the Origin), then the Origin rules.
    page = "http://dash.example:8765"
    assert _remote(None, where=where, method="POST", is_action=True, origin=page).status == 401
    assert _remote("wrong-token-wrong-token-wrong", where=where, method="POST", is_action=True,
                   origin=page).status == 401
    assert _remote(TOKEN, where=where, method="POST", is_action=True, origin=page) == security.ALLOWED
    assert _remote(TOKEN, where=where, method="POST", is_action=True, origin="http://evil.example").status == 403


def test_a_non_loopback_action_without_origin_needs_the_bearer_token() -> None:
    # A script (no Origin) shows the token itself; a cookie alone would let any page's form act.
    assert _remote(TOKEN, where="header", method="POST", is_action=True) == security.ALLOWED
    assert _remote(TOKEN, where="cookie", method="POST", is_action=True).status == 403
    assert _remote(None, where="header", method="POST", is_action=True).status == 401


@pytest.mark.parametrize("host", ["[::1]evil.example", "[::1]evil.example:80", "localhost:evil.example",
                                  "127.0.0.1:80:80", "[::1]:", "localhost:"])
def test_a_host_header_with_anything_but_a_port_after_a_loopback_name_is_refused(host: str) -> None:
    # What follows the name must be a port: a Host that merely starts with a loopback name is not one.
    assert not security.host_allowed(host, bound_loopback=True)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False),
    ("127.0.0.1.evil.example", False), ("localhost.evil.example", False), ("", False)])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert security.is_loopback(host) is loopback


def test_origin_and_token_decisions() -> None:
    assert security.split_host("[::1]:8765") == ("::1", "8765")
    assert security.split_host("localhost") == ("localhost", "")
    assert security.same_origin("http://127.0.0.1:8765", "127.0.0.1:8765", "http")
    assert not security.same_origin("http://127.0.0.1:8766", "127.0.0.1:8765", "http")
    assert not security.same_origin("https://127.0.0.1:8765", "127.0.0.1:8765", "http")
    assert not security.same_origin("null", "127.0.0.1:8765", "http")  # a sandboxed frame, a file: page
    assert security.bearer("Bearer abc") == "abc" and security.bearer("Basic abc") is None
    assert security.bearer("Bearer ") is None and security.bearer(None) is None
    assert security.token_matches(None, None) and not security.token_matches("secret", None)
    assert not security.token_matches("secret", "secreT") and security.token_matches("secret", "secret")
    with pytest.raises(security.BindError, match="not a loopback"):
        security.check_bind("0.0.0.0", None, None)
    security.check_bind("0.0.0.0", "VAR", "x" * security.MIN_TOKEN)
    security.check_bind("localhost", None, None)


# -- in a real browser -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (or set HERMES_SUP_CHROMIUM "
                    f"to a Chromium binary); the dashboard's browser tests never skip")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The example team running under `up --dashboard` (on a free port), and the page's address."""
    from hermes_sup.supervisor.sweep import sweep

    where = tmp_path_factory.mktemp("dashboard")
    ws = make_workspace(where)
    with open(where / "up.log", "w") as log:
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up", "--dashboard", "--dashboard-port", "0"], stdout=log,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        try:
            said = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/)")
            url = wait_until(lambda: (said.findall((where / "up.log").read_text()) or [None])[0], timeout=60)
            agents = lambda: supervisor_state(ws).get("agents") or {}  # noqa: E731
            wait_until(lambda: agents() and all(a["state"] == "running" for a in agents().values()), timeout=60)
            yield ws, str(url)
        finally:
            stop_process(proc)
            sweep(ws, ws / "runs", 0)


@pytest.fixture
def page(browser, team, request: pytest.FixtureRequest) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(str(exc)))
    tab.goto(team[1])
    tab.wait_for_selector("#live[data-state='live']", timeout=30_000)
    tab.wait_for_selector("#board .column[data-status='todo']", timeout=30_000)
    yield tab
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert problems == []


def card_in(page, status: str, task_id: str):
    return page.locator(f"#board .column[data-status='{status}'] .card[data-id='{task_id}']")


def test_a_dropped_task_appears_and_moves_to_done_without_a_reload(page, team) -> None:
    from playwright.sync_api import expect

    ws, _url = team
    api_calls: list[str] = []
    page.on("request", lambda r: api_calls.append(r.url) if "/api/" in r.url else None)
    page.evaluate("window.__same_page = 'yes'")
    # The gate holds the dropped task in todo (with its reason) until a person says the gate is done.
    cli(ws, "task", "add", "Gate", "--id", "gate", "--role", "nobody")
    drop(ws, "dropped", {"id": "dropped", "title": "Dropped in the inbox", "role": "work", "depends_on": ["gate"],
                         "steps": [{"tool": "write_file", "args": {"path": "dropped.txt", "content": "hi"}}]})
    card = card_in(page, "todo", "dropped")
    expect(card).to_be_visible(timeout=30_000)
    expect(card.locator(".why")).to_contain_text("gate", timeout=30_000)
    cli(ws, "task", "move", "gate", "done")
    expect(card_in(page, "done", "dropped")).to_be_visible(timeout=60_000)
    expect(card_in(page, "todo", "dropped")).to_have_count(0)
    assert page.evaluate("window.__same_page") == "yes"  # no reload
    assert not [url for url in api_calls if "/api/events" not in url]  # nor any poll of the board
    # Its drawer: the history, and the tool calls of its steps as `task log` prints them.
    card_in(page, "done", "dropped").click()
    expect(page.locator("#d-history")).to_contain_text("doing → done", timeout=30_000)
    expect(page.locator("#d-log")).to_contain_text("write_file -> ok", timeout=30_000)


def test_kill_9_an_agent_and_its_restart_count_changes(page, team) -> None:
    from playwright.sync_api import expect

    ws, _url = team
    agent = supervisor_state(ws)["agents"]["worker-2"]
    cell = page.locator("#agents tr[data-agent='worker-2'] .restarts")
    expect(cell).to_have_text(str(agent["restarts"]), timeout=30_000)
    os.kill(agent["pid"], signal.SIGKILL)
    wait_until(lambda: gone(agent["pid"]), timeout=30)
    expect(cell).to_have_text(str(agent["restarts"] + 1), timeout=60_000)
    expect(page.locator("#agents tr[data-agent='worker-2'] .state")).to_have_text("running", timeout=60_000)


def test_cancel_a_task_from_the_page(page, team) -> None:
    from playwright.sync_api import expect

    ws, _url = team
    cli(ws, "task", "add", "Cancel me from the page", "--id", "cancel-me", "--role", "nobody")
    card_in(page, "todo", "cancel-me").click(timeout=30_000)
    expect(page.locator("#d-id")).to_have_text("cancel-me", timeout=30_000)
    page.locator("#d-actions button[data-command='cancel']").click()
    expect(card_in(page, "cancelled", "cancel-me")).to_be_visible(timeout=30_000)
    expect(page.locator("#d-status")).to_have_text("cancelled", timeout=30_000)
    events = [json.loads(line) for line in (ws / "kanban" / "events.jsonl").read_text().splitlines()]
    assert {"task": "cancel-me", "to": "cancelled", "by": "dashboard"}.items() <= next(
        e for e in events if e.get("task") == "cancel-me" and e.get("to") == "cancelled").items()


def test_a_script_title_renders_as_text(page, team) -> None:
    from playwright.sync_api import expect

    ws, _url = team
    title = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    cli(ws, "task", "add", title, "--id", "markup", "--role", "nobody", "--body", "<b>bold?</b>")
    card = card_in(page, "todo", "markup")
    expect(card.locator(".title")).to_have_text(title, timeout=30_000)
    assert card.locator("script, img, b").count() == 0
    card.click()
    expect(page.locator("#d-title")).to_have_text(title, timeout=30_000)
    assert page.locator("#drawer script, #drawer img, #drawer b").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_recent_events_are_the_newest_complete_ones(tmp_path: Path) -> None:
    """Read through the protocol from the stream's end (a window that starts inside a line)."""
    from hermes_sup.supervisor.dashboard import views

    with Board(tmp_path / "kanban") as board:
        assert views.recent_events(board) == []
        for number in range(40):
            board.add({"id": f"t{number}", "title": "x" * 500}, by="cli")
        with open(board.events_path, "ab") as handle:
            handle.write(b'{"at": "torn')  # a line being written is no event yet
        recent = views.recent_events(board, 5)
        assert [event["task"] for event in recent] == ["t35", "t36", "t37", "t38", "t39"]
        assert [event["task"] for event in views.recent_events(board, 100)] == [f"t{n}" for n in range(40)]


def test_stop_and_start_an_agent_from_the_page(page, team) -> None:
    from playwright.sync_api import expect

    ws, _url = team
    row = page.locator("#agents tr[data-agent='worker-1']")
    expect(row.locator(".state")).to_have_text("running", timeout=30_000)
    row.locator("button[data-command='stop']").click()
    expect(row.locator(".state")).to_have_text("stopped (held)", timeout=60_000)
    assert supervisor_state(ws)["agents"]["worker-1"]["held"] is True
    row.locator("button[data-command='start']").click()
    expect(row.locator(".state")).to_have_text("running", timeout=60_000)
    expect(page.locator("#message")).to_contain_text("start worker-1", timeout=30_000)


def test_recent_events_read_as_the_events_command_prints_them(page, team) -> None:
    """A supervisor's events (an agent stopped and started by a person) in their own words, not
    squeezed into a transition's `FROM -> TO by WHO` (which read `worker-1 - -> - by - ...`)."""
    from hermes_sup.supervisor.views.render import event_line
    from playwright.sync_api import expect

    ws, _url = team
    cli(ws, "stop", "worker-1")
    cli(ws, "start", "worker-1")
    wait_until(lambda: supervisor_state(ws)["agents"]["worker-1"]["state"] == "running", timeout=60)
    printed = cli(ws, "events").stdout.splitlines()
    records = [json.loads(line) for line in (ws / "kanban" / "events.jsonl").read_text().splitlines()]
    ours = [r for r in records if r.get("kind") == "supervisor" and r.get("agent") == "worker-1"]
    assert ours, records[-5:]
    items = page.locator("#events li")
    for record in ours[-2:]:
        line = event_line(record)
        assert line in printed  # the very line `events` prints
        expect(items.filter(has_text=line)).to_have_count(1, timeout=30_000)
        assert record["event"] in line and "-> - by -" not in line
    assert not [text for text in items.all_inner_texts() if "- → - by -" in text or "-> - by -" in text]


def test_up_detach_serves_the_dashboard_until_down(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    try:
        up = cli(ws, "up", "--detach", "--dashboard", "--dashboard-port", "0", timeout=120)
        said = re.compile(r"dashboard: http://127\.0\.0\.1:(\d+)/")
        port = int(wait_until(lambda: (said.findall((ws / "runs" / "supervisor.log").read_text()) or [None])[0],
                              timeout=60))
        assert f"dashboard: http://127.0.0.1:{port}/" in up.stderr, "the port chosen, said where it was asked for"
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"GET /api/snapshot HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["supervisor"]["running"] is True
    finally:
        cli(ws, "down", "--timeout", "10", check=False, timeout=120)
    with pytest.raises(ConnectionRefusedError):  # gone with the supervisor
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_with_a_token_the_page_works_once_opened_with_it(browser, tmp_path: Path) -> None:
    """The token given once in the address becomes a cookie: the page, its stream and its actions
    work, the address bar no longer shows it, and a page opened without it gets 401."""
    from playwright.sync_api import expect

    ws = init(tmp_path / "ws")
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0, token=TOKEN))
    server.start_thread()
    context = browser.new_context()
    try:
        wait_until(lambda: server.server.started, timeout=30)
        page = context.new_page()
        assert page.goto(f"http://127.0.0.1:{server.port}/").status == 401
        page.goto(f"http://127.0.0.1:{server.port}/?token={TOKEN}")
        assert page.url == f"http://127.0.0.1:{server.port}/"
        expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=30_000)
        page.fill("#add-title", "Added with a token")
        page.click("#add-form button[type=submit]")
        expect(page.locator("#board .column[data-status='todo'] .card .title")).to_have_text(
            "Added with a token", timeout=30_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "test_with_a_token.png"), full_page=True)
    finally:
        context.close()
        server.stop()


OTHER_USER_CLIENT = """
import http.client, json, sys
port = int(sys.argv[1])
out = []
for method, path, body in (("GET", "/api/snapshot", None), ("POST", "/api/task", '{"title": "from another user"}')):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body, headers={"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}",
                                                   "Content-Type": "application/json"})
    response = conn.getresponse()
    out.append([response.status, response.read().decode()])
print(json.dumps(out))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root to become one")
def test_a_tokenless_dashboard_refuses_another_user_of_the_machine(served: tuple[Path, Server]) -> None:
    """Another user reaches 127.0.0.1 too, and sends whatever Origin it likes: it read every task and
    transcript and steered the team (a task with steps runs as this user)."""
    ws, server = served
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # one the other user may run
    done = subprocess.run([python, "-I", "-c", OTHER_USER_CLIENT, str(server.port)], user=65534, group=65534,
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert [status for status, _ in answers] == [403, 403], answers
    assert "answers only to the user running it" in answers[0][1]
    assert "from another user" not in json.dumps(Board(ws / "kanban").list().tasks, ensure_ascii=False)
    conn_ok = Stream(server.port)  # this user still is served
    assert conn_ok.status == 200
    conn_ok.close()


def test_peer_uid_reads_the_kernels_socket_tables() -> None:
    tcp = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
           "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1\n"
           "   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 2 1\n")
    tcp6 = ("  sl  local_address                         remote_address                        st tx_queue rx_queue "
            "tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 00000000000000000000000001000000:D432 00000000000000000000000001000000:1F90 01 00000000:00000000 "
            "00:00000000 00000000  1002        0 3 1\n")
    assert security.peer_uid([tcp, tcp6], ("127.0.0.1", 0xD431), ("127.0.0.1", 8080)) == 1001
    assert security.peer_uid([tcp, tcp6], ("::1", 0xD432), ("::1", 8080)) == 1002
    assert security.peer_uid([tcp, tcp6], ("127.0.0.1", 0xD439), ("127.0.0.1", 8080)) is None
    assert security.same_user(1000, 1000) and security.same_user(0, 1000)
    assert not security.same_user(1001, 1000) and not security.same_user(None, 1000)


def test_recent_events_look_back_a_bounded_window_whatever_precedes_the_end(tmp_path: Path) -> None:
    """Records that are no events (anyone who can append to the stream can write them: a host on
    the shared board, a local user) made the window double until it reached the stream's start: each
    picture of every open page then read the whole stream. The look back is bounded."""
    from hermes_sup.supervisor.dashboard import views

    class Counting:
        """The real board, with the span of cursor each events_since read added up."""

        def __init__(self, board: Board) -> None:
            self.board, self.read = board, 0

        def events_end(self) -> int:
            return self.board.events_end()

        def events_since(self, cursor: int, **kwargs: Any) -> Any:
            batch = self.board.events_since(cursor, **kwargs)
            self.read += batch.cursor - cursor
            return batch

    with Board(tmp_path / "kanban") as board:
        board.add({"id": "early", "title": "x"}, by="cli")
        with open(board.events_path, "ab") as handle:
            handle.write(b'{"kind": "not-ours"}\n' * 400_000)  # 8.4 MB after the one real event
        counting = Counting(board)
        assert views.recent_events(counting) == []  # the real one is too far back to be looked for
        assert counting.read <= 2 * views.MAX_RECENT_WINDOW


def test_up_detach_with_the_dashboards_port_taken_says_why_on_the_terminal(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*CLI, "-w", str(ws), "up", "--detach", "--dashboard", "--dashboard-port", str(port)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1
    assert f"error: dashboard: cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "supervisor.log" in done.stderr
