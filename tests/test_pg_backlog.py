"""The PostgreSQL board's per-task statements read no more rows for a longer backlog (the suite's real server)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hermes_sup.kanban.pg import ingest as pgingest
from hermes_sup.kanban.pg import sql
from hermes_sup.kanban.pg.store import PgStore

from . import pgserver
from .pgserver import PgServer

BACKLOG = 300  # tasks with steps, waiting: what an agent with no LLM must not read after each task


@pytest.fixture
def make(pg_server: PgServer) -> Iterator[Callable[..., PgStore]]:
    with pgserver.stores_on_one_schema(pg_server, f"t_{uuid.uuid4().hex[:12]}") as maker:
        yield maker


@pytest.fixture
def store(make: Callable[..., PgStore]) -> PgStore:
    return make()


def explain(pg_server: PgServer, schema: str, statement: str, params: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of `statement` on `schema`, rolled back."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        with conn.transaction(force_rollback=True):
            explained = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchone()[0]
    return (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]


def rows_read(plan: dict[str, Any], relation: str) -> int:
    """The rows the plan's scans of `relation` looked at: returned, and removed by a filter or a recheck."""
    seen = 0
    if plan.get("Relation Name") == relation and "Scan" in plan.get("Node Type", ""):
        seen += int(plan.get("Actual Rows", 0)) + int(plan.get("Rows Removed by Filter", 0)) + \
            int(plan.get("Rows Removed by Index Recheck", 0))
    for child in plan.get("Plans", []):
        seen += rows_read(child, relation)
    return seen


def test_marking_the_tasks_an_llm_is_missing_for_reads_none_of_the_steps_tasks(store: PgStore,
                                                                               pg_server: PgServer) -> None:
    """Every agent marks after every task the waiting tasks it has no LLM for: that read every waiting
    task (8.7 ms with 7,000, after each task: 10,000 tasks drained at a sixth of 2,000's rate)."""
    steps = [{"tool": "write_file", "args": {"path": "out.txt", "content": "x"}}]
    for n in range(BACKLOG):
        store.add({"title": f"s{n}", "steps": steps})
    plain = [store.add({"title": f"p{n}"})["id"] for n in range(2)]
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'ANALYZE "{store.schema}".tasks')  # as autovacuum soon does on a busy board
    plan = explain(pg_server, store.schema, sql.MARK_WAITING_PLAIN,
                   {"reason": "no LLM provider", "agent": "a1", "roles": []})
    assert rows_read(plan, "tasks") <= 2 * len(plain) + 2, json.dumps(plan)[:3000]
    assert store.mark_waiting("no LLM provider", agent="a1") == len(plain)
    assert {store.get(task_id).get("waiting") for task_id in plain} == {"no LLM provider"}
    assert store.claim("a1", steps_only=True)["title"] == "s0"
    assert store.mark_waiting(None, agent="a1") == len(plain)  # the notes come off the same way


def test_a_burst_of_drops_has_the_table_analyzed_and_a_claim_reads_only_its_pick(
        make: Callable[..., PgStore], pg_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table never analyzed is planned as nearly empty: after a burst of drops each claim read and
    sorted every waiting task until autovacuum came (8 ms with 8,000). The ingest has it analyzed."""
    monkeypatch.setattr(pgingest, "ANALYZE_AFTER", 40)
    store = make(drop_root=tmp_path / "kanban")
    store.ingest()  # makes inbox/
    steps = [{"tool": "write_file", "args": {"path": "out.txt", "content": "x"}}]
    for n in range(BACKLOG):
        (tmp_path / "kanban" / "inbox" / f"d{n:04d}.json").write_text(
            json.dumps({"id": f"d{n:04d}", "title": "burst", "steps": steps}))
    assert len(store.ingest().ingested) == BACKLOG
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        reltuples = conn.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass",
                                 (f'"{store.schema}".tasks',)).fetchone()[0]
    assert reltuples >= 160, reltuples  # analyzed between batches: past 40, 80 and 160 tasks made
    params = {"agent": "a1", "roles": [], "host": store.host,
              "boot": store.boot_id, "pid": os.getpid(), "pid_started": 0.0, "lease": 60.0}
    plan = explain(pg_server, store.schema, sql.CLAIMS[False, False], params)
    assert rows_read(plan, "tasks") <= 4, json.dumps(plan)[:3000]
    assert store.claim("a1")["id"] == "d0000"
