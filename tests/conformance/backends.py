"""How the conformance suite builds and inspects each board backend: one `Backend` entry per backend.

A test talks to the board only through the protocol verbs (kanban/store.py). What the protocol
cannot say (where a dropped file goes, how the event log is read by cursor, what a backend keeps
outside its documents) is answered here, per backend, so that adding a backend is one entry in
BACKENDS. Tests that need a property only some backends have (files moved by hand between
folders, a log file that can be torn) ask for it by capability (`@pytest.mark.requires(...)`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.kanban import Board, later, markers
from hermes_sup.kanban.events import read_since
from hermes_sup.kanban.liveness import holder_alive
from hermes_sup.kanban.pg import boot_id
from hermes_sup.kanban.task import STATUSES

ROOT = Path(__file__).resolve().parents[2]
# Backends to run, comma-separated (default: every entry of BACKENDS).
BACKENDS_ENV = "HERMES_SUP_CONFORMANCE_BACKENDS"

# Capabilities a backend may have; a test that needs one is skipped for a backend without it.
HAND_MOVES = "hand-moves"  # task documents are files a person can `mv` between status folders
EVENT_LOG_FILE = "event-log-file"  # the event log is a file a killed writer can leave torn
FAULT_POINTS = "fault-points"  # its code calls kanban.faults.fault() between the steps of a transition

Store = Any  # a BoardStore (kanban/store.py); Any so that a backend's extra verbs type-check
Cursor = int
EventBatch = tuple[list[tuple[Cursor, dict[str, Any]]], Cursor]


@dataclass(frozen=True)
class Backend:
    kind: str
    # (tmp_path, **opts) -> an open store; the same tmp_path from another process opens the same board.
    build: Callable[..., Store]
    capabilities: frozenset[str]
    # The events after a cursor, each with the cursor just after it, and the cursor to read on from.
    read_events: Callable[[Store, Cursor], EventBatch]
    # The folder a dropped file goes into, and the one a rejected drop lands in.
    inbox: Callable[[Store], Path]
    rejected: Callable[[Store], Path]
    # task id -> every place the backend keeps a document for it (status names); one place each.
    places: Callable[[Store], dict[str, list[str]]]
    # What a finished or rolled-back transition must not leave behind (temp files, reservations).
    leftovers: Callable[[Store], list[str]]
    # The source files whose fault("POINT") calls name the steps of this backend's transitions.
    fault_sources: tuple[Path, ...] = ()
    # Move a task's document by hand from one status to another (HAND_MOVES only).
    hand_move: Callable[[Store, str, str, str], None] | None = None
    # Write fields into a task's document past the board (a person's editor, an older version,
    # anyone with the database): what the board must cope with reading back.
    hand_edit: Callable[[Store, str, dict[str, Any]], None] | None = None
    # Run once per test before `build`, with the test's request and monkeypatch: starts or finds
    # what the backend needs (a server) and says where it is in the environment, which the
    # test's worker processes inherit.
    prepare: Callable[[pytest.FixtureRequest, pytest.MonkeyPatch], None] | None = None


# -- the file backend ---------------------------------------------------------------------------

def _files_build(tmp_path: Path, **opts: Any) -> Store:
    return Board(tmp_path / "kanban", **opts)


def _files_events(store: Store, cursor: Cursor) -> EventBatch:
    batch = read_since(store.events_path, cursor)
    return batch.events, batch.cursor


def _files_places(store: Store) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for status in STATUSES:
        for name in os.listdir(store.root / status):
            if name.endswith(".json") and not name.startswith("."):
                found.setdefault(name[:-5], []).append(status)
    return found


def _files_leftovers(store: Store) -> list[str]:
    # The old documents this process's transitions freed are unlinked on a thread (kanban/later.py):
    # not half-done, only not yet done. A live process's owner file is no marker (kanban/markers.py).
    assert later.flush(10), "the unlink thread did not finish"
    stray = [f".pending/{name}" for name in os.listdir(store.root / ".pending")
             if not _live_owner(store.root / ".pending" / name)]
    stray += [f"{status}/{name}" for status in STATUSES for name in os.listdir(store.root / status)
              if name.startswith(".")]
    return stray


def _live_owner(path: Path) -> bool:
    owner = markers.owner_of(path) if path.name.startswith(markers.OWNER_PREFIX) else None
    return owner is not None and holder_alive(owner[0], owner[1], None) is True


def _files_hand_move(store: Store, task_id: str, src: str, dst: str) -> None:
    os.rename(store.root / src / f"{task_id}.json", store.root / dst / f"{task_id}.json")


def _files_hand_edit(store: Store, task_id: str, fields: dict[str, Any]) -> None:
    [status] = _files_places(store)[task_id]
    path = store.root / status / f"{task_id}.json"
    edited = path.with_name(f"edited-{task_id}.tmp")  # an editor's save: a new file put in its place
    edited.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    os.replace(edited, path)


# -- the PostgreSQL backend ---------------------------------------------------------------------

# Where the test's server is: set by _pg_prepare for the test and its worker processes.
PG_DSN_ENV = "HERMES_SUP_CONFORMANCE_PG_DSN"
PG_HOST = "conformance-host"


def _pg_prepare(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    server = request.getfixturevalue("pg_server")  # one server per session (tests/pgserver.py)
    monkeypatch.setenv(PG_DSN_ENV, server.dsn)


def _pg_schema(tmp_path: Path) -> str:
    # A schema per board directory: each test (and each board within one) starts empty, for the
    # price of a few CREATE TABLEs instead of a server or a database.
    return "conf_" + hashlib.sha256(str(tmp_path.absolute()).encode()).hexdigest()[:24]


def _pg_build(tmp_path: Path, **opts: Any) -> Store:
    from hermes_sup.kanban.pg.store import PgStore

    dsn = os.environ.get(PG_DSN_ENV)
    if not dsn:
        raise RuntimeError(f"{PG_DSN_ENV} is not set: the postgres backend is built inside a test (see _pg_prepare)")
    # One host for every process of a test, on this machine's real boot: a holder that dies is
    # seen gone by its pid, as on a host of a team.
    return PgStore(dsn, schema=_pg_schema(tmp_path), host=PG_HOST, boot_id=boot_id(),
                   drop_root=tmp_path / "kanban", **opts)


def _pg_hand_edit(store: Store, task_id: str, fields: dict[str, Any]) -> None:
    from psycopg.types.json import Jsonb

    with store._locked() as conn:
        conn.execute("UPDATE tasks SET document = document || %s WHERE id = %s", (Jsonb(fields), task_id))


def _pg_events(store: Store, cursor: Cursor) -> EventBatch:
    read = store.events_since(cursor)
    return read.events, read.cursor


def _pg_places(store: Store) -> dict[str, list[str]]:
    with store._locked() as conn:
        rows = conn.execute("SELECT id, status FROM tasks").fetchall()
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(row["id"], []).append(row["status"])
    return found


def _pg_leftovers(store: Store) -> list[str]:
    """What a transition must not leave behind in the database: a lease outside doing, a task in
    doing without one, a run still open for a claim that ended."""
    with store._locked() as conn:
        stray = [f"tasks/{row['id']}: {row['status']} with fence {row['fence']}" for row in conn.execute(
            "SELECT id, status, fence FROM tasks WHERE (status = 'doing') <> (fence IS NOT NULL AND "
            "lease_owner IS NOT NULL AND lease_until IS NOT NULL)").fetchall()]
        stray += [f"runs/{row['fence']}: open for {row['task_id']}" for row in conn.execute(
            "SELECT r.fence, r.task_id FROM runs r LEFT JOIN tasks t ON t.id = r.task_id AND t.fence = r.fence "
            "AND t.status = 'doing' WHERE r.ended_at IS NULL AND t.id IS NULL").fetchall()]
    return stray


BACKENDS: dict[str, Backend] = {
    "files": Backend(
        kind="files",
        build=_files_build,
        capabilities=frozenset({HAND_MOVES, EVENT_LOG_FILE, FAULT_POINTS}),
        read_events=_files_events,
        inbox=lambda store: store.root / "inbox",
        rejected=lambda store: store.root / "rejected",
        places=_files_places,
        leftovers=_files_leftovers,
        fault_sources=tuple(sorted((ROOT / "kanban").glob("*.py"))),
        hand_move=_files_hand_move,
        hand_edit=_files_hand_edit,
    ),
    # No HAND_MOVES: a task is a row, there is no folder to move it into. No EVENT_LOG_FILE: events
    # are rows written in the transition's own transaction, never torn.
    "postgres": Backend(
        kind="postgres",
        build=_pg_build,
        capabilities=frozenset({FAULT_POINTS}),
        read_events=_pg_events,
        inbox=lambda store: store.drop_root / "inbox",
        rejected=lambda store: store.drop_root / "rejected",
        places=_pg_places,
        leftovers=_pg_leftovers,
        fault_sources=(ROOT / "kanban" / "pg" / "store.py",),
        hand_edit=_pg_hand_edit,
        prepare=_pg_prepare,
    ),
}


def make_store(kind: str, tmp_path: Path, **opts: Any) -> Store:
    """An open store of backend `kind` on the board that `tmp_path` names."""
    return BACKENDS[kind].build(Path(tmp_path), **opts)


def selected_kinds() -> list[str]:
    wanted = [kind.strip() for kind in os.environ.get(BACKENDS_ENV, "").split(",") if kind.strip()]
    unknown = [kind for kind in wanted if kind not in BACKENDS]
    if unknown:
        raise ValueError(f"{BACKENDS_ENV} names unknown backends {unknown}; known: {sorted(BACKENDS)}")
    return wanted or list(BACKENDS)


FAULT_CALL = re.compile(r"""\bfault\(\s*["']([^"':]+)["']\s*\)""")


def fault_points(backend: Backend) -> list[str]:
    """Every fault point the backend's code declares, in order of first appearance."""
    points: list[str] = []
    for source in backend.fault_sources:
        for point in FAULT_CALL.findall(source.read_text()):
            if point not in points:
                points.append(point)
    return points


def tasks(store: Store, status: str | None = None) -> list[dict[str, Any]]:
    """The documents `list` returns, whatever container the backend wraps them in."""
    listing = store.list(status)
    return list(getattr(listing, "tasks", listing))


def all_events(backend: Backend, store: Store) -> list[tuple[Cursor, dict[str, Any]]]:
    """Every event on the board, from the start, read in as many batches as it takes."""
    found: list[tuple[Cursor, dict[str, Any]]] = []
    cursor = 0
    while True:
        batch, after = backend.read_events(store, cursor)
        if not batch:
            return found
        found += batch
        cursor = after
