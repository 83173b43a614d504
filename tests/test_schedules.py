"""Schedules: the due-time decision on its own (UTC, downtime), hermes.yaml's checks with file:line,
the scheduler against a real board (two supervisors, a hostile state file), and a real supervisor
adding a per-minute schedule's tasks as a test clock moves on."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import ConfigError, load_config
from hermes_sup.supervisor.governance.schedules import (
    CLOCK_ENV,
    STATE_FILE,
    Schedule,
    Scheduler,
    due,
    latest_due,
    listing,
    task_id,
)

from .conftest import CLI, ROOT, init_workspace, wait_until


def at(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


# -- the decision ---------------------------------------------------------------------------------

def test_a_due_time_between_the_last_run_and_now_needs_a_task():
    assert due("*/5 * * * *", at("2026-01-01 00:00:00"), at("2026-01-01 00:04:59")) is None
    assert due("*/5 * * * *", at("2026-01-01 00:00:00"), at("2026-01-01 00:05:00")) == at("2026-01-01 00:05:00")
    assert due("*/5 * * * *", at("2026-01-01 00:05:00"), at("2026-01-01 00:09:30")) is None, "done already"


def test_after_downtime_the_missed_runs_need_one_task_the_latest():
    last = at("2026-03-02 09:00:00")
    # Down for a month (missing 4 weekly runs and thousands of per-minute ones): one task each.
    assert due("0 9 * * 1", last, at("2026-04-01 12:00:00")) == at("2026-03-30 09:00:00")
    assert due("* * * * *", last, at("2026-04-01 12:00:00")) == at("2026-04-01 12:00:00")
    # and once added, nothing more is due until the next due time
    assert due("0 9 * * 1", at("2026-03-30 09:00:00"), at("2026-04-01 12:00:00")) is None


def test_a_schedule_never_run_starts_now_rather_than_owing_the_past():
    assert due("* * * * *", None, at("2026-01-01 00:00:00")) is None


def test_due_times_are_in_utc_and_whole_minutes():
    assert latest_due("0 9 * * *", at("2026-03-29 08:59:59")) == at("2026-03-28 09:00:00")
    assert latest_due("0 9 * * *", at("2026-03-29 09:00:00")) == at("2026-03-29 09:00:00")
    # 2026-03-29 is a DST change in Europe: in UTC every day is 24 hours, and 02:30 exists.
    assert latest_due("30 2 * * *", at("2026-03-29 03:00:00")) == at("2026-03-29 02:30:00")
    paris = at("2026-03-29 09:30:00").astimezone(datetime.now().astimezone().tzinfo)
    assert latest_due("0 9 * * *", paris) == at("2026-03-29 09:00:00"), "an aware time in any zone"


def test_the_task_id_is_stable_per_due_time():
    assert task_id("weekly-report", at("2026-03-30 09:00:00")) == "sched-weekly-report-202603300900"
    assert task_id("x" * 45, at("2026-03-30 09:00:00")) == f"sched-{'x' * 45}-202603300900"
    assert len(task_id("x" * 45, at("2026-03-30 09:00:00"))) == 64


def test_listing_gives_next_due_and_last_run():
    rows = listing([Schedule("r", "0 9 * * 1", {"title": "Report"}), Schedule("n", "* * * * *", {"title": "N"})],
                   {"r": {"last_due": "2026-03-30T09:00:00Z", "task": "sched-r-202603300900"}, "n": "junk"},
                   at("2026-04-01 12:00:00"))
    assert rows == [{"name": "r", "cron": "0 9 * * 1", "title": "Report", "next_due": "2026-04-06T09:00:00Z",
                     "last_due": "2026-03-30T09:00:00Z", "last_task": "sched-r-202603300900"},
                    {"name": "n", "cron": "* * * * *", "title": "N", "next_due": "2026-04-01T12:01:00Z",
                     "last_due": None, "last_task": None}]


# -- hermes.yaml ----------------------------------------------------------------------------------

AGENTS = "agents:\n  - name: worker\n    roles: [work]\n"


def config_error(tmp_path: Path, schedules: str) -> str:
    path = tmp_path / "hermes.yaml"
    path.write_text(AGENTS + "schedules:\n" + schedules)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


@pytest.mark.parametrize(("schedules", "line", "words"), [
    ('  - {name: r, cron: "61 * * * *", task: {title: R}}\n', 5, "cron '61 * * * *' is not valid"),
    ('  - {name: r, cron: "@reboot", task: {title: R}}\n', 5, "cron '@reboot' has 1 field; cron is five"),
    # A sixth field (seconds, to some parsers) would fire every second, and due times on whole
    # minutes are what names a task: refused, not read as something else.
    ('  - {name: r, cron: "* * * * * *", task: {title: R}}\n', 5, "cron '* * * * * *' has 6 fields; cron is five"),
    ('  - {name: r, cron: "0 0 9 * * 1", task: {title: R}}\n', 5, "has 6 fields; cron is five"),
    ('  - {name: r, cron: "0 9 * *", task: {title: R}}\n', 5, "cron '0 9 * *' has 4 fields; cron is five"),
    ('  - {name: r, cron: 5, task: {title: R}}\n', 5, "'cron' must be a cron expression"),
    ('  - {name: Bad_Name, cron: "* * * * *", task: {title: R}}\n', 5, "schedule name 'Bad_Name'"),
    ('  - {name: r, cron: "* * * * *", task: {title: R}}\n  - {name: r, cron: "* * * * *", task: {title: S}}\n', 6,
     "'r' is used twice"),
    ('  - name: r\n    cron: "* * * * *"\n    task:\n      title: R\n      colour: red\n', 8,
     "schedule r: task: unknown field 'colour'"),
    ('  - {name: r, cron: "* * * * *", task: {title: R, id: mine}}\n', 5, "the task's 'id' is set by the schedule"),
    ('  - {name: r, cron: "* * * * *"}\n', 5, "'task' must be a mapping"),
    ('  - {name: r, cron: "* * * * *", task: {title: R}, every: 5}\n', 5, "schedules: unknown key 'every'"),
    ("  name: r\n", 5, "'schedules' must be a list"),
])
def test_a_wrong_schedule_is_refused_at_load_with_file_and_line(tmp_path, schedules, line, words):
    message = config_error(tmp_path, schedules)
    assert message.startswith(f"{tmp_path / 'hermes.yaml'}:{line}: ") and words in message, message


def test_a_good_schedule_loads(tmp_path):
    path = tmp_path / "hermes.yaml"
    path.write_text(AGENTS + 'schedules:\n  - {name: weekly-report, cron: "0 9 * * MON", task: {title: "Weekly '
                             'report", role: work, priority: 3}}\n')
    assert load_config(path)["schedules"] == [{"name": "weekly-report", "cron": "0 9 * * MON",
                                               "task": {"title": "Weekly report", "role": "work", "priority": 3}}]


# -- the scheduler against a real board ----------------------------------------------------------

class Clock:
    def __init__(self, text: str) -> None:
        self.now = at(text)

    def __call__(self) -> datetime:
        return self.now


def scheduler(board: Board, runs: Path, clock: Clock, cron: str = "* * * * *") -> Scheduler:
    made = Scheduler(board, runs, [Schedule("tick", cron, {"title": "Tick", "body": "b"})], clock=clock, tick=3600)
    made.stop(5)  # driven by hand here, one run_once at a time
    return made


def test_the_scheduler_adds_each_due_task_once_and_once_after_downtime(tmp_path, board):
    runs = tmp_path / "runs"
    runs.mkdir()
    clock = Clock("2026-01-01 10:00:30")
    first = scheduler(board, runs, clock)
    assert first.run_once() == [], "a new schedule starts now"
    clock.now += timedelta(seconds=20)
    assert first.run_once() == []
    clock.now = at("2026-01-01 10:01:00")
    assert first.run_once() == ["sched-tick-202601011001"]
    assert first.run_once() == []
    doc = board.get("sched-tick-202601011001")
    assert (doc["title"], doc["status"], doc["meta"]["schedule"]) == (
        "Tick", "todo", {"name": "tick", "due": "2026-01-01T10:01:00Z"})
    clock.now = at("2026-01-01 13:07:12")  # down for three hours: 186 missed minutes
    assert first.run_once() == ["sched-tick-202601011307"]
    assert len(board.list().tasks) == 2
    state = json.loads((runs / STATE_FILE).read_text())
    assert state == {"tick": {"last_due": "2026-01-01T13:07:00Z", "task": "sched-tick-202601011307"}}


def test_two_supervisors_add_a_due_task_once(tmp_path):
    clock = Clock("2026-01-01 10:00:30")
    with Board(tmp_path / "kanban") as one, Board(tmp_path / "kanban") as two:
        runs_one, runs_two = tmp_path / "runs1", tmp_path / "runs2"  # two hosts: a state file each
        runs_one.mkdir()
        runs_two.mkdir()
        a, b = scheduler(one, runs_one, clock), scheduler(two, runs_two, clock)
        assert a.run_once() == b.run_once() == []
        clock.now = at("2026-01-01 10:01:05")
        assert a.run_once() == ["sched-tick-202601011001"]
        assert b.run_once() == [], "the id is taken: a no-op"
        assert [t["id"] for t in one.list().tasks] == ["sched-tick-202601011001"]
        assert json.loads((runs_two / STATE_FILE).read_text())["tick"]["last_due"] == "2026-01-01T10:01:00Z"


def test_two_hosts_whose_ticks_straddle_a_minute_add_an_hourly_task_once(tmp_path):
    # The id comes from the due time, not from the moment a host looked: host one sees 11:00 due at
    # 11:00:58, host two (its tick later, or its clock behind) at 11:01:03; both name the same task.
    with Board(tmp_path / "kanban") as one, Board(tmp_path / "kanban") as two:
        runs_one, runs_two = tmp_path / "runs1", tmp_path / "runs2"
        runs_one.mkdir()
        runs_two.mkdir()
        clock_one, clock_two = Clock("2026-01-01 10:30:00"), Clock("2026-01-01 10:30:00")
        a, b = scheduler(one, runs_one, clock_one, "0 * * * *"), scheduler(two, runs_two, clock_two, "0 * * * *")
        assert a.run_once() == b.run_once() == []
        clock_one.now, clock_two.now = at("2026-01-01 11:00:58"), at("2026-01-01 11:01:03")
        assert a.run_once() == ["sched-tick-202601011100"]
        assert b.run_once() == [], "the same due time is the same id: the second add is a no-op"
        assert [t["id"] for t in one.list().tasks] == ["sched-tick-202601011100"]
        assert one.get("sched-tick-202601011100")["meta"]["schedule"]["due"] == "2026-01-01T11:00:00Z"
        for runs in (runs_one, runs_two):
            assert json.loads((runs / STATE_FILE).read_text())["tick"] == {
                "last_due": "2026-01-01T11:00:00Z", "task": "sched-tick-202601011100"}


def test_after_downtime_an_hourly_schedule_adds_the_missed_run_once_named_by_its_due_time(tmp_path, board):
    runs = tmp_path / "runs"
    runs.mkdir()
    clock = Clock("2026-01-01 10:30:00")
    made = scheduler(board, runs, clock, "0 * * * *")
    assert made.run_once() == []
    clock.now = at("2026-01-01 13:27:41")  # down from 10:30: 11:00, 12:00 and 13:00 missed
    assert made.run_once() == ["sched-tick-202601011300"], "the latest missed run, named by 13:00, not 13:27"
    assert made.run_once() == []
    clock.now = at("2026-01-01 13:59:59")
    assert made.run_once() == [], "nothing more is due before 14:00"
    assert [t["id"] for t in board.list().tasks] == ["sched-tick-202601011300"]
    assert board.get("sched-tick-202601011300")["meta"]["schedule"]["due"] == "2026-01-01T13:00:00Z"


@pytest.mark.parametrize("content", ["[1, 2]", '{"tick": {"last_due": 12}}', '{"tick": {"last_due": "soon"}}', "\0"])
def test_a_hostile_state_file_makes_the_schedule_start_now(tmp_path, board, content):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / STATE_FILE).write_text(content)
    clock = Clock("2026-01-01 10:00:30")
    assert scheduler(board, runs, clock).run_once() == []
    assert json.loads((runs / STATE_FILE).read_text())["tick"]["last_due"] == "2026-01-01T10:00:00Z"


# -- a real supervisor --------------------------------------------------------------------------

def test_a_supervisor_adds_a_per_minute_schedules_tasks_as_its_clock_moves(tmp_path, up, monkeypatch):
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        "defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n"
        "agents:\n  - name: worker\n    roles: [other]\n"
        'schedules:\n  - {name: minutely, cron: "* * * * *", task: {title: "Every minute", role: work}}\n')
    clock_file = tmp_path / "clock"
    start = at("2026-01-01 10:00:30").timestamp()
    clock_file.write_text(str(start))
    monkeypatch.setenv(CLOCK_ENV, str(clock_file))
    up(ws)
    state = ws / "runs" / STATE_FILE
    wait_until(state.exists, timeout=30)
    board = Board(ws / "kanban")
    assert board.list().tasks == [], "a new schedule owes nothing"
    clock_file.write_text(str(start + 40))  # 10:01:10
    wait_until(lambda: [t["id"] for t in board.list().tasks] == ["sched-minutely-202601011001"], timeout=30)
    clock_file.write_text(str(start + 3 * 3600))  # 13:00:30: three hours later, one more
    wait_until(lambda: len(board.list().tasks) == 2, timeout=30)
    assert sorted(t["id"] for t in board.list().tasks) == ["sched-minutely-202601011001",
                                                           "sched-minutely-202601011300"]
    listed = subprocess.run([*CLI, "-w", str(ws), "schedules", "--json"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    row = json.loads(listed.stdout)["schedules"][0]
    assert (row["name"], row["last_due"], row["last_task"]) == ("minutely", "2026-01-01T13:00:00Z",
                                                                "sched-minutely-202601011300")
    assert row["next_due"] is not None
    text = subprocess.run([*CLI, "-w", str(ws), "schedules"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert text.stdout.startswith('minutely  "* * * * *"  next ') and "sched-minutely-202601011300" in text.stdout
    wait_until(lambda: "schedule minutely: added sched-minutely-202601011300" in (tmp_path / "up.log").read_text(),
               timeout=30)

    # reload picks up a schedule added meanwhile: it starts then, and is due at its next hour
    (ws / "hermes.yaml").write_text((ws / "hermes.yaml").read_text()
                                    + '  - {name: hourly, cron: "0 * * * *", task: {title: "Every hour"}}\n')
    reloaded = subprocess.run([*CLI, "-w", str(ws), "reload"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert reloaded.returncode == 0, reloaded.stderr
    wait_until(lambda: "hourly" in json.loads(state.read_text()), timeout=30)
    clock_file.write_text(str(start + 4 * 3600))  # 14:00:30
    wait_until(lambda: len(board.list().tasks) == 4, timeout=30)
    assert {"sched-hourly-202601011400", "sched-minutely-202601011400"} <= {t["id"] for t in board.list().tasks}


def test_a_lasting_failure_is_said_once_not_at_every_tick(tmp_path, board):
    calls = []

    def clock() -> datetime:
        calls.append(1)
        return at("2026-01-01 10:00:30")

    missing = tmp_path / "no-such-runs"  # its state file cannot be written: every tick fails the same way
    ticking = Scheduler(board, missing, [Schedule("tick", "* * * * *", {"title": "Tick"})], clock=clock, tick=0.005)
    try:
        wait_until(lambda: len(calls) >= 20, timeout=30)
    finally:
        assert ticking.stop(5)
    lines = ticking.drain()
    ticking.close()
    assert len(lines) == 1 and lines[0].startswith("schedules: could not add the due tasks (FileNotFoundError"), lines


def test_two_hosts_on_postgresql_add_a_due_task_once_even_at_the_same_moment(tmp_path, pg_server):
    # Two hosts' schedulers, each with its own state file, look at the same due time at once: the
    # stable id makes the second add a no-op on the shared board (a unique key, not a file rename).
    import threading
    import uuid

    import psycopg
    from hermes_sup.kanban.pg.store import PgStore

    schema = f"t_{uuid.uuid4().hex[:12]}"
    clock = Clock("2026-01-01 10:00:30")
    stores = [PgStore(pg_server.dsn, schema=schema, host=host, boot_id=f"boot-{host}") for host in ("box-a", "box-b")]
    try:
        makers = []
        for number, store in enumerate(stores):
            runs = tmp_path / f"runs{number}"
            runs.mkdir()
            makers.append(scheduler(store, runs, clock))  # type: ignore[arg-type]
        assert [made.run_once() for made in makers] == [[], []]
        for minute in range(1, 6):
            clock.now = at(f"2026-01-01 10:0{minute}:05")
            start = threading.Barrier(2)
            added: list[list[str]] = []

            def run(made: Scheduler, start: threading.Barrier, added: list[list[str]]) -> None:
                start.wait(10)
                added.append(made.run_once())

            threads = [threading.Thread(target=run, args=(made, start, added)) for made in makers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            ident = f"sched-tick-20260101100{minute}"
            assert sorted(added) == [[], [ident]], (minute, added)
        listed = stores[0].list().tasks
        assert sorted(t["id"] for t in listed) == [f"sched-tick-20260101100{m}" for m in range(1, 6)]
    finally:
        for store in stores:
            store.close()
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_with_no_schedule_the_thread_sleeps_until_a_reload_gives_it_one(tmp_path, board):
    calls = []

    def clock() -> datetime:
        calls.append(1)
        return at("2026-01-01 10:00:30")

    runs = tmp_path / "runs"
    runs.mkdir()
    sleeper = Scheduler(board, runs, [], clock=clock, tick=0.005)
    try:
        # A tick of 5 ms, yet no schedule: it looks once at the start and at nothing after (its clock
        # unread: run_once returns before reading it), so an idle supervisor is not woken by it.
        wait_until(lambda: sleeper._thread.is_alive())
        sleeper.reconfigure([Schedule("tick", "* * * * *", {"title": "Tick"})])  # what a reload does
        wait_until(lambda: (runs / STATE_FILE).exists(), timeout=10)  # woken: the new schedule starts now
        assert calls
    finally:
        assert sleeper.stop(5)
    sleeper.close()
