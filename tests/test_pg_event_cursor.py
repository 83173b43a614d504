"""The PostgreSQL board's event cursor against a writer still in flight (a real server): cursors come
from a sequence before their transaction commits, so a smaller one can commit after larger ones. A
reader delivers such an event once, after its commit, never skips it, and a cursor that is taken but
not yet committed (or rolled back) is resumed from, never read again from the start."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hermes_sup.kanban.pg import sql, stream
from hermes_sup.kanban.pg.store import PgStore
from hermes_sup.supervisor.cli.events import print_since

from . import pgserver
from .conftest import wait_until
from .pgserver import PgServer

HOLD = 60.0  # the longest a writer in flight is held open, should the test fail before releasing it


class Rollback(Exception):
    """Raised inside a held transaction to roll it back."""


@pytest.fixture
def stores(pg_server: PgServer) -> Iterator[Callable[[], PgStore]]:
    """Opens stores (each its own connection) on one fresh schema of the suite's server."""
    with pgserver.stores_on_one_schema(pg_server, f"t_{uuid.uuid4().hex[:12]}") as make:
        yield lambda: make("host-a", boot_id="boot-a")


class InFlight:
    """A writer's transaction held open after it wrote an event with the board's own verb (`add`
    or `append_event`), on its own store and thread, until `commit()` or `roll_back()`."""

    def __init__(self, store: PgStore, write: Callable[[PgStore], Any]) -> None:
        self.store = store
        self.cursor = 0
        self.errors: list[BaseException] = []
        self._inside, self._release = threading.Event(), threading.Event()
        self._roll_back = False
        self._thread = threading.Thread(target=self._run, args=(write,), daemon=True)
        self._thread.start()
        assert self._inside.wait(HOLD) and not self.errors, self.errors

    def _run(self, write: Callable[[PgStore], Any]) -> None:
        try:
            with self.store._tx() as cur:  # the verb's own transaction becomes a savepoint in this one
                write(self.store)
                self.cursor = int(cur.execute("SELECT currval('events_cursor_seq') AS c").fetchone()["c"])
                self._inside.set()
                self._release.wait(HOLD)
                if self._roll_back:
                    raise Rollback
        except Rollback:
            pass
        except BaseException as exc:  # surfaced by the test thread
            self.errors.append(exc)
        finally:
            self._inside.set()

    def _end(self) -> None:
        self._release.set()
        self._thread.join(HOLD)
        assert not self._thread.is_alive() and not self.errors, self.errors

    def commit(self) -> None:
        self._end()

    def roll_back(self) -> None:
        self._roll_back = True
        self._end()


def backend_pid(store: PgStore) -> int:
    with store._locked() as conn:
        return int(conn.info.backend_pid)


def taken(store: PgStore) -> int:
    """The newest cursor the sequence gave, committed or not."""
    with store._locked() as conn:
        return int(conn.execute("SELECT last_value FROM events_cursor_seq").fetchone()["last_value"])


def waits_for_a_lock(observer: PgStore, pid: int) -> bool:
    """True while the backend `pid` waits for a lock it has asked for (the reader's fence)."""
    with observer._locked() as conn:
        row = conn.execute("SELECT count(*) AS n FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)).fetchone()
    return row["n"] > 0


def tasks_of(batch: Any) -> list[tuple[int, str]]:
    return [(cursor, event.get("task") or event.get("event")) for cursor, event in batch.events]


def test_a_cursor_is_resumed_from_while_the_sequence_gave_it_and_only_then():
    # The one test both check_cursor (accepts) and events_since (reads on, not from the start) ask.
    assert stream.resumable(0, 0) and stream.resumable(7, 7) and stream.resumable(3, 7)
    assert not stream.resumable(8, 7) and not stream.resumable(-1, 7) and not stream.resumable(1, 0)


def test_an_event_committed_after_later_ones_is_delivered_once_after_its_commit(stores, monkeypatch):
    reader, writer, other, observer = stores(), stores(), stores(), stores()
    reader.add({"title": "before", "id": "before"})
    start = reader.events_end()
    late = InFlight(writer, lambda s: s.add({"title": "late", "id": "late"}))
    try:
        # Two later cursors commit while the smaller one is still in flight.
        other.add({"title": "after", "id": "after"})
        other.append_event({"kind": "supervisor", "event": "note", "note": "later still"})
        assert late.cursor == start + 1 and taken(observer) == start + 3
        # A reader that cannot wait for it gets nothing yet, and its cursor stays before it: were it
        # given the two committed events, its cursor would pass `late`, skipped for good.
        monkeypatch.setattr(stream, "EVENTS_WAIT", 0.3)
        early = reader.events_since(start)
        assert (early.events, early.cursor, early.restarted) == ([], start, False)
        # A reader that waits gets all three once the writer commits, in cursor order.
        monkeypatch.setattr(stream, "EVENTS_WAIT", HOLD)
        monkeypatch.setattr(stream, "STUCK_AFTER", HOLD)  # however slow this machine, `late` is in flight
        got: list[Any] = []
        follower = threading.Thread(target=lambda: got.append(reader.events_since(start)), daemon=True)
        pid = backend_pid(reader)
        follower.start()
        wait_until(lambda: waits_for_a_lock(observer, pid) or got, timeout=30)
        assert not got, "the reader returned while a smaller cursor was still in flight"
    finally:
        late.commit()
    follower.join(HOLD)
    assert tasks_of(got[0]) == [(start + 1, "late"), (start + 2, "after"), (start + 3, "note")]
    assert got[0].cursor == start + 3 and not got[0].restarted
    again = reader.events_since(got[0].cursor)
    assert (again.events, again.cursor) == ([], start + 3), "nothing twice"
    everything = reader.events_since(0)
    assert [task for _c, task in tasks_of(everything)] == ["before", "late", "after", "note"]


@pytest.mark.parametrize("verb", ["claim", "complete", "ingest"])
def test_a_claim_an_end_or_an_ingest_in_flight_holds_its_event_back_and_every_later_one(stores, monkeypatch, tmp_path,
                                                                                      verb):
    # A claim and a holder's end take the events lock inside a statement of their own (the claim's
    # pick, HELD_ENDING), an ingest batch once for all its tasks' events: never after a cursor.
    reader, writer, other = stores(), stores(), stores()
    reader.add({"title": "held", "id": "held"})
    write: Callable[[PgStore], Any] = lambda s: s.claim("w")  # noqa: E731
    if verb == "complete":
        token = writer.claim("w")["claim"]["token"]
        write = lambda s: s.complete("held", token, "ok")  # noqa: E731
    elif verb == "ingest":
        writer.close()
        writer = PgStore(reader._dsn, schema=reader.schema, host="host-a", boot_id="boot-a",
                         drop_root=tmp_path / "kanban")
        for name in ("one", "two"):
            (tmp_path / "kanban" / "inbox" / f"{name}.json").write_text(f'{{"title": "{name}", "id": "{name}"}}')
        write = lambda s: s.ingest()  # noqa: E731
    try:
        start = reader.events_end()
        late = InFlight(writer, write)
        try:
            other.append_event({"kind": "supervisor", "event": "note", "note": "later"})
            monkeypatch.setattr(stream, "EVENTS_WAIT", 0.3)
            early = reader.events_since(start)
            assert (early.events, early.cursor) == ([], start), "a later event was read past one in flight"
        finally:
            late.commit()
    finally:
        writer.close()
    tasks = [task for _c, task in tasks_of(reader.events_since(start))]
    assert tasks == {"ingest": ["one", "two", "note"]}.get(verb, ["held", "note"])


def test_an_end_waiting_for_its_tasks_row_holds_no_events_lock_meanwhile(stores):
    # Held while it waited, the lock would hold up a reader queued for it, and behind that reader
    # every writer, the one holding the row too: a deadlock the server breaks only after a second.
    holder, other, observer = stores(), stores(), stores()
    holder.add({"title": "x", "id": "x"})
    token = holder.claim("w")["claim"]["token"]
    row_held, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        with other._tx() as cur:
            cur.execute("SELECT 1 FROM tasks WHERE id = 'x' FOR UPDATE")
            row_held.set()
            release.wait(HOLD)

    holding = threading.Thread(target=hold_the_row, daemon=True)
    holding.start()
    assert row_held.wait(HOLD)
    pid = backend_pid(holder)
    ended: list[Any] = []
    ender = threading.Thread(target=lambda: ended.append(holder.complete("x", token, "ok")), daemon=True)
    ender.start()
    try:
        wait_until(lambda: waits_for_a_lock(observer, pid), timeout=30)
        with observer._locked() as conn:
            advisory = conn.execute("SELECT count(*) AS n FROM pg_locks WHERE pid = %s AND locktype = 'advisory'",
                                    (pid,)).fetchone()["n"]
        assert advisory == 0, "the end took the events lock before its row"
    finally:
        release.set()
    holding.join(HOLD)
    ender.join(HOLD)
    assert ended and ended[0]["status"] == "done"


def test_a_cursor_still_in_flight_is_resumed_from_never_read_from_the_start(stores, monkeypatch, capsys):
    reader, writer, other = stores(), stores(), stores()
    reader.add({"title": "one", "id": "one"})
    reader.add({"title": "two", "id": "two"})
    monkeypatch.setattr(stream, "EVENTS_WAIT", 0.3)
    late = InFlight(writer, lambda s: s.append_event({"kind": "supervisor", "event": "note", "note": "late"}))
    try:
        cursor = late.cursor  # taken, not committed: the newest the sequence gave
        reader.check_cursor(cursor)  # accepted: `events --since` and Last-Event-ID take it
        batch = reader.events_since(cursor)
        assert (batch.events, batch.cursor, batch.restarted, batch.why) == ([], cursor, False, "")
        assert print_since(reader, cursor, as_json=False) == (cursor, None)
        out, err = capsys.readouterr()
        assert out == "" and "from its start" not in err, "nothing read again"
    finally:
        late.commit()
    batch = reader.events_since(cursor)
    assert (batch.events, batch.cursor, batch.restarted) == ([], cursor, False), "its own event is not after it"
    other.add({"title": "three", "id": "three"})
    batch = reader.events_since(cursor)
    assert tasks_of(batch) == [(cursor + 1, "three")] and not batch.restarted


def test_a_cursor_whose_writer_rolled_back_is_resumed_from_never_read_from_the_start(stores, monkeypatch):
    reader, writer, other = stores(), stores(), stores()
    reader.add({"title": "one", "id": "one"})
    monkeypatch.setattr(stream, "EVENTS_WAIT", 0.3)
    gone = InFlight(writer, lambda s: s.add({"title": "never", "id": "never"}))
    try:
        cursor = gone.cursor
        reader.check_cursor(cursor)
        batch = reader.events_since(cursor)
        assert (batch.events, batch.cursor, batch.restarted) == ([], cursor, False)
    finally:
        gone.roll_back()
    reader.check_cursor(cursor)  # a gap at the top of the sequence is still a place to resume from
    # A reader starting now starts after the newest committed event, not at the rolled-back cursor:
    # that one a crash of the server can give again (test_a_cursor_given_again_after_a_crash_...).
    assert reader.events_end() == cursor - 1
    batch = reader.events_since(cursor)
    assert (batch.events, batch.cursor, batch.restarted) == ([], cursor, False)
    other.add({"title": "two", "id": "two"})
    batch = reader.events_since(cursor)
    assert tasks_of(batch) == [(cursor + 1, "two")] and not batch.restarted
    assert [task for _c, task in tasks_of(reader.events_since(0))] == ["one", "two"]


@pytest.fixture
def own_server() -> Iterator[PgServer]:
    """A server of this test alone, as it crashes it."""
    server = pgserver.start_server()
    try:
        yield server
    finally:
        server.stop()


def test_a_cursor_given_again_after_a_crash_is_not_skipped_by_a_reader_that_started_before(own_server):
    """A cursor taken by a transaction that never committed may, after a crash of the server, be
    given again to a new event: the sequence's advance reaches the disk only with a commit. A reader
    that starts (events_end) after such a writer must start before that cursor, not at it."""
    with psycopg.connect(own_server.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET autovacuum = off")  # no other commit may flush the WAL meanwhile
        conn.execute("SELECT pg_reload_conf()")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    store = PgStore(own_server.dsn, schema=schema, host="host-a", boot_id="boot-a")
    try:
        store.add({"title": "one", "id": "one"})
        with store._locked() as conn:
            conn.execute("CHECKPOINT")  # the sequence's next advance is written to the WAL afresh
        with psycopg.connect(own_server.dsn) as writer:  # takes a cursor as writers do, fails, rolls back
            writer.execute("SELECT set_config('search_path', %s, false)", (f'"{schema}"',))
            writer.execute("SELECT pg_advisory_xact_lock_shared(%s, hashtext(current_schema()))",
                           (sql.EVENTS_LOCK,))
            lost = writer.execute("SELECT nextval('events_cursor_seq')").fetchone()[0]
            writer.rollback()
        start = store.events_end()
        store.check_cursor(lost)
    finally:
        store.close()
    own_server.crash_and_start()
    store = PgStore(own_server.dsn, schema=schema, host="host-a", boot_id="boot-a")
    try:
        store.check_cursor(start)  # still a place to resume from: not read again from the start
        quiet = store.events_since(start)
        assert (quiet.events, quiet.restarted) == ([], False), "nothing after it, nothing again"
        two = store.add({"title": "two", "id": "two"})
        read = store.events_since(start)
        assert [event["task"] for _c, event in read.events] == [two["id"]], (
            f"started at {start}; the rolled-back writer had {lost}, the new event has "
            f"{[c for c, _e in store.events_since(0).events][-1]}")
        assert not read.restarted
    finally:
        store.close()


def silent_in_transaction_for(observer: PgStore, pid: int, seconds: float) -> bool:
    with observer._locked() as conn:
        row = conn.execute("SELECT state = 'idle in transaction' AND clock_timestamp() - state_change > "
                           "make_interval(secs => %s) AS long FROM pg_stat_activity WHERE pid = %s",
                           (seconds, pid)).fetchone()
    return bool(row and row["long"])


def test_a_writer_stuck_in_flight_does_not_hold_every_other_writer_up_at_each_read(stores, monkeypatch):
    """A reader waits for the writers in flight, and every writer that comes after it waits behind
    it: for a writer stuck before its commit (its host frozen or cut off), a reader reads nothing
    until it ends, at once, instead of holding the whole board up for EVENTS_WAIT at each read."""
    reader, writer, other, observer = stores(), stores(), stores(), stores()
    reader.add({"title": "one", "id": "one"})
    start = reader.events_end()
    monkeypatch.setattr(stream, "EVENTS_WAIT", HOLD)
    monkeypatch.setattr(stream, "STUCK_AFTER", 0.2)
    pid = backend_pid(writer)
    stuck = InFlight(writer, lambda s: s.append_event({"kind": "supervisor", "event": "note", "note": "stuck"}))
    try:
        wait_until(lambda: silent_in_transaction_for(observer, pid, 0.2), timeout=30)
        got: list[Any] = []
        follower = threading.Thread(target=lambda: got.append(reader.events_since(start)), daemon=True)
        follower.start()
        follower.join(30)
        assert got, "the reader waited for the stuck writer, and every writer after it waited behind it"
        assert (got[0].events, got[0].cursor, got[0].restarted) == ([], start, False)
        other.append_event({"kind": "supervisor", "event": "note", "note": "meanwhile"})
    finally:
        stuck.commit()
    follower.join(HOLD)
    batch = reader.events_since(start)
    assert [event["note"] for _c, event in batch.events] == ["stuck", "meanwhile"]


def test_a_writer_waiting_on_a_lock_in_its_transaction_is_not_stuck_its_event_is_waited_for(
        stores, pg_server, monkeypatch):
    """Only a writer whose client is silent is stuck: one whose statement waits (on a row another
    transaction holds) is working, and a reader waits for its event rather than going without."""
    reader, slow, observer = stores(), stores(), stores()
    slow.add({"title": "slow", "id": "slow"})
    held = slow.claim("ag")
    start = reader.events_end()
    monkeypatch.setattr(stream, "EVENTS_WAIT", HOLD)
    monkeypatch.setattr(stream, "STUCK_AFTER", 0.2)
    slow_pid, reader_pid = backend_pid(slow), backend_pid(reader)
    done: list[Any] = []
    got: list[Any] = []
    with psycopg.connect(pg_server.dsn, autocommit=True) as blocker, blocker.transaction():
        blocker.execute(f'SELECT 1 FROM "{slow.schema}".runs WHERE fence = %s FOR UPDATE', (held["claim"]["token"],))
        # The completion takes its cursor, then waits on its run's row before it commits.
        finisher = threading.Thread(target=lambda: done.append(slow.complete("slow", held["claim"]["token"])),
                                    daemon=True)
        finisher.start()
        wait_until(lambda: waits_for_a_lock(observer, slow_pid), timeout=30)
        wait_until(lambda: in_flight_for(observer, slow_pid, 0.2), timeout=30)
        follower = threading.Thread(target=lambda: got.append(reader.events_since(start)), daemon=True)
        follower.start()
        wait_until(lambda: waits_for_a_lock(observer, reader_pid) or got, timeout=30)
        assert not got, "the reader went without the event of a writer that was only waiting"
    finisher.join(HOLD)
    follower.join(HOLD)
    assert done and got
    assert [(event["task"], event["to"]) for _c, event in got[0].events] == [("slow", "done")]


def in_flight_for(observer: PgStore, pid: int, seconds: float) -> bool:
    with observer._locked() as conn:
        row = conn.execute("SELECT clock_timestamp() - xact_start > make_interval(secs => %s) AS long "
                           "FROM pg_stat_activity WHERE pid = %s", (seconds, pid)).fetchone()
    return bool(row and row["long"])
