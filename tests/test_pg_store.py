"""The board on PostgreSQL (kanban/pg), against the real server the suite starts (tests/pgserver.py):
the file board's semantics, exactly once across hosts and processes, fencing of zombie holders,
the database clock only, and wake-ups that survive a dropped LISTEN connection."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from hermes_sup.kanban import rules
from hermes_sup.kanban.errors import BoardError, ClaimLost, InvalidTransition
from hermes_sup.kanban.pg import ingest as pgingest
from hermes_sup.kanban.pg import open_store
from hermes_sup.kanban.pg import store as pgstore
from hermes_sup.kanban.pg.rules import storable
from hermes_sup.kanban.pg.schema import MIGRATIONS, check_schema_name, pending
from hermes_sup.kanban.pg.store import PgStore, redact_dsn
from hermes_sup.kanban.task import TaskError

from . import pgserver
from .conftest import wait_until
from .pgserver import PgServer

WORKER = Path(__file__).resolve().parent / "pg_worker.py"
Factory = Callable[..., PgStore]


@pytest.fixture
def schema() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_store(pg_server: PgServer, schema: str) -> Iterator[Factory]:
    """Stores on one fresh schema, as if on hosts of their own (`host`, `boot_id`)."""
    with pgserver.stores_on_one_schema(pg_server, schema) as make:
        yield make


@pytest.fixture
def store(make_store: Factory) -> PgStore:
    return make_store()


def admin(pg_server: PgServer) -> psycopg.Connection:
    return psycopg.connect(pg_server.dsn, autocommit=True)


# -- the file board's semantics ------------------------------------------------------------------

def test_add_get_list_counts_and_validation(store: PgStore) -> None:
    doc = store.add({"title": "  Write docs ", "priority": 2, "meta": {"k": [1, 2]}}, by="alice")
    assert doc["status"] == "todo" and doc["title"] == "Write docs" and doc["claim"] is None
    got = store.get(doc["id"])
    assert got["meta"] == {"k": [1, 2]} and got["priority"] == 2 and got["history"][0]["by"] == "alice"
    assert store.counts()["todo"] == 1 and [t["id"] for t in store.list("todo").tasks] == [doc["id"]]
    with pytest.raises(TaskError, match="already exists"):
        store.add({"id": doc["id"], "title": "again"})
    with pytest.raises(TaskError, match="missing title"):
        store.add({"body": "no title"})
    with pytest.raises(BoardError, match="not a task id"):
        store.get("../../etc/passwd")
    # What jsonb cannot hold is stored with a replacement character, never refused or lost.
    odd = store.add({"title": "nul", "body": "a\x00b"})
    assert store.get(odd["id"])["body"] == "a\ufffdb"


def test_claim_order_priority_then_age_then_id(store: PgStore) -> None:
    low = store.add({"id": "low", "title": "low", "priority": 0})
    first = store.add({"id": "b-first", "title": "high, older", "priority": 5})
    second = store.add({"id": "a-second", "title": "high, newer", "priority": 5})
    order = [store.claim("ag")["id"] for _ in range(3)]
    assert order == [first["id"], second["id"], low["id"]]
    assert store.claim("ag") is None


def test_roles_assignee_steps_only_and_assigned_only(store: PgStore) -> None:
    store.add({"id": "rev", "title": "review", "role": "reviewer"})
    store.add({"id": "bob", "title": "for bob", "assignee": "bob"})
    store.add({"id": "plan", "title": "steps", "steps": [{"tool": "noop", "args": {}}]})
    assert store.claim("alice", steps_only=True)["id"] == "plan"
    assert store.claim("alice") is None  # neither the reviewer's nor bob's
    assert store.claim("bob", assigned_only=True)["id"] == "bob"
    assert store.claim("carol", roles=["reviewer"])["id"] == "rev"


def test_dependencies_and_cycles(store: PgStore) -> None:
    store.add({"id": "dep", "title": "dependency"})
    store.add({"id": "child", "title": "child", "depends_on": ["dep"], "priority": 9})
    store.add({"id": "orphan", "title": "waits on an unknown task", "depends_on": ["nobody"], "priority": 9})
    with pytest.raises(TaskError, match="cycle"):
        store.add({"id": "nobody", "title": "closes a cycle", "depends_on": ["orphan"]})
    held = store.claim("ag")
    assert held["id"] == "dep" and store.claim("ag") is None
    store.complete("dep", held["claim"]["token"], result="ok")
    assert store.claim("ag")["id"] == "child"


def test_fail_counts_attempts_until_failed(store: PgStore) -> None:
    store.add({"id": "flaky", "title": "flaky", "max_attempts": 2})
    held = store.claim("ag")
    after = store.fail("flaky", held["claim"]["token"], "boom")
    assert after["status"] == "todo" and after["attempts"] == 1 and after["error"] == "boom"
    held = store.claim("ag")
    assert held["attempts"] == 2 and held["claims"] == 2
    final = store.fail("flaky", held["claim"]["token"], "boom again")
    assert final["status"] == "failed" and "attempt 2 of 2 failed" in final["history"][-1]["note"]
    retried = store.retry("flaky")
    assert retried["status"] == "todo" and retried["attempts"] == 0


def test_release_block_cancel_move(store: PgStore) -> None:
    store.add({"id": "t", "title": "t"})
    held = store.claim("ag")
    released = store.release("t", held["claim"]["token"])
    assert released["status"] == "todo" and released["attempts"] == 0 and released["claim"] is None
    held = store.claim("ag")
    blocked = store.block("t", held["claim"]["token"], "need a person", question="which one?")
    assert blocked["status"] == "blocked" and blocked["question"] == "which one?" and blocked["attempts"] == 0
    with pytest.raises(InvalidTransition):
        store.move("t", "doing")
    store.retry("t")
    held = store.claim("ag")
    cancelled = store.cancel("t", by="alice")
    assert cancelled["status"] == "cancelled" and "revoked" in cancelled["history"][-1]["note"]
    with pytest.raises(ClaimLost):  # the holder's claim went with the cancel
        store.complete("t", held["claim"]["token"])
    with pytest.raises(InvalidTransition, match="already cancelled"):
        store.cancel("t")


def test_every_holder_write_is_fenced(store: PgStore) -> None:
    store.add({"id": "t", "title": "t"})
    old = store.claim("ag", lease=0.01)
    token = old["claim"]["token"]
    wait_until(lambda: store.recover(), timeout=10)  # the lease ran out (by the database's clock)
    new = store.claim("other")
    assert new["claim"]["token"] > token and new["claims"] == 2
    for write in (lambda: store.complete("t", token, "late"), lambda: store.fail("t", token, "late"),
                  lambda: store.block("t", token, "late"), lambda: store.release("t", token),
                  lambda: store.renew("t", token), lambda: store.journal_append("t", token, {"late": True})):
        with pytest.raises(ClaimLost, match=f"held by other with token {new['claim']['token']}"):
            write()
    assert store.get("t")["claim"]["agent"] == "other" and store.journal("t") == []
    done = store.complete("t", new["claim"]["token"], "ok")
    assert done["status"] == "done" and done["result"] == "ok"


def test_lease_expiry_keeps_attempts_and_fails_at_max(store: PgStore) -> None:
    store.add({"id": "t", "title": "t", "max_attempts": 1})
    store.claim("ag", lease=0.01)
    recovered = wait_until(lambda: store.recover(), timeout=10)
    assert recovered == [{"task": "t", "to": "failed", "reason": "lease of ag expired"}]
    doc = store.get("t")
    assert doc["status"] == "failed" and doc["attempts"] == 1 and "gave up after 1 attempts" in doc["error"]


def test_renew_extends_the_lease_by_the_database_clock(store: PgStore) -> None:
    store.add({"id": "t", "title": "t"})
    held = store.claim("ag", lease=1)
    renewed = store.renew("t", held["claim"]["token"], lease=300)
    assert renewed["claim"]["lease_until_ts"] - held["claim"]["lease_until_ts"] > 250
    assert store.recover() == []


def test_dead_local_holder_is_recovered_at_once(store: PgStore) -> None:
    store.add({"id": "t", "title": "t"})
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store.claim("ag", pid=child.pid, lease=300)
        assert store.recover() == []
    finally:
        child.kill()
        child.wait()
    assert store.recover() == [{"task": "t", "to": "todo", "reason": f"holder ag (pid {child.pid}) is gone"}]


def test_events_by_cursor_and_journal(store: PgStore) -> None:
    store.add({"id": "t", "title": "t"})
    held = store.claim("ag")
    assert store.journal_append("t", held["claim"]["token"], {"step": 0, "out": "x"}) > 0
    store.complete("t", held["claim"]["token"])
    events = store.events_since(0).events
    assert [(e["from"], e["to"]) for _c, e in events] == [(None, "todo"), ("todo", "doing"), ("doing", "done")]
    assert store.events_since(events[0][0]).events == events[1:]
    assert store.events_since(events[-1][0]).events == []
    assert [e["entry"] for e in store.journal("t")] == [{"step": 0, "out": "x"}]


def test_migrations_are_versioned_and_applied_once(make_store: Factory, pg_server: PgServer, schema: str) -> None:
    make_store()
    make_store("host-b")
    with admin(pg_server) as conn:
        rows = conn.execute(f'SELECT version FROM "{schema}".migrations ORDER BY version').fetchall()
    assert rows == [(version,) for version, _name, _sql in MIGRATIONS]
    # The claim walks the dead entries of its index until a vacuum: the tasks table is vacuumed by
    # count (migration 5), not once a fifth of a big board is dead.
    with admin(pg_server) as conn:
        options = conn.execute("SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                               "WHERE n.nspname = %s AND c.relname = 'tasks'", (schema,)).fetchone()
    assert sorted(options[0]) == ["autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000"]


def test_an_event_committed_late_with_a_smaller_cursor_is_not_skipped(make_store: Factory, pg_server: PgServer,
                                                                      schema: str) -> None:
    slow = make_store("slow")
    fast = make_store("fast")
    reader = make_store("reader")
    slow.add({"id": "slow-task", "title": "slow"})
    held = slow.claim("ag")
    seen = [{"cursor": c, **e} for c, e in reader.events_since(0).events]
    finished_slow: list[dict] = []
    read: list[list[dict]] = []

    def waiting() -> int:
        with admin(pg_server) as probe:
            return probe.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                                 "WHERE NOT l.granted AND a.application_name = 'hermes-sup'").fetchone()[0]

    with admin(pg_server) as blocker, blocker.transaction():
        # The slow transition takes its cursor, then waits (on its run row) before it commits.
        blocker.execute(f'SELECT 1 FROM "{schema}".runs WHERE fence = %s FOR UPDATE', (held["claim"]["token"],))
        slow_thread = threading.Thread(target=lambda: finished_slow.append(
            slow.complete("slow-task", held["claim"]["token"])), daemon=True)
        slow_thread.start()
        wait_until(lambda: waiting() >= 1, timeout=10)
        fast.add({"id": "fast-task", "title": "fast"})  # a larger cursor, committed first
        reader_thread = threading.Thread(target=lambda: read.append(
            [{"cursor": c, **e} for c, e in reader.events_since(seen[-1]["cursor"]).events]), daemon=True)
        reader_thread.start()
        wait_until(lambda: waiting() >= 2, timeout=10)  # the reader waits for the slow transition
        assert not read
    slow_thread.join(timeout=10)
    reader_thread.join(timeout=10)
    assert finished_slow and read
    assert [(e["task"], e["to"]) for e in read[0]] == [("slow-task", "done"), ("fast-task", "todo")]
    assert [e["cursor"] for e in read[0]] == sorted(e["cursor"] for e in read[0])


# -- a claim skips rows other claimers hold ------------------------------------------------------

def test_claim_skips_a_row_locked_by_another_claimer(store: PgStore, pg_server: PgServer, schema: str) -> None:
    store.add({"id": "top", "title": "top", "priority": 9})
    store.add({"id": "next", "title": "next"})
    with admin(pg_server) as other, other.transaction():
        other.execute(f"SELECT id FROM \"{schema}\".tasks WHERE id = 'top' FOR UPDATE")
        result: list[object] = []
        thread = threading.Thread(target=lambda: result.append(store.claim("ag")), daemon=True)
        thread.start()
        thread.join(timeout=10)
        claimed_while_locked = not thread.is_alive()
    thread.join(timeout=30)
    assert claimed_while_locked, "the claim waited for a row another transaction holds"
    assert result[0]["id"] == "next"


# -- hosts: exactly once, zombies, clocks ---------------------------------------------------------

@pytest.mark.slow
def test_exactly_once_across_hosts_and_processes(make_store: Factory, pg_server: PgServer, schema: str) -> None:
    store = make_store()
    total = 2000
    for index in range(total):
        store.add({"id": f"t{index:05d}", "title": f"task {index}", "priority": index % 7})
    assert store.counts()["todo"] == total
    env = {**os.environ, "HERMES_SUP_TEST_PG_DSN": pg_server.dsn}
    procs = [subprocess.Popen([sys.executable, str(WORKER), schema, f"host-{h}", f"agent-{h}-{c}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for h in range(3) for c in range(4)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(json.loads(out))
    done = Counter(task for output in outputs for task in output["done"])
    assert sum(len(output["lost"]) for output in outputs) == 0
    assert len(done) == total and set(done.values()) == {1}
    assert sum(1 for output in outputs if output["done"]) >= 2  # the work was shared
    with admin(pg_server) as conn:
        per_task = conn.execute(f'SELECT count(*), count(DISTINCT task_id) FROM "{schema}".runs').fetchone()
        dones = conn.execute(f"SELECT count(*), count(DISTINCT task) FROM \"{schema}\".events "
                             "WHERE dst = 'done'").fetchone()
    assert per_task == (total, total) and dones == (total, total)
    assert store.counts()["done"] == total


def test_silent_host_is_reclaimed_after_host_timeout_and_its_late_writes_rejected(make_store: Factory) -> None:
    zombie = make_store("zombie", host_timeout=2)
    alive = make_store("alive", host_timeout=2)
    zombie.heartbeat()
    alive.heartbeat()
    zombie.add({"id": "t", "title": "t"})
    held = zombie.claim("z-agent", lease=600)  # the lease alone would hold it for ten minutes
    token = held["claim"]["token"]
    zombie.journal_append("t", token, {"step": 0})
    started = time.monotonic()
    assert alive.recover() == []  # the zombie's heartbeat is fresh
    # The zombie is partitioned: it heartbeats no more; the other host goes on.
    recovered = wait_until(lambda: (alive.heartbeat(), alive.recover())[1], timeout=30, interval=0.2)
    assert time.monotonic() - started >= 1.5
    assert recovered == [{"task": "t", "to": "todo", "reason": "host zombie of z-agent sent no heartbeat for 2 s"}]
    taken = alive.claim("a-agent")
    assert taken["claim"]["host"] == "alive" and taken["attempts"] == 2
    # The zombie wakes: every write it tries with its old claim is refused, and changes nothing.
    zombie.heartbeat()
    for write in (lambda: zombie.renew("t", token), lambda: zombie.journal_append("t", token, {"step": 1}),
                  lambda: zombie.complete("t", token, "zombie's result"), lambda: zombie.fail("t", token, "x"),
                  lambda: zombie.release("t", token), lambda: zombie.block("t", token, "x")):
        with pytest.raises(ClaimLost):
            write()
    assert [e["entry"] for e in alive.journal("t")] == [{"step": 0}]  # the resumer sees the zombie's step 0
    final = alive.complete("t", taken["claim"]["token"], "alive's result")
    assert final["result"] == "alive's result" and final["history"][-1]["by"] == "a-agent"


def test_host_restart_under_the_same_name_frees_its_claims(make_store: Factory) -> None:
    before = make_store("box", boot_id="boot-1")
    before.heartbeat()
    before.add({"id": "t", "title": "t"})
    before.claim("ag", lease=600)
    after = make_store("box", boot_id="boot-2")  # the machine rebooted: same name, new boot
    after.heartbeat()
    assert after.recover() == [{"task": "t", "to": "todo", "reason": "host box of ag restarted"}]


def test_a_host_clock_ten_minutes_off_changes_nothing(make_store: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    real = time.time
    late = make_store("late", host_timeout=30)
    early = make_store("early", host_timeout=30)
    late.heartbeat()
    early.heartbeat()
    late.add({"id": "t", "title": "t"})
    monkeypatch.setattr(time, "time", lambda: real() - 600)  # this host's clock is ten minutes behind
    held = late.claim("ag", lease=60)
    monkeypatch.setattr(time, "time", lambda: real() + 600)  # the other's, ten minutes ahead
    assert early.recover() == [] and early.claim("other") is None
    assert abs(held["claim"]["lease_until_ts"] - real() - 60) < 30  # the database's clock set the lease


def test_a_drop_is_stamped_by_the_database_clock_not_the_host_s(make_store: Factory, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A drop's task says when it landed on the board as the database saw it, as its event does:
    not what the clock of the host that read the file said (ten minutes behind here)."""
    from hermes_sup.kanban import ingest

    store = make_store(drop_root=tmp_path / "kanban")
    (tmp_path / "kanban" / "inbox" / "late.json").write_text(json.dumps({"id": "late", "title": "t"}))
    monkeypatch.setattr(ingest, "now_iso", lambda: "2000-01-01T00:00:00.000000Z")
    assert store.ingest().ingested == ["late"]
    doc = store.get("late")
    events = [event for _cursor, event in store.events_since(0).events if event.get("task") == "late"]
    assert [(e["at"], e["to"]) for e in events] == [(h["at"], h["to"]) for h in doc["history"]]
    assert doc["created_at"] == doc["updated_at"] == doc["history"][0]["at"] != "2000-01-01T00:00:00.000000Z"


# -- wake-ups --------------------------------------------------------------------------------------

def test_wait_for_work_wakes_on_notify_and_survives_a_killed_listen_connection(
        make_store: Factory, pg_server: PgServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # No poll in this test's time: a claim must come from a notification.
    monkeypatch.setattr(pgstore, "POLL_INTERVAL", 60.0)
    waiter = make_store("waiter")
    adder = make_store("adder")
    listener = waiter.listener()
    assert listener.wait_ready(10)
    got: list[dict] = []

    def wait_one() -> None:
        got.append(waiter.wait_for_work("ag", timeout=40))

    thread = threading.Thread(target=wait_one, daemon=True)
    thread.start()
    wait_until(lambda: listener.generation >= 1, timeout=10)
    adder.add({"id": "first", "title": "first"})
    thread.join(timeout=15)
    assert got and got[0]["id"] == "first"

    with admin(pg_server) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (listener.backend_pid,))
    wait_until(lambda: listener.connects >= 2, timeout=15)
    thread = threading.Thread(target=wait_one, daemon=True)
    thread.start()
    adder.add({"id": "second", "title": "second"})
    thread.join(timeout=15)
    assert len(got) == 2 and got[1] is not None and got[1]["id"] == "second"

    # A claimer at work listens no more (with 16 agents, every task's notification woke each
    # one's connection and thread): work added meanwhile wakes nothing.
    wait_until(lambda: not listener.listening, timeout=10)
    before = listener.generation
    adder.add({"id": "child", "title": "child", "depends_on": ["second"]})
    listener.wait(before, 0.5)
    assert listener.generation == before, "a busy claimer's connection was woken by a notification"
    # A dependency done wakes the waiter for the task that waited on it.
    found_nothing = threading.Event()
    claim = waiter.claim

    def claim_and_tell(*args: object, **kwargs: object) -> dict | None:
        doc = claim(*args, **kwargs)
        if doc is None:
            found_nothing.set()
        return doc

    monkeypatch.setattr(waiter, "claim", claim_and_tell)
    thread = threading.Thread(target=wait_one, daemon=True)
    thread.start()
    assert found_nothing.wait(10)  # the waiter looked, found the child blocked, and sleeps
    waiter.complete("second", got[1]["claim"]["token"])
    thread.join(timeout=15)
    assert len(got) == 3 and got[2] is not None and got[2]["id"] == "child"


# -- the DSN -----------------------------------------------------------------------------------

def test_dsn_comes_from_the_env_and_is_never_in_an_error(pg_server: PgServer, tmp_path: Path) -> None:
    with pytest.raises(BoardError, match=r"\$TEAM_DSN is not set"):
        open_store({"dsn_env": "TEAM_DSN"}, environ={})
    secret = "s3cret-pass-word"
    dsn = f"postgresql://bob:{secret}@127.0.0.1:1/nodb?connect_timeout=2"
    with pytest.raises(BoardError) as caught:
        open_store({"dsn_env": "TEAM_DSN"}, environ={"TEAM_DSN": dsn})
    assert secret not in str(caught.value) and "$TEAM_DSN" in str(caught.value)
    # Raised `from None`: a traceback does not print the driver's own error either.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert redact_dsn(f"bad dsn {dsn}", dsn) == "bad dsn [redacted]"
    assert secret not in redact_dsn(f"password={secret}", f"host=x password={secret}")
    good = open_store({"dsn_env": "TEAM_DSN", "schema": f"t_{uuid.uuid4().hex[:12]}"}, host="h",
                      environ={"TEAM_DSN": pg_server.dsn}, drop_root=tmp_path / "kanban")
    try:
        assert pg_server.dsn not in repr(good)
        # The host's drop folder is the factory's to give: a drop there lands on the shared board.
        (tmp_path / "kanban" / "inbox" / "hello.json").write_text(json.dumps({"id": "hello", "title": "hi"}))
        assert good.ingest().ingested == ["hello"] and good.get("hello")["source"]["file"] == "inbox/hello.json"
    finally:
        with admin(pg_server) as conn:
            conn.execute(f'DROP SCHEMA "{good.schema}" CASCADE')
        good.close()


def test_a_listener_resumed_right_after_a_pause_is_listening_when_resume_returns(
        make_store: Factory, pg_server: PgServer) -> None:
    """A claim followed at once by the next wait (a task that fails at once): the UNLISTEN may be
    under way when resume() comes, and resume() must not return before the LISTEN is back, nor
    leave the thread asleep unlistened."""
    waiter = make_store("waiter")
    adder = make_store("adder")
    listener = waiter.listener()
    assert listener.wait_ready(10)
    rng = random.Random(7)
    for _round in range(200):
        listener.pause()
        time.sleep(rng.choice((0, 0, 0.0005, 0.001, 0.002)))  # at every point of the UNLISTEN
        listener.resume()
        assert listener.listening, "resume() returned before its LISTEN was in place"
        time.sleep(0.005)  # an UNLISTEN that was under way would have ended by now
        assert listener.listening, "a resume during an UNLISTEN left the listener unlistened"
    before = listener.generation
    adder.add({"id": "after-pauses", "title": "added once it listens again"})
    wait_until(lambda: listener.generation > before, timeout=10)


def test_wait_for_work_goes_on_across_a_server_restart(make_store: Factory, pg_server: PgServer) -> None:
    waiter = make_store("waiter")
    assert waiter.listener().wait_ready(10)
    got: list[dict | None] = []
    errors: list[BaseException] = []

    def wait_one() -> None:
        try:
            got.append(waiter.wait_for_work("ag", timeout=60))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait_one, daemon=True)
    thread.start()
    wait_until(lambda: waiter.listener().generation >= 1, timeout=10)
    pg_server.restart()
    adder = make_store("adder")  # connects after the restart
    adder.add({"id": "after-restart", "title": "added while the waiter reconnects"})
    thread.join(timeout=30)
    assert not errors, errors
    assert got and got[0] is not None and got[0]["id"] == "after-restart"
    wait_until(lambda: waiter.listener().connects >= 2, timeout=15)


def test_heartbeat_keeps_a_host_s_claims_and_its_silence_frees_them(make_store: Factory) -> None:
    holder = make_store("holder", host_timeout=1.5)
    sweeper = make_store("sweeper", host_timeout=1.5)
    holder.start_heartbeat(interval=0.2)
    holder.add({"id": "t", "title": "t"})
    holder.claim("ag", lease=600)
    started = time.monotonic()
    while time.monotonic() - started < 3.0:  # twice host_timeout: the heartbeat thread keeps it
        assert sweeper.recover() == []
        time.sleep(0.1)
    holder.close()  # stops the heartbeat thread
    recovered = wait_until(lambda: sweeper.recover(), timeout=20, interval=0.1)
    assert recovered[0]["reason"] == "host holder of ag sent no heartbeat for 1.5 s"


def test_one_sweeper_at_a_time_and_the_turn_passes_when_it_stops(make_store: Factory) -> None:
    first = make_store("first", host_timeout=1)
    second = make_store("second", host_timeout=1)
    assert first._elected() and first._elected()  # the holder renews its own lease
    assert not second._elected()
    wait_until(second._elected, timeout=10, interval=0.1)  # first stopped renewing: its lease ran out
    assert not first._elected()


# -- pure rules (no server) -----------------------------------------------------------------------

def test_storable_replaces_what_jsonb_refuses_and_keeps_the_rest() -> None:
    value = {"a\x00": ["x\x00y", {"deep": "\ud800z"}], "ok": "plain é", "n": 1.5, "t": None}
    assert storable(value) == {"a\ufffd": ["x\ufffdy", {"deep": "\ufffdz"}], "ok": "plain é", "n": 1.5, "t": None}
    assert storable("\x00") == "\ufffd"
    deep: object = "leaf\x00"
    for _ in range(64):
        deep = [deep]
    flat = storable(deep)
    for _ in range(64):
        flat = flat[0]
    assert flat == "leaf\ufffd"


def test_the_ends_of_a_claim_are_the_file_boards_rules() -> None:
    # The PostgreSQL store ends claims with kanban/rules.py's rules, as the file board does.
    doc = {"id": "t", "status": "doing", "attempts": 2, "max_attempts": 2, "history": [],
           "claim": {"agent": "ag", "token": 7}}
    failed = rules.failed_attempt(doc, "boom", now="T")
    assert failed["status"] == "failed" and failed["claim"] is None and failed["history"][-1]["by"] == "ag"
    assert failed["history"][-1]["note"] == "attempt 2 of 2 failed: boom"
    released = rules.ended(doc, "todo", "released", now="T", give_back_attempt=True)
    assert released["status"] == "todo" and released["attempts"] == 1 and "_return_attempt" not in released
    stale = rules.recovered(doc, "lease of ag expired", now="T")
    assert (stale["status"], stale["history"][-1]["note"]) == (
        "failed", "recovered: lease of ag expired; gave up after 2 attempts")


def test_migrations_are_numbered_in_order_and_schema_names_are_plain() -> None:
    versions = [version for version, _name, _sql in MIGRATIONS]
    assert versions == sorted(set(versions)) and versions[0] == 1
    assert pending({1}) == [m for m in MIGRATIONS if m[0] != 1]
    for bad in ('x"; DROP TABLE tasks; --', "Upper", "", "1abc", None):
        with pytest.raises(ValueError):
            check_schema_name(bad)


@pytest.mark.slow
def test_a_host_killed_whole_has_its_tasks_done_by_the_others(make_store: Factory, pg_server: PgServer,
                                                               schema: str) -> None:
    store = make_store()
    total, host_timeout = 600, 2.0
    for index in range(total):
        store.add({"id": f"t{index:05d}", "title": f"task {index}"})
    env = {**os.environ, "HERMES_SUP_TEST_PG_DSN": pg_server.dsn}

    def start(h: int) -> list[subprocess.Popen[str]]:
        return [subprocess.Popen([sys.executable, str(WORKER), schema, f"host-{h}", f"agent-{h}-{c}",
                                  str(host_timeout), "0.2" if h == 2 else "0"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for c in range(2)]

    def host2_holds() -> int:
        with admin(pg_server) as conn:
            return conn.execute(f"SELECT count(*) FROM \"{schema}\".tasks "
                                "WHERE status = 'doing' AND lease_host = 'host-2'").fetchone()[0]

    # host-2's tasks take 0.2 s each, so it is killed holding claims. It starts first and the board
    # shows it holding both claims before the fast hosts begin: on a loaded machine they could
    # otherwise empty the board before host-2's interpreters had started (seen in CI).
    hosts = {2: start(2)}
    wait_until(lambda: host2_holds() == 2, timeout=60, interval=0.05)
    hosts |= {h: start(h) for h in (0, 1)}
    wait_until(lambda: store.counts()["done"] >= 100, timeout=60, interval=0.05)
    for proc in hosts[2]:  # host-2 dies whole, mid-run, holding claims
        proc.kill()
    for proc in hosts[2]:
        proc.wait()
    killed_at = time.monotonic()
    with admin(pg_server) as conn:
        held = [row[0] for row in conn.execute(
            f"SELECT id FROM \"{schema}\".tasks WHERE status = 'doing' AND lease_host = 'host-2'")]
    assert held, "host-2 held no claim when it was killed"
    outputs = []
    for proc in hosts[0] + hosts[1]:
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(json.loads(out))
    assert store.counts()["done"] == total
    with admin(pg_server) as conn:
        dones = conn.execute(f"SELECT count(*), count(DISTINCT task) FROM \"{schema}\".events "
                             "WHERE dst = 'done'").fetchone()
        last = conn.execute(f"SELECT extract(epoch FROM now() - max(at)) FROM \"{schema}\".events "
                            "WHERE note LIKE 'recovered: host host-2%%'").fetchone()[0]
    assert dones == (total, total)
    for task_id in held:
        doc = store.get(task_id)
        assert doc["status"] == "done" and doc["result"]["host"] != "host-2" and doc["attempts"] == 2
        assert "sent no heartbeat" in " ".join(entry["note"] for entry in doc["history"])
    # Taken back within host_timeout and a few seconds of the death, by the database's clock.
    assert float(last) <= time.monotonic() - killed_at
    assert time.monotonic() - killed_at - float(last) <= host_timeout + 8


# -- the harness ---------------------------------------------------------------------------------

def test_without_a_server_the_harness_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgserver, "find_bin_dir", lambda: None)
    with pytest.raises(pgserver.PgServerError, match=r"make test` installs the Debian `postgresql` package"):
        pgserver.start_server()


def test_the_postgres_tests_skip_only_when_the_flag_says_so(tmp_path: Path) -> None:
    env = {**os.environ, pgserver.SKIP_ENV: "skip"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             f"{__file__}::test_claim_order_priority_then_age_then_id"],
                            capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent, timeout=120)
    assert "1 skipped" in result.stdout, result.stdout[-2000:]


def test_a_holder_goes_on_after_a_server_restart(make_store: Factory, pg_server: PgServer) -> None:
    store = make_store()
    store.add({"id": "t", "title": "t"})
    held = store.claim("ag")
    pg_server.restart()  # the store's connection is ended by the server; the claim stands
    assert store.get("t")["status"] == "doing"
    pg_server.restart()
    done = store.complete("t", held["claim"]["token"], "after two restarts")
    assert done["status"] == "done" and store.get("t")["result"] == "after two restarts"


def test_a_drop_rewritten_after_it_was_read_is_ingested_as_it_is_now(make_store: Factory, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(drop_root=tmp_path / "kanban")
    drop = tmp_path / "kanban" / "inbox" / "note.json"
    drop.write_text(json.dumps({"id": "note", "title": "first draft"}))
    real_read = pgingest.read_drop

    def read_then_rewrite(path: Path):  # the user saves again just after the board read the file
        read = real_read(path)
        if read is not None and read.doc and read.doc["title"] == "first draft":
            drop.write_text(json.dumps({"id": "note", "title": "final"}))
            os.utime(drop, ns=(time.time_ns(), time.time_ns() + 1_000_000))
        return read

    monkeypatch.setattr(pgingest, "read_drop", read_then_rewrite)
    assert store.ingest().ingested == ["note"]
    assert store.get("note")["title"] == "final"


def test_two_processes_of_a_host_ingesting_the_same_drops_make_each_task_once(make_store: Factory, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "kanban"
    stores = [make_store(drop_root=root), make_store(drop_root=root)]
    names = [f"d{n}" for n in range(20)]
    for name in names:
        (root / "inbox" / f"{name}.json").write_text(json.dumps({"id": name, "title": name}))
    real_read = pgingest.read_drop
    together = threading.Barrier(2)

    def read_in_step(path: Path):  # both have read each drop before either writes its task
        read = real_read(path)
        together.wait(timeout=30)
        return read

    monkeypatch.setattr(pgingest, "read_drop", read_in_step)
    # One process of a host ingests at a time (kanban/ingestturn.py); where that turn cannot be had
    # (its lock file unusable) both ingest at once, and each drop must still make one task.
    from hermes_sup.kanban.ingestturn import SoleIngester
    monkeypatch.setattr(SoleIngester, "_take", lambda self, wait: None)
    reports: list = []
    threads = [threading.Thread(target=lambda s=s: reports.append(s.ingest())) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(reports) == 2
    assert [r.rejected for r in reports] == [[], []] and list((root / "rejected").iterdir()) == []
    assert sorted(doc["id"] for doc in stores[0].list().tasks) == sorted(names)
    made = Counter(e["task"] for _c, e in stores[0].events_since(0).events if e.get("from") == "inbox")
    assert made == Counter(names), "a drop was made into a task twice"
    assert len(list((root / ".ingested").iterdir())) == len(names) and list((root / "inbox").iterdir()) == []


@pytest.mark.parametrize("dsn", ["host=127.0.0.1 password=half pw-s3cretpart", "host=x password='s3cretpart"])
def test_a_dsn_that_does_not_parse_is_refused_without_quoting_it(dsn: str, tmp_path: Path) -> None:
    # psycopg's parser says `missing "=" after "pw-s3cretpart"`: the password's second half.
    with pytest.raises(BoardError) as caught:
        open_store({"dsn_env": "TEAM_DSN"}, environ={"TEAM_DSN": dsn})
    assert "s3cretpart" not in str(caught.value) and "$TEAM_DSN" in str(caught.value)
    assert "does not hold a valid PostgreSQL connection string" in str(caught.value)  # said before connecting
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    from hermes_sup.agents.ledger import LedgerError, open_ledger
    with pytest.raises(LedgerError) as ledger_error:
        open_ledger(tmp_path, {"backend": "postgres", "dsn_env": "TEAM_DSN"}, environ={"TEAM_DSN": dsn})
    assert "s3cretpart" not in str(ledger_error.value)
    assert "$TEAM_DSN does not hold a valid PostgreSQL connection string" in str(ledger_error.value)
    # And should a driver's message quote a piece of such a DSN anyway, it is not shown.
    assert "s3cretpart" not in redact_dsn('missing "=" after "pw-s3cretpart" in connection info string', dsn)


def test_board_commands_do_not_quote_a_dsn_that_does_not_parse(tmp_path: Path) -> None:
    (tmp_path / "hermes.yaml").write_text(
        "agents:\n  - name: a\nboard: {backend: postgres, dsn_env: TEAM_DSN}\n")
    env = {**os.environ, "TEAM_DSN": "host=127.0.0.1 password=half pw-s3cretpart"}
    for args in (["board"], ["doctor"], ["task", "add", "x"], ["usage"]):
        run = subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "-w", str(tmp_path), *args],
                             capture_output=True, text=True, env=env, timeout=60)
        assert "s3cretpart" not in run.stdout + run.stderr, args
        assert "Traceback" not in run.stderr, (args, run.stderr)


def test_a_task_row_written_by_hand_is_set_aside_not_fatal_to_every_listing(
        make_store: Factory, pg_server: PgServer, schema: str) -> None:
    """Any host (or anyone with the database) may write a task's document column: one nested deeper
    than Python reads raised RecursionError out of every list() (every host's supervisor, dashboard
    and CLI), one that is no object a TypeError, one with no title a KeyError further on. Each is
    listed as damaged, as the file board lists a task file it cannot read; the others as before."""
    store = make_store("box-a")
    for task_id in ("good", "deep", "scalar", "untitled"):
        store.add({"id": task_id, "title": task_id}, by="cli")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        for task_id, document in (("deep", "[" * 5000 + "]" * 5000), ("scalar", "5"), ("untitled", "{}")):
            conn.execute(f'UPDATE "{schema}".tasks SET document = %s::jsonb WHERE id = %s', (document, task_id))
    listing = store.list()
    assert [doc["id"] for doc in listing.tasks] == ["good"]
    assert sorted(entry["path"] for entry in listing.damaged) == [
        "task deep (board database)", "task scalar (board database)", "task untitled (board database)"]
    assert [doc["id"] for doc in store.list_fields("todo").tasks] == ["good"]


def test_a_task_row_written_by_hand_is_failed_at_its_claim_not_claimed_by_every_agent_in_turn(
        make_store: Factory, pg_server: PgServer, schema: str) -> None:
    """A todo row whose document is no task (no object: the claim's SQL failed; nested too deep: the
    claimed row could not be read) broke every claim of every agent of every host while it was the
    first pick. The claim sets it aside as failed, saying why, and claims the next task."""
    store = make_store("box-a")
    store.add({"id": "good", "title": "good", "priority": 1}, by="cli")
    for task_id in ("deep", "scalar"):
        store.add({"id": task_id, "title": task_id, "priority": 9}, by="cli")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        for task_id, document in (("deep", "[" * 5000 + "]" * 5000), ("scalar", "5")):
            conn.execute(f'UPDATE "{schema}".tasks SET document = %s::jsonb WHERE id = %s', (document, task_id))
    claimed = store.claim("w1")
    assert claimed is not None and claimed["id"] == "good"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT id, status, fence, lease_owner FROM "{schema}".tasks WHERE id <> %s ORDER BY id',
                            ("good",)).fetchall()
        notes = conn.execute(f'SELECT task, dst, note FROM "{schema}".events WHERE dst = %s ORDER BY task',
                             ("failed",)).fetchall()
    assert rows == [("deep", "failed", None, None), ("scalar", "failed", None, None)]
    assert [(task, dst) for task, dst, _ in notes] == [("deep", "failed"), ("scalar", "failed")]
    assert all("document" in note for _, _, note in notes)
    assert store.claim("w2") is None


def test_a_held_task_row_written_by_hand_is_failed_by_recovery_and_read_as_a_clear_error(
        make_store: Factory, pg_server: PgServer, schema: str) -> None:
    """A doing row made no task by hand (another host, anyone with the database) raised a TypeError
    out of every recovery sweep (every host's, each time) once its lease ran out, and out of get()
    (task show, the drawer). Recovery fails it, saying why; get() is a BoardError naming it."""
    store = make_store("box-a")
    store.add({"id": "t", "title": "t"}, by="cli")
    store.claim("ag", lease=0.01)
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".tasks SET document = %s::jsonb WHERE id = %s', ("[" * 5000 + "]" * 5000, "t"))
    with pytest.raises(BoardError, match="task t: its document in the board database"):
        store.get("t")
    recovered = wait_until(lambda: store.recover(), timeout=10)
    assert recovered == [{"task": "t", "to": "failed", "reason": "lease of ag expired"}]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        assert conn.execute(f'SELECT status, fence FROM "{schema}".tasks WHERE id = %s', ("t",)).fetchone() == (
            "failed", None)


def test_a_person_acting_on_a_task_row_written_by_hand_gets_a_clear_error(
        make_store: Factory, pg_server: PgServer, schema: str) -> None:
    """cancel, retry, comment, answer and move read the row first: one made no task by hand raised a
    TypeError (a traceback from `task cancel`); each is a BoardError naming the task and why."""
    store = make_store("box-a")
    store.add({"id": "t", "title": "t"}, by="cli")
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".tasks SET document = %s::jsonb WHERE id = %s', ("7", "t"))
    for act in (lambda: store.cancel("t"), lambda: store.comment("t", "hi"), lambda: store.move("t", "blocked"),
                lambda: store.retry("t"), lambda: store.answer("t", "yes")):
        with pytest.raises(BoardError, match="task t: its document in the board database is not an object"):
            act()


def test_a_waiting_claimer_leaves_the_drops_to_the_process_of_its_host_that_ingests(make_store: Factory,
                                                                                    tmp_path: Path) -> None:
    from hermes_sup.kanban.lock import BoardLock
    from hermes_sup.kanban.watch import INGEST_LOCK

    root = tmp_path / "kanban"
    store = make_store(drop_root=root)
    (root / "inbox" / "one.json").write_text(json.dumps({"id": "one", "title": "one"}))
    other = BoardLock(root / INGEST_LOCK, 5)  # another agent of this host, ingesting
    assert other.try_acquire()
    assert store.ingest(wait=False).ingested == []
    assert (root / "inbox" / "one.json").exists()
    other.release()
    other.close()
    assert store.ingest(wait=False).ingested == ["one"]
