"""The dashboard's stream says why it reads the board's events again from their start in the words of
the board's backend: the file board names its replaced log, the PostgreSQL board (a real server) its
database and no file."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.pg.store import PgStore
from hermes_sup.supervisor.dashboard.sse import Hub

from . import pgserver
from .pgserver import PgServer


def frames_since(board, cursor: int, inode: int | None, tmp_path: Path) -> list[tuple[str, dict]]:
    hub = Hub(board, tmp_path / "runs", dict)
    out: list[bytes] = []
    asyncio.run(hub._events_since(cursor, inode, out))
    found = []
    for chunk in out:
        lines = dict(line.split(": ", 1) for line in chunk.decode().strip().split("\n"))
        found.append((lines["event"], json.loads(lines["data"])))
    return found


@pytest.fixture
def pg_board(pg_server: PgServer, tmp_path: Path) -> Iterator[PgStore]:
    with pgserver.stores_on_one_schema(pg_server, f"t_{uuid.uuid4().hex[:12]}") as make:
        yield make("host-a", boot_id="boot-a", drop_root=tmp_path / "kanban")


def test_a_file_board_log_replaced_under_the_stream_is_named_in_the_reset(tmp_path: Path) -> None:
    board = Board(tmp_path / "kanban")
    try:
        board.add({"title": "one", "id": "one"})
        board.add({"title": "two", "id": "two"})
        cursor, inode = board.events_end(), os.stat(board.events_path).st_ino
        replaced = board.events_path.with_name("events.new")
        replaced.write_bytes(board.events_path.read_bytes().splitlines(keepends=True)[0])
        os.replace(replaced, board.events_path)  # by hand: a shorter log, another file
        frames = frames_since(board, cursor, inode, tmp_path)
    finally:
        board.close()
    assert frames[0] == ("reset", {"reason": f"{board.events_path} was replaced (by hand?) since cursor {cursor}; "
                                             "reading it from its start"})
    assert [data["task"] for kind, data in frames[1:]] == ["one"]


def test_a_postgresql_cursor_past_the_newest_event_is_named_in_the_reset(pg_board: PgStore, tmp_path: Path) -> None:
    pg_board.add({"title": "one", "id": "one"})
    end = pg_board.events_end()
    frames = frames_since(pg_board, end + 1000, None, tmp_path)  # a cursor of a board since recreated
    kind, data = frames[0]
    assert kind == "reset"
    assert data["reason"] == (f"cursor {end + 1000} is past the newest event of the board database "
                              f"({pg_board.dsn_env}): it comes from another board or one that was recreated; "
                              "reading it from its start")
    assert "events.jsonl" not in data["reason"]
    assert [data["task"] for kind, data in frames[1:]] == ["one"]
