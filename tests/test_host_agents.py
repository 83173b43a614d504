"""Every host's agents on a shared board: each supervisor publishes its agents with its heartbeat
(announce_host, the hosts row's `agents`), any host reads them all (host_agents); the dashboard
shows another host's as published, judged field by field, a silent host's marked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.liveness import start_time
from hermes_sup.supervisor.views.agentrows import published, remote_rows, seconds_since

from .conftest import wait_until
from .test_pg_store import Factory, make_store, schema  # noqa: F401 (fixtures)

AGENT = {"name": "worker-1", "pid": 4242, "state": "running", "restarts": 2, "task": "t1", "last_exit": "exit 1",
         "held": False, "rss_mb": 51.25, "heartbeat_age": 1.5}


def test_each_host_publishes_its_agents_with_its_heartbeat_and_any_host_reads_them(make_store: Factory) -> None:  # noqa: F811
    box_a, box_b = make_store("box-a", host_timeout=1.2), make_store("box-b", host_timeout=1.2)
    said = [[AGENT]]
    box_a.announce_host(lambda: said[0])

    def failing() -> list[dict]:
        raise RuntimeError("the summary broke")

    box_b.announce_host(failing)  # says nothing of its agents, and still heartbeats
    rows = {row["host"]: row for row in box_b.host_agents()}
    assert rows["box-a"]["agents"] == [AGENT] and rows["box-a"]["silent"] is False
    assert rows["box-b"]["agents"] is None and rows["box-b"]["silent"] is False
    assert rows["box-a"]["heartbeat"].endswith("Z") and 0 <= rows["box-a"]["age"] < 1.2
    # Each heartbeat says it again, as it is now (every sixth of host_timeout: 0.2 s here).
    said[0] = [{**AGENT, "state": "backoff", "restarts": 3}]
    wait_until(lambda: {r["host"]: r for r in box_b.host_agents()}["box-a"]["agents"][0]["restarts"] == 3,
               timeout=30, interval=0.05)
    box_a.close()  # its heartbeat stops: once host_timeout has passed it is silent, its agents as last said
    wait_until(lambda: {r["host"]: r for r in box_b.host_agents()}["box-a"]["silent"], timeout=30, interval=0.1)
    assert {r["host"]: r for r in box_b.host_agents()}["box-a"]["agents"][0]["state"] == "backoff"


def test_a_summary_that_is_no_json_never_stops_the_heartbeat(make_store: Factory) -> None:  # noqa: F811
    box_a, reader = make_store("box-a", host_timeout=1.2), make_store("reader")
    box_a.announce_host(lambda: [{"name": "w", "odd": object()}])  # not JSON: nothing said, beats on
    first = {r["host"]: r for r in reader.host_agents()}["box-a"]
    assert first["agents"] is None
    wait_until(lambda: {r["host"]: r for r in reader.host_agents()}["box-a"]["heartbeat"] != first["heartbeat"],
               timeout=30, interval=0.05)


def test_the_file_board_has_no_other_hosts(tmp_path: Path) -> None:
    with Board(tmp_path / "kanban") as board:
        board.announce_host(lambda: [AGENT])
        assert board.host_agents() == []


def test_another_hosts_agents_are_judged_field_by_field() -> None:
    now = 1_800_000_000.0
    hosts = [
        {"host": "box-b", "age": 0.5, "silent": False, "agents": [AGENT]},  # this host: from supervisor.json
        {"host": "box-a", "age": 2.0, "silent": False, "agents": [AGENT, "not an agent", {"pid": 1}]},
        {"host": "box-c", "age": 90.0, "silent": True, "agents": [{
            "name": "x" * 500, "pid": True, "state": {"$ne": 1}, "restarts": -1, "task": 7,
            "last_exit": "<script>", "held": "yes", "rss_mb": float("nan"), "heartbeat_age": -3}]},
        {"host": "box-d", "age": 1.0, "silent": False, "agents": None},  # published nothing
        {"host": 12, "age": 1.0, "silent": False, "agents": [AGENT]},
    ]
    rows = remote_rows(hosts, "box-b", now)
    assert [(row["host"], row["name"][:8]) for row in rows] == [("box-a", "worker-1"), ("box-c", "x" * 8)]
    a, c = rows
    assert a == {"name": "worker-1", "host": "box-a", "pid": 4242, "state": "running", "restarts": 2, "task": "t1",
                 "last_exit": "exit 1", "held": False, "rss_mb": 51.2, "remote": True, "silent": False,
                 "heartbeat": "2027-01-15T07:59:56.500000Z"}  # 1.5 s old when published, published 2 s ago
    assert seconds_since(a["heartbeat"], now) == pytest.approx(3.5)
    assert c == {"name": "x" * 200, "host": "box-c", "pid": None, "state": None, "restarts": None, "task": None,
                 "last_exit": "<script>", "held": False, "rss_mb": None, "heartbeat": None, "remote": True,
                 "silent": True}


def test_published_reads_supervisor_json_as_this_host_wrote_it(tmp_path: Path) -> None:
    """The supervisor (this test's process, alive) and its one agent (this process too, so its pid
    is alive and its rss real), its heartbeat an age by this host's clock."""
    runs = tmp_path / "runs"
    (runs / "worker-1").mkdir(parents=True)
    assert published(runs) == []  # no supervisor yet
    me, started = os.getpid(), start_time(os.getpid())
    (runs / "supervisor.json").write_text(json.dumps({"pid": me, "pid_started": started, "agents": {
        "worker-1": {"pid": me, "pid_started": started, "state": "running", "restarts": 1, "task": "t9"}}}))
    (runs / "worker-1" / "state.json").write_text(json.dumps({"pid": me, "heartbeat": "2026-01-15T08:00:00Z"}))
    [row] = published(runs, now=1_768_464_012.5)
    assert row.pop("rss_mb") > 1
    assert row == {"name": "worker-1", "pid": me, "state": "running", "restarts": 1, "task": "t9",
                   "last_exit": None, "held": False, "heartbeat_age": 12.5}


def test_seconds_since() -> None:
    assert seconds_since("2026-01-15T08:00:00Z", 1_768_464_010.0) == pytest.approx(10.0)
    assert seconds_since("not a time", 0.0) is None and seconds_since(None, 0.0) is None



def test_a_heartbeat_age_past_any_calendar_shows_no_time_and_breaks_no_picture() -> None:
    """Another host (or anyone with the database) publishing an age of 10^12 s must not make the
    panel's time out of range: that raised, and every dashboard's picture failed with it."""
    hosts = [{"host": "box-a", "age": 1.0, "silent": False, "agents": [
        {**AGENT, "heartbeat_age": 1e12}, {**AGENT, "name": "w2", "heartbeat_age": 1e308}]},
        {"host": "box-c", "age": 1e300, "silent": True, "agents": [AGENT]}]
    rows = remote_rows(hosts, "box-b", 1_800_000_000.0)
    assert [(row["name"], row["host"], row["heartbeat"]) for row in rows] == [
        ("worker-1", "box-a", None), ("w2", "box-a", None), ("worker-1", "box-c", None)]


def test_a_summary_too_big_for_any_team_is_not_read_by_every_page_every_second(
        make_store: Factory, pg_server, schema: str) -> None:  # noqa: F811
    """Anyone with the database may write a host's `agents` as big as jsonb holds (255 MB): every
    open dashboard reads host_agents every second, and took all of it each time. A summary over
    MAX_SUMMARY_BYTES (far above MAX_PUBLISHED agents) is read as none; the others as they are."""
    import psycopg
    from hermes_sup.kanban.pg.store import MAX_SUMMARY_BYTES

    box_a, reader = make_store("box-a"), make_store("reader")
    box_a.announce_host(lambda: [AGENT])
    # Random text: incompressible, as big on disk as it is read. Then text that compresses well.
    big = [{"name": os.urandom(MAX_SUMMARY_BYTES // 2).hex()}]
    repetitive = [{"name": "a" * (8 * MAX_SUMMARY_BYTES)}]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        for host, agents in (("box-evil", big), ("box-zip", repetitive)):
            conn.execute(f'INSERT INTO "{schema}".hosts (host_id, boot_id, agents) VALUES (%s, %s, %s::jsonb)',
                         (host, "b", json.dumps(agents)))
    rows = {row["host"]: row for row in reader.host_agents()}
    assert rows["box-evil"]["agents"] is None and rows["box-zip"]["agents"] is None
    assert rows["box-a"]["agents"] == [AGENT]


def test_the_panel_shows_a_bounded_number_of_other_hosts_agents() -> None:
    """Anyone with the database can make up hosts: 200 of them publishing 500 agents each put 100,000
    rows into every picture of every page. The panel takes MAX_REMOTE_ROWS of them at most."""
    from hermes_sup.supervisor.views.agentrows import MAX_REMOTE_ROWS

    hosts = [{"host": f"fake-{n:03}", "age": 1.0, "silent": False,
              "agents": [{**AGENT, "name": f"a{i}"} for i in range(500)]} for n in range(200)]
    rows = remote_rows(hosts, "box-b", 1_800_000_000.0)
    assert len(rows) == MAX_REMOTE_ROWS
    assert rows[0]["host"] == "fake-000" and rows[0]["name"] == "a0"
