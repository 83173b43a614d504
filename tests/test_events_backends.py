"""What `events` says of a stream it must read again from its start comes from the board's backend: the
file board names its events.jsonl, the PostgreSQL board (a real server) its database and no file."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.pg.store import PgStore
from hermes_sup.supervisor.cli.events import print_since

from . import pgserver
from .pgserver import PgServer


@pytest.fixture
def pg_board(pg_server: PgServer) -> Iterator[PgStore]:
    with pgserver.stores_on_one_schema(pg_server, f"t_{uuid.uuid4().hex[:12]}") as make:
        yield make("host-a", boot_id="boot-a")


def test_a_postgresql_board_read_again_from_its_start_names_no_file(pg_board: PgStore, capsys) -> None:
    pg_board.add({"title": "one", "id": "one"})
    end = pg_board.events_end()
    cursor, _ = print_since(pg_board, end + 1000, as_json=False)  # a cursor of a board since recreated
    out, err = capsys.readouterr()
    assert "one" in out and cursor == end
    assert "events.jsonl" not in err
    assert f"cursor {end + 1000} is past the newest event of the board database" in err
    assert "reading it from its start" in err


def test_a_file_board_read_again_from_its_start_names_its_log(tmp_path, capsys) -> None:
    board = Board(tmp_path / "kanban")
    try:
        board.add({"title": "one", "id": "one"})
        print_since(board, board.events_end() + 1000, as_json=False)
    finally:
        board.close()
    err = capsys.readouterr().err
    assert f"{tmp_path / 'kanban' / 'events.jsonl'} was replaced (by hand?) since cursor" in err


def test_the_events_marker_moves_with_the_stream_on_either_board(pg_board: PgStore, tmp_path) -> None:
    """Equal while nothing is appended, different after a transition and after an appended record."""
    board = Board(tmp_path / "kanban")
    try:
        for store in (board, pg_board):
            store.add({"title": "one", "id": "one"})
            before = store.events_marker()
            assert store.events_marker() == before
            store.add({"title": "two", "id": "two"})
            after_add = store.events_marker()
            assert after_add != before
            store.append_event({"kind": "supervisor", "at": "2026-01-01T00:00:00Z", "note": "hi"})
            assert store.events_marker() not in (before, after_add)
    finally:
        board.close()


def test_the_postgresql_events_marker_takes_no_events_lock(pg_board: PgStore, pg_server: PgServer) -> None:
    """Another session holds the events lock exclusively (as events_end takes it): the marker is still
    read at once, so a reader looking often queues no writer behind it."""
    import threading

    from hermes_sup.kanban.pg import sql

    pg_board.add({"title": "one", "id": "one"})
    with psycopg.connect(pg_server.dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (sql.EVENTS_LOCK, pg_board.schema))
        got: list = []
        reader = threading.Thread(target=lambda: got.append(pg_board.events_marker()), daemon=True)
        reader.start()
        reader.join(10)
        assert got, "the marker waited on the events lock"
