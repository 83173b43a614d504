"""The shared board's tables in PostgreSQL, as numbered migrations applied once each, in order."""

from __future__ import annotations

import re
from typing import Any

from psycopg.rows import tuple_row

# Every migration is applied in one transaction, under an advisory lock, and recorded in
# `migrations`: hosts starting together apply each exactly once, and a failed one leaves nothing.
# Never edit an applied migration; add the next one.
MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "tasks, dependencies, runs, hosts, events, journal, leases", """
CREATE SEQUENCE fence_seq;

-- One row per task. The columns are what claims, leases and recovery decide on; `document` holds
-- the rest of the task document of CONTRACT section 3 (title, body, history, result, ...).
CREATE TABLE tasks (
    id                text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,63}$'),
    status            text NOT NULL CHECK (status IN ('todo', 'doing', 'blocked', 'done', 'failed', 'cancelled')),
    role              text,
    assignee          text,
    priority          bigint NOT NULL DEFAULT 0,
    has_steps         boolean NOT NULL DEFAULT false,
    has_deps          boolean NOT NULL DEFAULT false,
    attempts          integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL CHECK (max_attempts >= 1),
    claims            integer NOT NULL DEFAULT 0,
    created           timestamptz NOT NULL DEFAULT now(),
    document          jsonb NOT NULL,
    -- The current claim: who holds it, where, until when (the database's clock), with which fence.
    lease_owner       text,
    lease_host        text,
    lease_boot        text,
    lease_pid         integer,
    lease_pid_started double precision,
    lease_claimed     timestamptz,
    lease_until       timestamptz,
    fence             bigint
);
-- Claimable rows only, in claim order: a claim walks this index and stops at its first free match.
CREATE INDEX tasks_claimable ON tasks (priority DESC, created, id) WHERE status = 'todo';
CREATE INDEX tasks_held ON tasks (lease_until) WHERE status = 'doing';

CREATE TABLE dependencies (
    task_id    text NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    depends_on text NOT NULL,
    PRIMARY KEY (task_id, depends_on)
);
CREATE INDEX dependencies_on ON dependencies (depends_on);

-- One row per attempt (claim), named by its fence.
CREATE TABLE runs (
    fence       bigint PRIMARY KEY,
    task_id     text NOT NULL,
    agent       text NOT NULL,
    host_id     text NOT NULL,
    boot_id     text NOT NULL,
    pid         integer,
    pid_started double precision,
    started_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    outcome     text
);
CREATE INDEX runs_task ON runs (task_id);

-- One row per host: a stable id (the `host:` name), the id of its current boot, and a heartbeat
-- written by the database's clock.
CREATE TABLE hosts (
    host_id    text PRIMARY KEY,
    boot_id    text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat  timestamptz NOT NULL DEFAULT now()
);

-- Every transition, read by cursor (the `events` command, the dashboard).
CREATE TABLE events (
    cursor bigserial PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now(),
    task   text NOT NULL,
    src    text,
    dst    text,
    by     text NOT NULL,
    note   text NOT NULL DEFAULT ''
);

-- What a resumed attempt needs from the ones before it (completed steps, tool results), written
-- only by the holder of the fence it names.
CREATE TABLE journal (
    seq     bigserial PRIMARY KEY,
    task_id text NOT NULL,
    fence   bigint NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    entry   jsonb NOT NULL
);
CREATE INDEX journal_task ON journal (task_id, seq);

-- Named leases (the sweeper's): one holder at a time, until a time by the database's clock.
CREATE TABLE leases (
    name   text PRIMARY KEY,
    holder text NOT NULL,
    until  timestamptz NOT NULL
);
"""),
    (2, "events that move no task", """
-- The supervisor's, an agent's, an alert's events (append_event): the whole record, whose `kind`
-- says whose; `task` is empty for them.
ALTER TABLE events ADD COLUMN record jsonb;
"""),
    (3, "the agents' task journal: kind, agent, transcript name", """
-- An agent's journal of a task (kanban/pg/journal.py): its messages (`name` is the transcript they
-- belong to: the current one, or one set aside), its tool calls and its model calls. Rows written
-- through journal_append keep kind 'entry'.
ALTER TABLE journal ADD COLUMN kind text NOT NULL DEFAULT 'entry'
    CHECK (kind IN ('entry', 'message', 'tool', 'llm'));
ALTER TABLE journal ADD COLUMN agent text NOT NULL DEFAULT '';
ALTER TABLE journal ADD COLUMN name text NOT NULL DEFAULT '';
"""),
    (4, "each host's agents, published with its heartbeat", """
-- What each host's supervisor says of its agents with every heartbeat (announce_host): the
-- dashboard's agents panel of any host shows every host's. Written by that host: judged by readers.
ALTER TABLE hosts ADD COLUMN agents jsonb;
"""),
    (5, "the tasks table vacuumed by count", """
-- Every task that leaves todo leaves a dead entry at the front of the claim's partial index until
-- a VACUUM removes it, and every claim walks them (bench/pg_bench.py: p50 0.7 -> 6.9 ms with
-- 200,000). The server's default waits for a fifth of the table to be dead, which grows with the
-- board; vacuum after about 1,000 dead rows plus 1% instead, so the claim stays flat on a big board.
ALTER TABLE tasks SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
"""),
    (6, "the waiting tasks an LLM is missing for, indexed", """
-- Every agent marks, after every task, the waiting tasks it could take but has no LLM for (those
-- without steps: sql.MARK_WAITING_PLAIN). Through the claim's index that read every waiting task's
-- document (8.7 ms with 7,000 waiting, after each task: a backlog of 10,000 drained at a sixth of
-- the rate of 2,000); this index holds only those tasks, none on a board of steps tasks.
CREATE INDEX tasks_plain_todo ON tasks (id) WHERE status = 'todo' AND NOT has_steps;
"""),
)

SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# Any fixed number: the advisory lock that serializes migrations across hosts.
MIGRATION_LOCK = 0x6865726D


def check_schema_name(name: object) -> str:
    """The PostgreSQL schema the board's tables live in; a plain identifier only (it is quoted into SQL)."""
    if not isinstance(name, str) or not SCHEMA_RE.fullmatch(name):
        raise ValueError(f"board schema {name!r} must match [a-z_][a-z0-9_]{{0,62}}")
    return name


def pending(applied: set[int]) -> list[tuple[int, str, str]]:
    """The migrations not applied yet, in order (pure)."""
    return [m for m in MIGRATIONS if m[0] not in applied]


def migrate(conn: Any, schema: str) -> list[int]:
    """Create `schema` and bring its tables to the newest version; the versions applied now.
    `conn` is a psycopg connection in autocommit mode."""
    schema = check_schema_name(schema)
    done: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".migrations (version integer PRIMARY KEY, '
                     "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        with conn.cursor(row_factory=tuple_row) as cur:
            applied = {row[0] for row in cur.execute(f'SELECT version FROM "{schema}".migrations')}
        for version, name, sql in pending(applied):
            conn.execute(f'SET LOCAL search_path TO "{schema}"')
            conn.execute(sql)
            conn.execute(f'INSERT INTO "{schema}".migrations (version, name) VALUES (%s, %s)', (version, name))
            done.append(version)
    return done
