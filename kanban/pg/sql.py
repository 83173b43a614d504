"""The SQL statements of the PostgreSQL board, in one place so that their guards can be read together.

Every time a decision depends on is the database's `now()`: hosts' clocks never enter a lease,
a heartbeat or a recovery.
"""

from __future__ import annotations

NOW_ISO = """to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
# The clock's time as it runs, not the transaction's: rows made in one transaction keep their order.
CLOCK_ISO = """to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""

ROW_SELECT = """id, status, attempts, claims, max_attempts, priority, role, assignee, document,
    lease_owner, lease_host, lease_boot, lease_pid, lease_pid_started,
    to_char(lease_claimed AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS claimed_iso,
    to_char(lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS until_iso,
    CASE WHEN isfinite(lease_until) THEN extract(epoch FROM lease_until)::float8 END AS until_ts, fence"""
# (A timestamp another host wrote may be 'infinity', which to_char reads as NULL and extract as a float
# no JSON holds: the page's JSON.parse, and /api/snapshot, failed on it. Decisions stay in SQL.)

# Cursors come from a sequence before their transaction commits, so a smaller one can become
# visible after a larger. Every transaction that writes an event holds this lock, shared, from
# before it takes its cursor until it ends (writers never wait for each other); a reader takes it
# exclusively for an instant, and every cursor up to the sequence's value then belongs to an
# ended transaction: it reads up to there and misses none.
EVENTS_LOCK = 0x6873
EVENTS_LOCK_SHARED = "SELECT pg_advisory_xact_lock_shared(%(lock)s, hashtext(current_schema()))"
# The same lock taken inside a statement that reads the row an event will be about (a claim's pick,
# an end's HELD): no statement of its own. It is taken in a select list above the row's lock (the
# locking select is a subquery), so after the row is had: a writer waiting for a row while holding
# it would hold up a reader queued for it, and every writer queued behind that reader. Its column
# is used by what follows, so the planner cannot leave it out.
_EVENTS_LOCKED = (f"pg_advisory_xact_lock_shared({EVENTS_LOCK}, hashtext(current_schema())) IS NOT NULL "
                  "AS events_locked")

# The claim, in one statement: the best claimable row not locked by another claimer (SKIP LOCKED,
# walking the partial index in priority order), taken with a new fence from the sequence and every
# liveness field of any earlier claim overwritten, its run and its event recorded.
OBJECT_DOC = "(CASE WHEN jsonb_typeof(t.document) = 'object' THEN t.document ELSE '{}'::jsonb END)"
def _claim(only: str) -> str:
    return f"""
WITH picked AS (
    SELECT p.id, {_EVENTS_LOCKED} FROM (
        SELECT t.id FROM tasks t
        WHERE t.status = 'todo'
          AND (t.assignee IS NULL OR t.assignee = %(agent)s::text){only}
          AND (t.role IS NULL OR t.role = ANY(%(roles)s::text[]))
          AND (NOT t.has_deps OR NOT EXISTS (
                SELECT 1 FROM dependencies d LEFT JOIN tasks dt ON dt.id = d.depends_on
                WHERE d.task_id = t.id AND dt.status IS DISTINCT FROM 'done'))
        ORDER BY t.priority DESC, t.created, t.id
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED
    ) p
), claimed AS (
    UPDATE tasks t SET
        status = 'doing',
        fence = nextval('fence_seq'),
        attempts = t.attempts + 1,
        claims = t.claims + 1,
        lease_owner = %(agent)s::text,
        lease_host = %(host)s::text,
        lease_boot = %(boot)s::text,
        lease_pid = %(pid)s::integer,
        lease_pid_started = %(pid_started)s::float8,
        lease_claimed = now(),
        lease_until = now() + make_interval(secs => %(lease)s::float8),
        -- A document that is no object (written by hand) is claimed as an empty one: the claim then
        -- sets it aside.
        document = ({OBJECT_DOC} - 'waiting') || jsonb_build_object(
            'updated_at', {NOW_ISO},
            'history', COALESCE({OBJECT_DOC}->'history', '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                'at', {NOW_ISO}, 'by', %(agent)s::text, 'from', 'todo', 'to', 'doing',
                'note', format('claimed by %%s (attempt %%s of %%s)', %(agent)s::text, t.attempts + 1,
                               t.max_attempts))))
    FROM picked
    WHERE t.id = picked.id AND picked.events_locked
    RETURNING t.*
), run AS (
    INSERT INTO runs (fence, task_id, agent, host_id, boot_id, pid, pid_started)
    SELECT fence, id, lease_owner, lease_host, lease_boot, lease_pid, lease_pid_started FROM claimed
), ev AS (
    INSERT INTO events (task, src, dst, by, note)
    SELECT id, 'todo', 'doing', lease_owner, document->'history'->-1->>'note' FROM claimed

)
SELECT {ROW_SELECT},
    -- No journal row can exist: its first claim (every row needs an earlier claim's token), and none
    -- left by a task of that id before (prune keeps model calls). Judged on the row version claimed,
    -- not on the statement's snapshot: a claim and release by another agent while this statement
    -- ran leaves claims above 1, where EXISTS would not see their rows.
    (claimed.claims = 1 AND NOT EXISTS (SELECT 1 FROM journal j WHERE j.task_id = claimed.id)) AS unjournaled
FROM claimed
"""


# The claim for (steps_only, assigned_only): those two as SQL, not parameters. With `NOT $n OR ...`
# the server's plan for any value cost more than its plan for the values at hand, so it planned
# the statement again at each claim (0.15 ms of its CPU, 16 agents on 2 cores).
CLAIMS = {(steps, assigned): _claim(("\n      AND t.has_steps" if steps else "")
                                    + ("\n      AND t.assignee = %(agent)s::text" if assigned else ""))
          for steps in (False, True) for assigned in (False, True)}

# A holder's row, locked, only while `token` still holds it: no row means the lease is gone.
HELD = f"""SELECT {ROW_SELECT}, {NOW_ISO} AS now_iso FROM tasks
    WHERE id = %(id)s AND status = 'doing' AND fence = %(token)s FOR UPDATE"""
# HELD for the holder's end of its claim, the events lock taken once the row is (WRITE's event follows).
HELD_ENDING = f"SELECT h.*, {_EVENTS_LOCKED} FROM ({HELD}) h"

RENEW = f"""UPDATE tasks SET lease_until = now() + make_interval(secs => %(lease)s::float8)
    WHERE id = %(id)s AND status = 'doing' AND fence = %(token)s
    RETURNING {ROW_SELECT}"""

ANY_ROW = f"SELECT {ROW_SELECT}, {NOW_ISO} AS now_iso FROM tasks WHERE id = %(id)s"
ANY_ROW_LOCKED = ANY_ROW + " FOR UPDATE"

# A claimed row that is no task (rules.unreadable: written by hand) failed at once, in the claim's
# transaction, the reason its error and its event's note, its run ended: no agent runs it.
SET_ASIDE = """UPDATE tasks SET status = 'failed',
        document = (CASE WHEN jsonb_typeof(document) = 'object' THEN document ELSE '{}'::jsonb END)
            || jsonb_build_object('error', %(why)s::text, 'updated_at', """ + NOW_ISO + """),
        lease_owner = NULL, lease_host = NULL, lease_boot = NULL, lease_pid = NULL, lease_pid_started = NULL,
        lease_claimed = NULL, lease_until = NULL, fence = NULL
    WHERE id = %(id)s"""

# Writes a whole task state, on a row its caller locked in the same transaction (HELD, STALE_HELD
# or ANY_ROW_LOCKED): the fence was checked there, once; leaving doing clears every lease field.
# With it, in the same statement, the end of the claim's run (if %(token)s names one) and the
# transition's event, whose row comes back (none: the task was not there) saying whether a task
# depends on this one. The caller holds the events lock (EVENTS_LOCK_SHARED) already.
WRITE = """WITH written AS (
    UPDATE tasks SET
        status = %(status)s, attempts = %(attempts)s, claims = %(claims)s, document = %(document)s::jsonb,
        lease_owner = NULL, lease_host = NULL, lease_boot = NULL, lease_pid = NULL, lease_pid_started = NULL,
        lease_claimed = NULL, lease_until = NULL, fence = NULL
    WHERE id = %(id)s
    RETURNING id
), run AS (
    UPDATE runs SET ended_at = now(), outcome = %(status)s WHERE fence = %(token)s AND ended_at IS NULL
)
INSERT INTO events (task, src, dst, by, note) SELECT id, %(src)s, %(dst)s, %(by)s, %(note)s FROM written
RETURNING EXISTS (SELECT 1 FROM dependencies WHERE depends_on = task) AS frees"""

# A new task and its event, in one statement; no row back when the id is taken. `created` (the claim
# order's second key) and the event's time are the transaction's time unless given: an ingest
# batch's tasks each give the clock's time at their drop (CLOCK_ISO), so they are claimed in their
# drops' order. A task entering todo has its event stored as the file board's log line (`record`,
# with what the claimers' indexes keep: kanban/index.py carried), so the supervisor's look at each
# ingested task needs no read of it (supervisor/ingestwarn.py). The caller holds the events lock.
INSERT_TASK = """WITH made AS (
    INSERT INTO tasks (id, status, role, assignee, priority, has_steps, has_deps, attempts, max_attempts,
        claims, document, created)
    VALUES (%(id)s, %(status)s, %(role)s, %(assignee)s, %(priority)s, %(has_steps)s, %(has_deps)s, %(attempts)s,
        %(max_attempts)s, %(claims)s, %(document)s::jsonb, COALESCE(%(created)s::timestamptz, now()))
    ON CONFLICT (id) DO NOTHING
    RETURNING id, status
)
INSERT INTO events (task, src, dst, by, note, at, record)
    SELECT id, %(src)s, status, %(by)s, %(note)s, COALESCE(%(created)s::timestamptz, now()), %(record)s::jsonb
    FROM made
    RETURNING cursor"""

EVENT = "INSERT INTO events (task, src, dst, by, note) VALUES (%(id)s, %(src)s, %(dst)s, %(by)s, %(note)s)"
# An event at a time of the clock read with its change (an ingest batch's task: see CLOCK_ISO).
EVENT_AT = """INSERT INTO events (task, src, dst, by, note, at)
    VALUES (%(id)s, %(src)s, %(dst)s, %(by)s, %(note)s, %(at)s::timestamptz)"""
EVENTS_TRY = "SELECT pg_try_advisory_xact_lock(%(lock)s, hashtext(current_schema())) AS got"
EVENTS_NEWEST = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS newest FROM events_cursor_seq"
# Whether a writer holding the lock has said nothing in its transaction for longer than %(secs)s
# (its host frozen or cut off; one running a statement or waiting on a lock is not): a reader
# queued behind it would hold every later writer up too. Its state is seen where pg_stat_activity
# shows it (the same role, or pg_read_all_stats); where not, the reader queues, EVENTS_WAIT at most.
EVENTS_STUCK = """SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %(lock)s
      AND l.objid = hashtext(current_schema())::oid AND l.objsubid = 2 AND l.pid <> pg_backend_pid()
      AND a.state LIKE 'idle in transaction%%'
      AND a.state_change < clock_timestamp() - make_interval(secs => %(secs)s)) AS stuck"""
EVENTS_BOUND = """SELECT pg_advisory_xact_lock(%(lock)s, hashtext(current_schema())),
    (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM events_cursor_seq) AS bound"""
# Any host with the board's credentials can write any row: one larger than %(max_bytes)s (the file
# board's longest event line) is no event the board wrote, and is sent as its cursor alone, so one
# row as big as a field holds (a gigabyte) never reaches a reader; `has_record` tells a record that
# is JSON null (no event either) from a transition's missing one. The record's stored size is looked
# at first (cheap), then its text's: one that compresses well is no smaller to read.
EVENTS_SINCE = """SELECT cursor, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS at, oversized,
        CASE WHEN oversized THEN NULL ELSE task END AS task, CASE WHEN oversized THEN NULL ELSE src END AS src,
        CASE WHEN oversized THEN NULL ELSE dst END AS dst, CASE WHEN oversized THEN NULL ELSE by END AS by,
        CASE WHEN oversized THEN NULL ELSE note END AS note, record IS NOT NULL AS has_record,
        CASE WHEN oversized THEN NULL ELSE record END AS record
    FROM events, LATERAL (SELECT octet_length(task) + octet_length(by) + octet_length(note)
            + COALESCE(octet_length(src), 0) + COALESCE(octet_length(dst), 0)
            + CASE WHEN record IS NULL THEN 0 WHEN pg_column_size(record) > %(max_bytes)s THEN %(max_bytes)s + 1
                   ELSE octet_length(record::text) END > %(max_bytes)s AS oversized) AS size
    WHERE cursor > %(cursor)s AND cursor <= %(bound)s ORDER BY cursor LIMIT %(limit)s"""
# The newest committed cursor up to a bound: where a reader starting now begins. Never the bound
# itself, which may be a rolled-back writer's cursor, one a crash can hand out again.
EVENTS_LAST = "SELECT COALESCE(max(cursor), 0) AS last FROM events WHERE cursor <= %(bound)s"
# A look that takes no lock (the sequence's value moves at every cursor taken, committed or not), with
# the sequence's identity (a schema recreated) and the server's start (after a crash the sequence
# may hand out a value it gave before, to another event).
EVENTS_MARKER = """SELECT to_regclass('events_cursor_seq')::oid AS seq,
    pg_sequence_last_value(to_regclass('events_cursor_seq')) AS last, pg_postmaster_start_time() AS started"""
RECORD = "INSERT INTO events (task, by, record) VALUES ('', %(kind)s, %(record)s) RETURNING cursor"
END_RUN = "UPDATE runs SET ended_at = now(), outcome = %(outcome)s WHERE fence = %(token)s AND ended_at IS NULL"

# Claims a sweeper may take back: the lease ran out, or the holder's host stopped heartbeating for
# host_timeout, or it came back under a new boot id (its processes of before are gone). Judged by
# the database's clock alone.
STALE = """SELECT t.id, t.fence, t.lease_owner, t.lease_host,
        CASE WHEN t.lease_until < now() THEN 'lease expired'
             WHEN h.boot_id <> t.lease_boot THEN 'host restarted'
             ELSE 'host silent' END AS why
    FROM tasks t LEFT JOIN hosts h ON h.host_id = t.lease_host
    WHERE t.status = 'doing' AND (t.lease_until < now()
        OR h.heartbeat < now() - make_interval(secs => %(host_timeout)s::float8)
        OR h.boot_id <> t.lease_boot)"""

# The same test, on one row held by `token`, inside the transaction that takes it back.
STALE_HELD = HELD.replace(" FOR UPDATE", """ AND (lease_until < now() OR EXISTS (
        SELECT 1 FROM hosts h WHERE h.host_id = tasks.lease_host
        AND (h.heartbeat < now() - make_interval(secs => %(host_timeout)s::float8) OR h.boot_id <> tasks.lease_boot)))
    FOR UPDATE""")

LOCAL_HELD = """SELECT id, fence, lease_owner, lease_pid, lease_pid_started FROM tasks
    WHERE status = 'doing' AND lease_host = %(host)s AND lease_boot = %(boot)s"""

HEARTBEAT = """INSERT INTO hosts (host_id, boot_id, agents) VALUES (%(host)s, %(boot)s, %(agents)s)
    ON CONFLICT (host_id) DO UPDATE SET heartbeat = now(), boot_id = EXCLUDED.boot_id, agents = EXCLUDED.agents,
        started_at = CASE WHEN hosts.boot_id = EXCLUDED.boot_id THEN hosts.started_at ELSE now() END"""
HOST_AGENTS = """SELECT host_id AS host,
        to_char(heartbeat AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS heartbeat,
        -- A heartbeat any host may have written as 'infinity' or '-infinity': now() minus it fails
        -- the whole statement (every host's agents panel empty), so it has no age (its text is NULL).
        CASE WHEN isfinite(heartbeat) THEN extract(epoch FROM now() - heartbeat)::float8 END AS age,
        heartbeat < now() - make_interval(secs => %(host_timeout)s::float8) AS silent,
        -- Its stored size first (cheap), then its text's: a summary that compresses well is no smaller to read.
        CASE WHEN pg_column_size(agents) > %(max_bytes)s THEN NULL
             WHEN octet_length(agents::text) > %(max_bytes)s THEN NULL ELSE agents END AS agents
    FROM hosts ORDER BY host_id LIMIT %(limit)s"""

# One holder at a time: taken when free or expired, kept by renewing it before it runs out. A lease
# ending later than MAX_LEASE from now was written by no holder (each takes a few seconds; any host
# with the credentials can write 'infinity', and then nobody would sweep again): it is nobody's.
MAX_LEASE = 60.0
TAKE_LEASE = """INSERT INTO leases (name, holder, until) VALUES (%(name)s, %(holder)s,
        now() + make_interval(secs => %(secs)s::float8))
    ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until
        WHERE leases.holder = EXCLUDED.holder OR leases.until < now()
            OR leases.until > now() + make_interval(secs => """ + f"{MAX_LEASE:g}" + """)
    RETURNING holder"""

JOURNAL_APPEND = """INSERT INTO journal (task_id, fence, entry)
    SELECT id, fence, %(entry)s::jsonb FROM tasks
    WHERE id = %(id)s AND status = 'doing' AND fence = %(token)s FOR SHARE
    RETURNING seq"""

# The holder's fence, checked and held for the rest of a journal transaction: a claim that moves on
# meanwhile waits for it, so no row of a stale holder lands after the new holder read the journal.
JOURNAL_FENCE = """SELECT fence FROM tasks WHERE id = %(id)s AND status = 'doing' AND fence = %(token)s FOR SHARE"""

JOURNAL_INSERT = """INSERT INTO journal (task_id, fence, kind, agent, name, entry)
    VALUES (%(id)s, %(token)s, %(kind)s, %(agent)s, %(name)s, %(entry)s::jsonb)"""

# Entries appended, in their order, while the token holds the task: one statement, so one round
# trip and one transaction, the fence held (FOR SHARE) until it commits. No row back: the claim is lost.
JOURNAL_WRITE = """INSERT INTO journal (task_id, fence, kind, agent, name, entry)
    SELECT t.id, t.fence, %(kind)s, %(agent)s, %(name)s, e.entry
    FROM (SELECT id, fence FROM tasks WHERE id = %(id)s AND status = 'doing' AND fence = %(token)s FOR SHARE) t,
         jsonb_array_elements(%(entries)s::jsonb) WITH ORDINALITY AS e(entry, n)
    ORDER BY e.n
    RETURNING seq"""

JOURNAL_ROWS = """SELECT seq, fence, task_id, kind, agent, name, entry FROM journal
    WHERE task_id = %(id)s AND kind = %(kind)s AND seq > %(after)s
      AND (%(agents)s::text[] IS NULL OR agent = ANY(%(agents)s::text[]))
      AND (%(name)s::text IS NULL OR name = %(name)s::text)
    ORDER BY seq"""

# What a task's journal holds, per kind, agent and name: how many rows and the newest seq (no entry
# is sent), so a reader that follows it reads rows again only when they changed.
JOURNAL_MARKS = """SELECT kind, agent, name, count(*) AS rows, max(seq) AS last FROM journal
    WHERE task_id = %(id)s GROUP BY kind, agent, name ORDER BY kind, agent, name"""

# Every task's (`usage` reads the team's model calls): a statement of its own, so the one above
# keeps its plan on the task's index.
JOURNAL_ROWS_ALL = """SELECT seq, fence, task_id, kind, agent, name, entry FROM journal
    WHERE kind = %(kind)s AND seq > %(after)s
      AND (%(agents)s::text[] IS NULL OR agent = ANY(%(agents)s::text[]))
      AND (%(name)s::text IS NULL OR name = %(name)s::text)
    ORDER BY seq"""

# A prune of finished tasks' journals: their rows but the model calls (`usage` reads those), only
# while the task is finished. FOR SHARE holds a concurrent retry off until the rows are gone, and a
# retry that came first is seen (the row is read again): its task is no longer finished, its rows stay.
JOURNAL_PRUNABLE = """SELECT id FROM tasks WHERE id = ANY(%(ids)s::text[])
      AND status IN ('done', 'failed', 'cancelled') FOR SHARE"""
JOURNAL_PRUNE_SIZE = """SELECT count(DISTINCT task_id) AS tasks, count(*) AS rows,
    COALESCE(sum(pg_column_size(journal.*)), 0) AS bytes
    FROM journal WHERE task_id = ANY(%(ids)s::text[]) AND kind <> 'llm'"""
JOURNAL_PRUNE = """DELETE FROM journal WHERE task_id = ANY(%(ids)s::text[]) AND kind <> 'llm'"""

# The waiting note on every todo task it applies to (all, or those `agent` could claim now), written
# only where it differs; rows a claimer holds locked are skipped, not waited for. Two statements:
# the one every agent runs after every task, on the tasks without steps (MARK_WAITING_PLAIN), says
# `NOT t.has_steps` as a literal so the planner can read them from their own index (schema v6),
# not every waiting task; MARK_WAITING is for all of them.
_MARK_WAITING = """
WITH noted AS (
    SELECT t.id FROM tasks t
    WHERE t.status = 'todo'{plain}
      AND t.document->'waiting' IS DISTINCT FROM to_jsonb(%(reason)s::text)
      AND (%(agent)s::text IS NULL OR (
            (t.assignee IS NULL OR t.assignee = %(agent)s::text)
            AND (t.role IS NULL OR t.role = ANY(%(roles)s::text[]))
            AND (NOT t.has_deps OR NOT EXISTS (
                SELECT 1 FROM dependencies d LEFT JOIN tasks dt ON dt.id = d.depends_on
                WHERE d.task_id = t.id AND dt.status IS DISTINCT FROM 'done'))))
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE tasks t SET document = CASE WHEN %(reason)s::text IS NULL THEN t.document - 'waiting'
        ELSE t.document || jsonb_build_object('waiting', %(reason)s::text) END
    FROM noted WHERE t.id = noted.id AND t.status = 'todo'"""
MARK_WAITING = _MARK_WAITING.format(plain="")
MARK_WAITING_PLAIN = _MARK_WAITING.format(plain="\n      AND NOT t.has_steps")
