"""The PostgreSQL board's ingest, a batch of drops a transaction: the drops' order is kept, and a drop
refused by the board or by the database holds back none of the others (the suite's real server)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hermes_sup.kanban.pg import ingest as pgingest
from hermes_sup.kanban.pg.store import PgStore

from . import pgserver
from .pgserver import PgServer

DROPS = pgingest.INGEST_BATCH + 6  # over a batch: two transactions


@pytest.fixture
def store(pg_server: PgServer, tmp_path: Path) -> Iterator[PgStore]:
    with pgserver.stores_on_one_schema(pg_server, f"t_{uuid.uuid4().hex[:12]}") as make:
        made: PgStore = make(drop_root=tmp_path / "kanban")
        made.ingest()  # makes inbox/
        yield made


def drop(store: PgStore, name: str, doc: dict, order: int) -> None:
    """A drop, `order` deciding when it was made (the inbox is taken oldest first)."""
    path = Path(store.drop_root) / "inbox" / name
    path.write_text(json.dumps(doc))
    when = 1_700_000_000_000_000_000 + order * 1_000_000
    os.utime(path, ns=(when, when))


def test_drops_become_tasks_in_their_order_and_a_refused_one_spares_its_batch(store: PgStore) -> None:
    store.add({"id": "taken", "title": "already on the board"})
    # Ids that sort against the drops' order: the order of the tasks is the drops', not their ids'.
    ids = [f"t{DROPS - n:03d}" for n in range(DROPS)]
    for n, task_id in enumerate(ids):
        drop(store, f"n{n:03d}.json", {"id": "taken" if n == 30 else task_id, "title": f"drop {n}"}, n)
    report = store.ingest()
    expected = [task_id for n, task_id in enumerate(ids) if n != 30]
    assert report.ingested == expected
    assert [r["file"] for r in report.rejected] == ["inbox/n030.json"]
    assert "already exists" in report.rejected[0]["reason"]
    assert report.failed == []
    created = [store.get(task_id)["created_at"] for task_id in expected]
    assert created == sorted(created) and len(set(created)) == len(created)
    claimed = [store.claim("a1")["id"] for _ in range(len(expected) + 1)]
    assert claimed == ["taken", *expected]
    assert list((Path(store.drop_root) / "inbox").iterdir()) == []


def test_a_drop_whose_task_was_made_before_its_file_moved_is_archived_not_made_again(store: PgStore,
                                                                                     tmp_path: Path) -> None:
    drop(store, "d.json", {"id": "d", "title": "once"}, 0)
    path = Path(store.drop_root) / "inbox" / "d.json"
    keep = tmp_path / "keep.json"
    os.link(path, keep)  # the same file (inode, times), to put back
    assert store.ingest().ingested == ["d"]
    os.link(keep, path)  # as if that ingest had died after its commit, before moving the file
    report = store.ingest()
    assert (report.ingested, report.rejected, report.failed) == (["d"], [], [])
    assert not path.exists() and [doc["id"] for doc in store.list().tasks] == ["d"]
    assert [e["task"] for _c, e in store.events_since(0).events if e.get("task")] == ["d"], "one event"


def test_a_drop_the_database_will_not_take_holds_back_none_of_the_others(store: PgStore,
                                                                         pg_server: PgServer) -> None:
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{store.schema}"')
        conn.execute("CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "IF NEW.id = 'poison' THEN RAISE EXCEPTION 'poison refused'; END IF; RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER refuse_poison BEFORE INSERT ON tasks FOR EACH ROW "
                     "EXECUTE FUNCTION refuse_poison()")
    for n in range(5):
        drop(store, f"n{n}.json", {"id": "poison" if n == 2 else f"ok{n}", "title": f"drop {n}"}, n)
    report = store.ingest()
    assert report.ingested == ["ok0", "ok1", "ok3", "ok4"]
    assert [f["file"] for f in report.failed] == ["inbox/n2.json"], report.failed
    assert "poison refused" in report.failed[0]["reason"] and report.rejected == []
    assert [p.name for p in (Path(store.drop_root) / "inbox").iterdir()] == ["n2.json"]  # kept, to try again
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP TRIGGER refuse_poison ON "{store.schema}".tasks')
    assert store.ingest().ingested == ["poison"]


def test_a_connection_lost_before_a_batch_loses_no_drop_and_makes_none_twice(store: PgStore,
                                                                              pg_server: PgServer) -> None:
    for n in range(3):
        drop(store, f"n{n}.json", {"id": f"ok{n}", "title": f"drop {n}"}, n)
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        ended = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                             "'hermes-sup' AND pid <> pg_backend_pid()").fetchall()
    assert ended  # the store's connection among them: its batch fails, and its drops are taken again
    assert store.ingest().ingested == ["ok0", "ok1", "ok2"]
    assert sorted(doc["id"] for doc in store.list().tasks) == ["ok0", "ok1", "ok2"]
    assert list((Path(store.drop_root) / "inbox").iterdir()) == []


def test_a_drop_whose_values_the_database_refuses_is_rejected_saying_so(store: PgStore) -> None:
    """The file board takes a priority of 21 digits; the table's bigint does not: such a drop is
    set aside for good (tried again, it would fail again), and the drops beside it land."""
    for n in range(3):
        doc = {"id": f"ok{n}", "title": f"drop {n}", **({"priority": 10 ** 20} if n == 1 else {})}
        drop(store, f"n{n}.json", doc, n)
    report = store.ingest()
    assert report.ingested == ["ok0", "ok2"] and report.failed == []
    assert [r["file"] for r in report.rejected] == ["inbox/n1.json"]
    assert "refused" in report.rejected[0]["reason"], report.rejected
    assert (Path(store.drop_root) / "rejected" / "n1.json").exists()


def test_a_drop_renamed_over_one_being_ingested_goes_back_to_the_inbox(tmp_path: Path) -> None:
    from hermes_sup.kanban.ingest import identity_of
    from hermes_sup.kanban.pg import drops

    root = tmp_path / "kanban"
    drops.ensure_layout(root)
    path = root / "inbox" / "task.json"
    path.write_text('{"title": "first"}')
    read = identity_of(os.lstat(path))
    newer = root / "stage.json"
    newer.write_text('{"title": "second"}')
    os.rename(newer, path)  # as `mv` puts a new version in place while the first is being ingested
    drops.archive(root, path, "first", read)
    assert [p.read_text() for p in (root / "inbox").iterdir()] == ['{"title": "second"}']
    assert list((root / ".ingested").iterdir()) == []
    path.rename(root / "stage.json")
    (root / "stage.json").rename(path)
    drops.archive(root, path, "second", identity_of(os.lstat(path)))  # the file that was read: kept
    assert [p.name for p in (root / ".ingested").iterdir()] == ["second--task.json"]
