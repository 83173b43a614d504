"""A PostgreSQL board's times are the database's: a claim ended (complete, fail, block, release, a
recovery, a cancel) by a host whose clock is three days behind is stamped, in its document, its
history, its event and its run, between two readings of the database's clock around the whole
run, and never by the host's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import psycopg

from . import pgserver
from .pgserver import PgServer

SCRIPT = Path(__file__).resolve().parent / "pg_skewed_ends.py"
SKEW = -3 * 86400.0  # three days behind: a stamp by the host's clock is on another day altogether
EPSILON = 0.001  # the stamps are kept to the microsecond; their reading back to a float may round


def epoch(iso: str) -> float:
    return datetime.strptime(iso.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def db_now(dsn: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return float(conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0])


def test_a_claims_end_is_stamped_by_the_databases_clock_not_a_skewed_hosts(pg_server: PgServer) -> None:
    schema = f"clock_{os.urandom(6).hex()}"
    with pgserver.stores_on_one_schema(pg_server, schema) as make:
        make("test")  # the schema and its tables, made before the skewed host comes
        before = db_now(pg_server.dsn)
        done = subprocess.run([sys.executable, str(SCRIPT), schema, str(SKEW)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "HERMES_SUP_TEST_PG_DSN": pg_server.dsn})
        after = db_now(pg_server.dsn)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout)
        # The host's clock really was off, as every reading of it in that process says.
        assert abs(epoch(out["host_now"]) - after - SKEW) < 60, out["host_now"]

        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            rows = {row[0]: row[1:] for row in conn.execute(
                f'SELECT id, status, document FROM "{schema}".tasks').fetchall()}
            events = conn.execute(f'SELECT task, dst, extract(epoch FROM at)::float8 FROM "{schema}".events '
                                  "WHERE src = 'doing'").fetchall()
            runs = conn.execute(f'SELECT task_id, extract(epoch FROM ended_at)::float8 FROM "{schema}".runs').fetchall()

    assert {task: status for task, (status, _doc) in rows.items()} == {
        "completed": "done", "failed-once": "todo", "failed-for-good": "failed", "blocked": "blocked",
        "asked": "blocked", "released": "todo", "cancelled": "cancelled", "recovered": "todo"}
    assert sorted(out["ids"]) == sorted(rows)

    def by_the_database(stamp: float, what: str) -> None:
        assert before - EPSILON <= stamp <= after + EPSILON, (
            f"{what} stamped {stamp - after:+.3f} s from the database's clock (the host's is {SKEW:+.0f} s off)")

    for task, (_status, doc) in rows.items():
        end = doc["history"][-1]
        assert end["from"] == "doing", (task, end)
        by_the_database(epoch(end["at"]), f"{task}: its end in history")
        by_the_database(epoch(doc["updated_at"]), f"{task}: updated_at")
        by_the_database(epoch(doc["history"][-2]["at"]), f"{task}: its claim")
    assert sorted(task for task, _dst, _at in events) == sorted(rows)
    for task, _dst, at in events:
        by_the_database(at, f"{task}: its event")
    assert sorted(task for task, _at in runs) == sorted(rows)
    for task, ended_at in runs:
        by_the_database(ended_at, f"{task}: its run's end")
