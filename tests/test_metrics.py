"""Metrics: Debian's real Prometheus server scrapes `/metrics` of a team running under `up --dashboard`;
queries through its HTTP API return the task count and an agent's restart after a SIGKILL. The
endpoint follows the dashboard's access rules; the histograms' arithmetic is pure."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.kanban import Board
from hermes_sup.supervisor import readers
from hermes_sup.supervisor.dashboard import metrics

from .conftest import CLI, ROOT, init_workspace, supervisor_state, wait_until
from .llm_server import ScriptedLLM, openai_reply

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class Prometheus:
    """Debian's prometheus on 127.0.0.1 (a free port, a config and storage of the test's), scraping
    one target every second; killed at the end."""

    def __init__(self, where: Path, target: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        (where / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: hermes\n    metrics_path: /metrics\n    static_configs: [{{targets: ['{target}']}}]\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(where / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={where / 'prometheus.yml'}", f"--storage.tsdb.path={where / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self.ready(), timeout=60, interval=0.1)

    def ready(self) -> bool:
        assert self.proc.poll() is None, "prometheus exited: see prometheus.log"
        try:
            return get(f"{self.url}/-/ready")[0] == 200
        except OSError:
            return False

    def query(self, expression: str) -> list[dict[str, Any]]:
        status, body = get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expression}))
        assert status == 200, body
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, expression: str) -> float | None:
        result = self.query(expression)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        with_timeout = self.proc.poll() is None
        if with_timeout:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def team(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A team of one agent, served by the scripted model, under `up --dashboard` on a free port."""
    from hermes_sup.supervisor.sweep import sweep

    from .conftest import stop_process

    with ScriptedLLM(responder=lambda api, body: openai_reply("done it", prompt=50, completion=5)) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
            "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
            "defaults:\n  stop_timeout: 10\n  restart: {backoff: {initial: 0.1, max: 1}}\n"
            "agents:\n  - name: thinker\n")
        with open(tmp_path / "up.log", "w") as log:
            proc = subprocess.Popen([*CLI, "-w", str(ws), "up", "--dashboard", "--dashboard-port", "0"], stdout=log,
                                    stderr=subprocess.STDOUT, text=True, cwd=ROOT)
            try:
                said = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+)/")
                url = wait_until(lambda: (said.findall((tmp_path / "up.log").read_text()) or [None])[0], timeout=60)
                yield ws, str(url)
            finally:
                stop_process(proc)
                sweep(ws, ws / "runs", 0)


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian's prometheus is not installed (make prometheus)")
def test_prometheus_scrapes_the_task_count_and_a_restart_after_sigkill(tmp_path, team):
    ws, url = team
    board = Board(ws / "kanban")
    tasks = [board.add({"title": f"Task {n}"}) for n in range(3)]
    wait_until(lambda: all(board.get(t["id"])["status"] == "done" for t in tasks), timeout=60)
    server = Prometheus(tmp_path / "prometheus", url.removeprefix("http://"))
    try:
        wait_until(lambda: server.value('hermes_sup_tasks{status="done"}') == 3.0, timeout=30, interval=0.2)
        assert server.value('up{job="hermes"}') == 1.0
        assert server.value('sum(hermes_sup_model_calls_total{provider="scripted",model="scripted-gpt",'
                            'outcome="ok"})') == 3.0
        assert server.value('hermes_sup_model_tokens_total{kind="input"}') == 150.0
        assert server.value('hermes_sup_task_duration_seconds_count') == 3.0
        assert server.value('hermes_sup_agents{state="running"}') == 1.0
        assert server.value('hermes_sup_agent_restarts_total{agent="thinker"}') == 0.0
        pid = supervisor_state(ws)["agents"]["thinker"]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: (a := supervisor_state(ws)["agents"]["thinker"])["pid"] not in (None, pid)
                   and a["state"] == "running", timeout=30)
        wait_until(lambda: server.value('hermes_sup_agent_restarts_total{agent="thinker"}') == 1.0, timeout=30,
                   interval=0.2)
        wait_until(lambda: server.value('hermes_sup_agents{state="running"}') == 1.0, timeout=30, interval=0.2)
    finally:
        server.stop()


def test_metrics_follow_the_dashboards_access_rules(team):
    _ws, url = team
    status, body = get(f"{url}/metrics")
    assert status == 200 and "hermes_sup_tasks" in body and "# TYPE hermes_sup_task_claim_latency_seconds histogram" \
        in body
    # A page's event stream is a reader of this process too: its place in the log is reported.
    with urllib.request.urlopen(f"{url}/api/events", timeout=10) as stream:
        assert stream.read(5) == b"retry"
        streaming = 'hermes_sup_events_behind{reader="dashboard-streams"} 0.0'
        assert wait_until(lambda: streaming in get(f"{url}/metrics")[1], timeout=15)
    assert 'reader="ingest-warnings"' in get(f"{url}/metrics")[1], "the supervisor's own, as up --dashboard serves it"
    port = url.rsplit(":", 1)[1]
    refused, _ = get(f"{url}/metrics", headers={"Host": f"attacker.example:{port}"})
    assert refused in (403, 421), "a page of another site reaching 127.0.0.1 by DNS rebinding is refused"


def test_task_times_and_buckets_are_pure():
    task = {"status": "done", "created_at": "2026-01-01T00:00:00Z",
            "history": [{"to": "todo", "at": "2026-01-01T00:00:00Z"}, {"to": "doing", "at": "2026-01-01T00:00:02Z"},
                        {"to": "todo", "at": "2026-01-01T00:00:03Z"}, {"to": "doing", "at": "2026-01-01T00:00:10Z"},
                        {"to": "done", "at": "2026-01-01T00:00:14.5Z"}]}
    assert metrics.task_times(task) == (2.0, 4.5)
    assert metrics.task_times({**task, "status": "doing", "history": task["history"][:2]}) == (2.0, None)
    assert metrics.task_times({"status": "todo", "created_at": "nonsense"}) == (None, None)
    assert metrics.task_times({"status": "done", "history": 3}) == (None, None), "a listing's history count"
    rows, total = metrics.buckets([0.2, 3.0, 9000.0], (1.0, 5.0))
    assert rows == [("1.0", 1.0), ("5.0", 2.0), ("+Inf", 3.0)] and total == 9003.2


def test_metrics_port_serves_a_team_without_the_dashboard(tmp_path, up, monkeypatch):
    port = free_port()
    ws = tmp_path / "ws"
    init_workspace(ws)
    # An alert rule starts the supervisor's event reader (its webhook is never called: no agent dies).
    monkeypatch.setenv("HERMES_SUP_TEST_HOOK", "http://127.0.0.1:9/hook")
    monkeypatch.setenv("HERMES_SUP_TEST_HOOK_SECRET", "s" * 32)
    (ws / "hermes.yaml").write_text(f"metrics: {{port: {port}}}\n"
                                    "alerts:\n  - {webhook_env: HERMES_SUP_TEST_HOOK,"
                                    " secret_env: HERMES_SUP_TEST_HOOK_SECRET, 'on': [agent_fatal]}\n"
                                    "agents:\n  - name: idle\n")
    Board(ws / "kanban").add({"title": "nobody takes this", "role": "nobody"})
    up(ws)
    said = wait_until(lambda: f"metrics: http://127.0.0.1:{port}/metrics" in (tmp_path / "up.log").read_text(),
                      timeout=30)
    assert said
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and 'hermes_sup_tasks{status="todo"} 1.0' in body
    caught_up = [f'hermes_sup_events_behind{{reader="{name}"}} 0.0' for name in ("alerts", "ingest-warnings")]
    assert wait_until(lambda: all(line in get(f"http://127.0.0.1:{port}/metrics")[1] for line in caught_up),
                      timeout=30)
    assert get(f"http://127.0.0.1:{port}/")[0] == 404, "metrics alone, not the dashboard"
    assert get(f"http://127.0.0.1:{port}/metrics", headers={"Host": f"attacker.example:{port}"})[0] in (403, 421)


def test_events_behind_counts_what_a_reader_has_yet_to_read(tmp_path):
    board = Board(tmp_path / "kanban")
    start = board.events_end()
    for n in range(3):
        board.add({"title": f"t{n}"})
    position: list[tuple[int, int | None] | None] = [(start, None)]
    untrack = readers.track_reader("alerts", lambda: position[0])
    try:
        assert readers.readers_behind(board)["alerts"] == 3
        read = board.events_since(start)
        position[0] = (read.cursor, read.inode)
        assert readers.readers_behind(board)["alerts"] == 0
        position[0] = None
        assert "alerts" not in readers.readers_behind(board), "a reader not reading is left out"
    finally:
        untrack()
    # Readers that come and go (a stream per page) share one label: the one furthest behind is reported.
    middle = board.events_since(start, max_events=1)
    streams = [readers.track_reader("dashboard-streams", lambda at=at: at)
               for at in [(read.cursor, read.inode)] * 50 + [(middle.cursor, middle.inode)]]
    assert readers.readers_behind(board) == {"dashboard-streams": 2}
    for untrack in streams:
        untrack()
    assert readers.readers_behind(board) == {}, "a stream that ended is no reader"
    with pytest.raises(ValueError, match="unknown event reader"):
        readers.track_reader("stream for client 10.0.0.7", lambda: None)  # a label value is one of a few names


def test_a_model_name_a_provider_answered_with_is_a_label_of_bounded_length():
    # The LLM-call log keeps the model a provider's answer names, as it came.
    data = {"supervisor": True, "agents": [], "counts": {}, "claim_latency": [], "duration": [], "budgets": [],
            "breakers": [], "behind": {},
            "calls": [("a", {"provider": "p", "model": "m" * 1_000_000, "outcome": "ok", "tokens_in": 3,
                             "cost_usd": 0.5})]}
    body, _kind = metrics.exposition(data)
    assert len(body) < 20_000
    assert f'model="{"m" * (metrics.LABEL_CHARS - 1)}…"' in body.decode()
