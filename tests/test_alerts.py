"""Alerts (contract section 11): `alerts:` checked with file:line, which events raise which alert (pure),
and with a real supervisor and a webhook on 127.0.0.1: the alerts arrive signed (HMAC-SHA256 over the
body, verified here), a webhook that fails twice gets each alert once with the retries recorded in
events, an unreachable one never slows the supervisor, and the URL and secret reach no file."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import secrets
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.events import agent_event, append_record, decode_event, read_since
from hermes_sup.supervisor.config.workspace import ConfigError, load_config
from hermes_sup.supervisor.governance.alerts import (
    SIGNATURE_HEADER,
    alert_body,
    alert_for,
    exposed,
    post,
    retry_delay,
    rules_of,
    signature,
    worth_retrying,
)

from .conftest import gone, supervisor_state, wait_until
from .test_events import hermes, make_ws

FAKE = Path(__file__).resolve().parent / "fake_agent.py"
URL_ENV, SECRET_ENV = "HERMES_SUP_ALERT_URL", "HERMES_SUP_ALERT_SECRET"
AT = "2026-01-01T00:00:00Z"


# -- configuration and decisions (pure) ---------------------------------------------------------------

def config_with(tmp_path: Path, alerts: str) -> Path:
    path = tmp_path / "hermes.yaml"
    path.write_text("agents:\n  - name: w\n" + alerts)
    return path


@pytest.mark.parametrize(("alerts", "line", "message"), [
    ("alerts: {webhook_env: X}\n", 3, "'alerts' must be a list"),
    ("alerts:\n  - {webhook_env: U, secret_env: S, on: [agent_fatal], retries: 3}\n", 4, "unknown key 'retries'"),
    ("alerts:\n  - webhook_env: 'https://hooks.example/T0K3N-SECRET-PART'\n    secret_env: S\n    on: [task_failed]\n",
     4, "'webhook_env' must name an environment variable"),
    ("alerts:\n  - {webhook_env: U, secret_env: S, on: []}\n", 4, "'on' must list"),
    ("alerts:\n  - {webhook_env: U, secret_env: S, on: [agent_fatal, task_done]}\n", 4, "unknown alert 'task_done'"),
    ("alerts:\n  - {webhook_env: U, on: [agent_fatal]}\n", 4, "'secret_env' must name"),
])
def test_alerts_config_errors_name_file_and_line_and_never_echo_a_url(tmp_path, alerts, line, message):
    path = config_with(tmp_path, alerts)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}:{line}: ") and message in str(caught.value), str(caught.value)
    assert "T0K3N" not in str(caught.value)


def test_a_good_alerts_config_gives_its_rules(tmp_path):
    config = load_config(config_with(tmp_path, f"alerts:\n  - {{webhook_env: {URL_ENV}, secret_env: {SECRET_ENV}, "
                                               f"on: [agent_fatal, task_blocked]}}\n"))
    [rule] = rules_of(config)
    assert (rule.webhook_env, rule.secret_env, rule.on) == (URL_ENV, SECRET_ENV, {"agent_fatal", "task_blocked"})


def test_which_event_raises_which_alert():
    assert alert_for({"kind": "board", "task": "t", "from": "doing", "to": "failed"}) == "task_failed"
    assert alert_for({"task": "t", "from": "doing", "to": "blocked"}) == "task_blocked"
    assert alert_for({"kind": "board", "task": "t", "from": "doing", "to": "done"}) is None
    assert alert_for({"kind": "supervisor", "event": "fatal", "agent": "w"}) == "agent_fatal"
    assert alert_for({"kind": "supervisor", "event": "exited", "agent": "w"}) is None
    assert alert_for(agent_event(AT, "w", "provider_down", "3 failures", provider="cloud")) == "provider_down"
    assert alert_for(agent_event(AT, "w", "budget_reached", "team per_day 20")) == "budget_reached"
    assert alert_for({"kind": "supervisor", "event": "provider_down"}) is None  # agents report their providers
    with pytest.raises(ValueError):
        agent_event(AT, "w", "provider_sideways", "")
    # The alerts' own events never raise one: a failing webhook cannot feed itself.
    assert alert_for({"kind": "alert", "event": "fatal", "to": "failed"}) is None


def test_signature_backoff_and_what_is_retried():
    body = alert_body("task_failed", 42, {"kind": "board", "task": "t"}, "/ws")
    assert json.loads(body) == {"alert": "task_failed", "cursor": 42, "workspace": "/ws",
                                "event": {"kind": "board", "task": "t"}}
    assert signature("s3cret", body) == "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    rng = random.Random(3)
    delays = [retry_delay(n, rng) for n in (1, 2, 3, 4)]
    assert 0.5 <= delays[0] <= 1 and 1 <= delays[1] <= 2 and 2 <= delays[2] <= 4 and 4 <= delays[3] <= 8
    assert retry_delay(30, rng) <= 30
    assert worth_retrying(None) and worth_retrying(500) and worth_retrying(429) and not worth_retrying(400)


# -- with a real supervisor and webhook ---------------------------------------------------------------

class Hook:
    """A webhook on 127.0.0.1 answering each POST with the next status of `script` (then 200)."""

    def __init__(self, script: list[int] | None = None) -> None:
        self.script = list(script or [])
        self.received: list[tuple[dict[str, str], bytes, int]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = hook.script.pop(0) if hook.script else 200
                hook.received.append((dict(self.headers), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.token = "tok" + secrets.token_hex(12)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/{self.token}"

    def accepted(self) -> list[tuple[dict[str, str], bytes, int]]:
        return [item for item in self.received if item[2] == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    made: list[Hook] = []

    def make(script: list[int] | None = None) -> Hook:
        made.append(Hook(script))
        return made[-1]

    yield make
    for one in made:
        one.close()


def alert_team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, on: str,
               agents: str = "") -> tuple[Path, str]:
    secret = secrets.token_hex(16)
    monkeypatch.setenv(URL_ENV, url)
    monkeypatch.setenv(SECRET_ENV, secret)
    ws = make_ws(tmp_path, agents or f"- name: a\n  command: [{sys.executable}, {FAKE}, beat]\n")
    rule = f"alerts:\n  - {{webhook_env: {URL_ENV}, secret_env: {SECRET_ENV}, on: [{on}]}}\n"
    (ws / "hermes.yaml").write_text((ws / "hermes.yaml").read_text() + rule)
    return ws, secret


def alert_events(ws: Path) -> list[dict]:
    return [r for _, r in read_since(ws / "kanban" / "events.jsonl", 0).events if r["kind"] == "alert"]


def running(ws: Path, name: str) -> dict:
    info = supervisor_state(ws).get("agents", {}).get(name, {})
    return info if info.get("state") == "running" else {}


def test_alerts_arrive_signed_for_a_fatal_agent_a_failed_and_a_blocked_task_and_no_file_holds_url_or_secret(
        tmp_path, monkeypatch, up, hook):
    receiver = hook()
    agents = (f"- name: a\n  command: [{sys.executable}, {FAKE}, beat]\n"
              f"- name: crash\n  command: [{sys.executable}, {FAKE}, exit]\n  restart: {{max_restarts: 0}}\n")
    ws, secret = alert_team(tmp_path, monkeypatch, receiver.url, "agent_fatal, task_failed, task_blocked", agents)
    up(ws)
    wait_until(lambda: running(ws, "a"), timeout=60)
    board = Board(ws / "kanban")
    try:
        for name, to in (("will-fail", "failed"), ("will-block", "blocked"), ("will-finish", "done")):
            board.add({"title": name, "id": name, "role": "nobody"})
            board.move(name, to)
    finally:
        board.close()
    wait_until(lambda: len(receiver.accepted()) == 3, timeout=60)
    bodies = []
    for headers, body, _ in receiver.received:
        assert hmac.compare_digest(headers[SIGNATURE_HEADER],
                                   "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest())
        assert headers["Content-Type"] == "application/json"
        bodies.append(json.loads(body))
    by_alert = {doc["alert"]: doc for doc in bodies}
    assert set(by_alert) == {"agent_fatal", "task_failed", "task_blocked"}, bodies
    assert by_alert["agent_fatal"]["event"]["agent"] == "crash"
    assert by_alert["task_failed"]["event"]["task"] == "will-fail"
    assert by_alert["task_blocked"]["event"]["to"] == "blocked"
    wait_until(lambda: len([r for r in alert_events(ws) if r["event"] == "alert_sent"]) == 3, timeout=30)
    shown = hermes(ws, "events")
    assert shown.stdout.count("  alert  alert_sent  ") == 3 and f"to ${URL_ENV}: HTTP 200" in shown.stdout
    assert hermes(ws, "down").returncode == 0
    for path in [*tmp_path.rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            assert receiver.token.encode() not in data and secret.encode() not in data, path


def test_a_webhook_failing_twice_gets_the_alert_once_with_the_retries_recorded(tmp_path, monkeypatch, up, hook):
    receiver = hook([500, 503])
    ws, _ = alert_team(tmp_path, monkeypatch, receiver.url, "task_failed")
    up(ws)
    board = Board(ws / "kanban")
    try:
        board.add({"title": "x", "id": "doomed", "role": "nobody"})
        board.move("doomed", "failed")
    finally:
        board.close()
    wait_until(lambda: any(r["event"] == "alert_sent" for r in alert_events(ws)), timeout=60)
    assert [status for _, _, status in receiver.received] == [500, 503, 200]
    assert len({body for _, body, _ in receiver.received}) == 1, "the same alert each time"
    assert [h["X-Hermes-Sup-Attempt"] for h, _, _ in receiver.received] == ["1", "2", "3"]
    trail = [(r["event"], r["attempt"], r["status"]) for r in alert_events(ws)]
    assert trail == [("alert_failed", 1, 500), ("alert_failed", 2, 503), ("alert_sent", 3, 200)]
    assert all(r["alert"] == "task_failed" and r["delay"] > 0 for r in alert_events(ws)[:2])


def test_no_agent_is_given_the_webhooks_url_or_secret(tmp_path, monkeypatch, up, hook):
    receiver = hook()
    shell = f"env > seen-env.txt; exec {sys.executable} {FAKE} beat"
    ws, secret = alert_team(tmp_path, monkeypatch, receiver.url, "task_failed",
                            f"- name: a\n  command: [/bin/sh, -c, '{shell}']\n")
    up(ws)
    wait_until(lambda: running(ws, "a"), timeout=60)
    seen = (ws / "runs" / "a" / "seen-env.txt").read_text()
    assert "HERMES_SUP_AGENT=" in seen  # what an agent is given is there
    assert URL_ENV not in seen and SECRET_ENV not in seen and receiver.token not in seen and secret not in seen


def test_an_agent_started_after_a_reload_removed_the_webhook_is_not_given_its_url_or_secret(
        tmp_path, monkeypatch, up, hook):
    # The variables stay in the supervisor's environment: only the rules of the moment were kept
    # from the agents, so the first restart after the reload handed both to the agent (its shell).
    receiver = hook()
    shell = f"env > seen-env.txt; exec {sys.executable} {FAKE} beat"
    ws, secret = alert_team(tmp_path, monkeypatch, receiver.url, "task_failed",
                            f"- name: a\n  command: [/bin/sh, -c, '{shell}']\n")
    up(ws)
    first = wait_until(lambda: running(ws, "a"), timeout=60)["pid"]
    (ws / "hermes.yaml").write_text((ws / "hermes.yaml").read_text().split("alerts:")[0])
    assert hermes(ws, "reload").returncode == 0
    (ws / "runs" / "a" / "seen-env.txt").unlink()
    assert hermes(ws, "restart", "a").returncode == 0
    wait_until(lambda: running(ws, "a").get("pid") not in (None, first), timeout=60)
    seen = wait_until(lambda: (ws / "runs" / "a" / "seen-env.txt").exists()
                      and (ws / "runs" / "a" / "seen-env.txt").read_text(), timeout=30)
    assert "HERMES_SUP_AGENT=" in seen
    assert URL_ENV not in seen and SECRET_ENV not in seen and receiver.token not in seen and secret not in seen


def test_which_agents_hold_a_withheld_variable():
    started_with = {"a": frozenset({"PATH", URL_ENV}), "b": frozenset({"PATH"}), "c": None}
    assert exposed(started_with, {URL_ENV, SECRET_ENV}) == ["a", "c"]  # c: not known, so it may
    assert exposed(started_with, set()) == []


def test_an_agent_running_when_a_reload_adds_a_webhook_is_restarted_without_its_url_or_secret(
        tmp_path, monkeypatch, up, hook):
    # Started before the webhook was named, the agent (and its shell) got both variables; a reload
    # cannot take them back from a running process.
    receiver = hook()
    shell = f"env > seen-env.txt; exec {sys.executable} {FAKE} beat"
    ws, secret = alert_team(tmp_path, monkeypatch, receiver.url, "task_failed",
                            f"- name: a\n  command: [/bin/sh, -c, '{shell}']\n")
    with_alerts = (ws / "hermes.yaml").read_text()
    (ws / "hermes.yaml").write_text(with_alerts.split("alerts:")[0])
    up(ws)
    first = wait_until(lambda: running(ws, "a"), timeout=60)["pid"]
    assert secret in (ws / "runs" / "a" / "seen-env.txt").read_text()  # what the test is about
    (ws / "runs" / "a" / "seen-env.txt").unlink()
    (ws / "hermes.yaml").write_text(with_alerts)
    assert hermes(ws, "reload").returncode == 0
    wait_until(lambda: running(ws, "a").get("pid") not in (None, first), timeout=60)
    wait_until(lambda: gone(first), timeout=30)
    seen = wait_until(lambda: (ws / "runs" / "a" / "seen-env.txt").exists()
                      and (ws / "runs" / "a" / "seen-env.txt").read_text(), timeout=30)
    assert "HERMES_SUP_AGENT=" in seen
    assert URL_ENV not in seen and SECRET_ENV not in seen and receiver.token not in seen and secret not in seen


def test_an_agent_a_killed_supervisor_left_is_restarted_by_a_new_one_whose_webhook_it_holds(
        tmp_path, monkeypatch, up, hook):
    receiver = hook()
    shell = f"env > seen-env.txt; exec {sys.executable} {FAKE} beat"
    ws, secret = alert_team(tmp_path, monkeypatch, receiver.url, "task_failed",
                            f"- name: a\n  command: [/bin/sh, -c, '{shell}']\n")
    with_alerts = (ws / "hermes.yaml").read_text()
    (ws / "hermes.yaml").write_text(with_alerts.split("alerts:")[0])
    old = up(ws)
    first = wait_until(lambda: running(ws, "a"), timeout=60)["pid"]
    assert secret in (ws / "runs" / "a" / "seen-env.txt").read_text()
    old.kill()
    old.wait(timeout=10)
    (ws / "runs" / "a" / "seen-env.txt").unlink()
    (ws / "hermes.yaml").write_text(with_alerts)
    up(ws)
    wait_until(lambda: running(ws, "a").get("pid") not in (None, first), timeout=60)
    wait_until(lambda: gone(first), timeout=30)
    seen = wait_until(lambda: (ws / "runs" / "a" / "seen-env.txt").exists()
                      and (ws / "runs" / "a" / "seen-env.txt").read_text(), timeout=30)
    assert URL_ENV not in seen and SECRET_ENV not in seen and secret not in seen


def test_a_webhook_added_by_reload_hears_of_what_happens_after_it_only(tmp_path, monkeypatch, up, hook):
    receiver = hook()
    ws, _ = alert_team(tmp_path, monkeypatch, receiver.url, "task_failed")
    with_alerts = (ws / "hermes.yaml").read_text()
    (ws / "hermes.yaml").write_text(with_alerts.split("alerts:")[0])
    up(ws)
    board = Board(ws / "kanban")
    try:
        board.add({"title": "x", "id": "before", "role": "nobody"})
        board.move("before", "failed")
        (ws / "hermes.yaml").write_text(with_alerts)
        assert hermes(ws, "reload").returncode == 0
        board.add({"title": "x", "id": "after", "role": "nobody"})
        board.move("after", "failed")
    finally:
        board.close()
    wait_until(lambda: receiver.accepted(), timeout=60)
    wait_until(lambda: any(r["event"] == "alert_sent" for r in alert_events(ws)), timeout=30)
    assert [json.loads(body)["event"]["task"] for _, body, _ in receiver.received] == ["after"]


def test_an_agents_provider_down_event_in_the_log_is_alerted_with_its_fields(tmp_path, monkeypatch, up, hook):
    """The circuit breakers live in the agents: one line appended with agent_event is all they need."""
    receiver = hook()
    ws, _ = alert_team(tmp_path, monkeypatch, receiver.url, "provider_down, provider_up")
    up(ws)
    log = ws / "kanban" / "events.jsonl"
    down = agent_event(AT, "a", "provider_down", "3 refused connections", provider="cloud", until=AT)
    append_record(log, down)
    append_record(log, agent_event(AT, "a", "provider_up", "probe answered", provider="cloud"))
    wait_until(lambda: len(receiver.accepted()) == 2, timeout=60)
    docs = [json.loads(body) for _, body, _ in receiver.received]
    assert [d["alert"] for d in docs] == ["provider_down", "provider_up"]
    assert docs[0]["event"] == decode_event(json.dumps(down).encode()) == down
    assert "  agent  provider_down  3 refused connections" in hermes(ws, "events").stdout


class Hole:
    """A webhook that accepts connections and never answers: each attempt waits out its timeout."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.clients: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.clients.append(conn)  # held open, never read

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self.clients:
            conn.close()


def test_an_unreachable_webhook_does_not_slow_the_supervisor(tmp_path, monkeypatch, up):
    hole = Hole()
    try:
        ws, _ = alert_team(tmp_path, monkeypatch, f"http://127.0.0.1:{hole.sock.getsockname()[1]}/x", "task_failed",
                           f"- name: a\n  command: [{sys.executable}, {FAKE}, beat]\n"
                           f"- name: b\n  command: [{sys.executable}, {FAKE}, beat]\n")
        up(ws)
        wait_until(lambda: running(ws, "a") and running(ws, "b"), timeout=60)
        board = Board(ws / "kanban")
        try:
            for n in range(3):
                board.add({"title": "x", "id": f"doomed-{n}", "role": "nobody"})
                board.move(f"doomed-{n}", "failed")
        finally:
            board.close()
        wait_until(lambda: hole.clients, timeout=30)
        # The alerts now wait on the hole, 5 s an attempt, 3 alerts of 5 attempts each.
        pid = running(ws, "b")["pid"]
        killed = time.monotonic()
        subprocess.run(["kill", "-9", str(pid)], check=True)
        wait_until(lambda: running(ws, "b").get("pid") not in (None, pid), timeout=60)
        assert time.monotonic() - killed < 4.0, "the restart waited for the webhook"
        asked = time.monotonic()
        assert hermes(ws, "status").returncode == 0
        assert hermes(ws, "stop", "a").returncode == 0
        assert time.monotonic() - asked < 8.0
        stopping = time.monotonic()
        assert hermes(ws, "down").returncode == 0
        wait_until(lambda: not supervisor_state(ws).get("agents", {}).get("b", {}).get("pid"), timeout=60)
        assert time.monotonic() - stopping < 10.0
        assert not [r for r in alert_events(ws) if r["event"] == "alert_sent"]
    finally:
        hole.close()


def test_a_webhook_dripping_its_answer_is_cut_at_the_attempts_timeout():
    # A socket timeout bounds each read, not the answer: a webhook sending a byte of its headers
    # every half second held the alerts thread (and every other webhook's alerts) for as long as it liked.
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(40):  # 20 s at most: without the cut, the test fails instead of hanging
                if done.wait(0.5):
                    return
                try:
                    conn.sendall(b"X")
                except OSError:
                    return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        status, outcome = post(f"http://127.0.0.1:{listener.getsockname()[1]}/", b"{}", {}, 2.0)
        took = time.monotonic() - started
    finally:
        done.set()
        thread.join(10)
        listener.close()
    assert status is None and outcome.startswith("no answer"), outcome
    assert took < 10, f"the attempt took {took:.1f} s for a 2 s timeout"


def test_a_webhook_redirecting_elsewhere_is_not_followed(hook):
    # A redirect is an answer, never a request to a host the operator never named (a guard: it held).
    elsewhere = hook()
    redirector = hook([302])
    original = redirector.server.RequestHandlerClass.do_POST

    def do_post(handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers["Content-Length"]))
        redirector.received.append((dict(handler.headers), b"", 302))
        handler.send_response(302)
        handler.send_header("Location", elsewhere.url)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    redirector.server.RequestHandlerClass.do_POST = do_post
    try:
        status, outcome = post(redirector.url, b"{}", {SIGNATURE_HEADER: "sha256=x"}, 5.0)
    finally:
        redirector.server.RequestHandlerClass.do_POST = original
    assert (status, outcome) == (302, "HTTP 302") and not worth_retrying(status)
    assert len(redirector.received) == 1 and elsewhere.received == []
