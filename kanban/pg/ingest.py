"""A host's drops onto the shared board: the files of its inbox/ made into tasks, a batch a transaction.

A transaction per drop made every task pay a commit of its own, each a WAL flush and a NOTIFY (which
serializes commits): on 2 cores an ingest of 10,000 drops held one agent for tens of seconds while
the others waited for work. Up to INGEST_BATCH drops now share one transaction. A drop the board
refuses (an id taken by another task, a dependency cycle) is refused before it writes anything, so
the others in its batch still commit; a failure of the database itself inside a batch is retried a
drop per transaction, so that one drop PostgreSQL will not take cannot hold back the rest. A crash
between the commit and the files' moves is repaired by the next ingest, by each file's fingerprint.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg

from ..drops import ready as ready_drops
from ..errors import BoardError
from ..fsio import safe_name
from ..ingest import IngestReport, identity_of, read_drop
from ..task import TaskError
from . import drops, sql
from .rows import one
from .rules import landed_at, storable
from .storebase import StoreBase

if TYPE_CHECKING:
    from ..ingestturn import SoleIngester
    from .rules import TaskDoc

# Tasks one ingest makes before it has the table analyzed, and again each time as many more.
ANALYZE_AFTER = 500
# Drops made into tasks in one transaction: one commit for them all. A batch's first task is seen
# by claimers when the batch commits, a few tens of milliseconds after it was read.
INGEST_BATCH = 64
BATCH_LOCK_WAIT = "1s"


class IdTaken(TaskError):
    """A task with the id given is on the board already (PgStore._insert): refused, or for an
    ingest, the same drop's task made before."""


class Drop(NamedTuple):
    """A drop read and ready to be made a task."""

    path: Path
    doc: TaskDoc
    fp: str          # its fingerprint: the same file after a crash is known by it
    identity: Any    # what lstat said of the file read (kanban/ingest.py identity_of)


class IngestMixin(StoreBase):
    """PgStore's ingest: its drop folder's files onto the board, and its refusals set aside."""

    drop_root: Path | None
    _turn: SoleIngester | None

    if TYPE_CHECKING:  # defined by PgStore (store.py) and ClaimsMixin (claims.py)
        def _insert(self, cur: psycopg.Cursor[Any], doc: TaskDoc, *, fixed_id: bool, src: str | None, by: str,
                    note: str, at: str | None = None) -> TaskDoc: ...

        def _event(self, cur: psycopg.Cursor[Any], values: dict[str, Any]) -> None: ...

    def ingest(self, *, wait: bool = True) -> IngestReport:
        """Turn finished files in this host's inbox/ into tasks on the shared board; reject what
        cannot be one into rejected/ with the reason (the file board's rules, kanban/ingest.py).
        With `wait=False` (a waiting claimer's round) nothing is done while another process of this
        host ingests (kanban/ingestturn.py)."""
        report = IngestReport()
        if self.drop_root is None or self._turn is None:
            return report  # a store without a host folder (a tool, a test) has no inbox
        drops.ensure_layout(self.drop_root)
        self._turn.run(lambda: self._ingest_ready(report), wait=wait)
        return report

    def _ingest_ready(self, report: IngestReport) -> set[str]:
        assert self.drop_root is not None
        found, waiting = ready_drops(self.drop_root)
        report.waiting.extend(waiting)
        analyze_at = [ANALYZE_AFTER]
        batch: list[Drop] = []
        for path in found:
            drop = self._ready(path, report)
            if drop is None:
                continue
            if drop.doc.get("depends_on"):
                # Its cycle check waits for the board's dependency lock and reads the graph: in a
                # transaction of its own, as every drop was before batches, holding up no batch.
                self._flush(batch, report, analyze_at)
                batch = []
                self._flush([drop], report, analyze_at)
                continue
            batch.append(drop)
            if len(batch) >= INGEST_BATCH:
                self._flush(batch, report, analyze_at)
                batch = []
        self._flush(batch, report, analyze_at)
        return {path.name for path in found} | {name.removeprefix("inbox/") for name in waiting}

    def _flush(self, batch: list[Drop], report: IngestReport, analyze_at: list[int]) -> None:
        if not batch:
            return
        if len(report.ingested) >= analyze_at[0]:
            self.analyze()
            analyze_at[0] *= 2
        self._ingest_batch(batch, report)

    def analyze(self) -> None:
        """Tell the planner the tasks table grew (a burst of drops, mid-ingest; a migration). Until autovacuum
        came, a table never analyzed was planned as nearly empty: each claim read and sorted every
        waiting task (8 ms with 8,000), not the first of its index. Without ownership of the table
        the server only warns."""
        with contextlib.suppress(psycopg.Error), self._tx() as cur:
            # Bounded: it shares the connection with the host's heartbeat, and a VACUUM of the
            # table (autovacuum's, a person's) holds the lock it needs. Skipped then: autovacuum
            # will analyze the table itself.
            cur.execute("SET LOCAL lock_timeout = '500ms'")
            cur.execute("SET LOCAL statement_timeout = '5s'")
            cur.execute("ANALYZE tasks")

    def _ready(self, path: Path, report: IngestReport) -> Drop | None:
        """A drop read as it is now and ready to be made a task; None if it is gone, or it was
        refused or could not be read (reported)."""
        try:
            read = read_drop(path)
            if read is not None and identity_of(os.lstat(path)) != read.identity:
                # Rewritten since it was read: what lands on the board is what the file holds now.
                read = read_drop(path)
            if read is None:
                return None
            if read.reason is not None or read.doc is None:
                self._reject(path, read.reason or "cannot be read as a task", report)
                return None
        except FileNotFoundError:
            return None  # another process of this host took it
        except OSError as exc:
            self._failed(path, exc, report)
            return None
        doc = {**read.doc, "source": {"file": f"inbox/{path.name}", "fingerprint": read.fp}}
        return Drop(path, doc, read.fp, read.identity)

    def _ingest_batch(self, batch: list[Drop], report: IngestReport) -> None:
        refused: list[tuple[Path, str]] = []
        try:
            with self._tx() as cur:
                if len(batch) > 1:
                    # A batch holds the events lock from its first task's event to its commit: it
                    # waits for no other lock for long (another ingester's drop, say); it fails
                    # instead, and its drops are taken one a transaction.
                    cur.execute(f"SET LOCAL lock_timeout = '{BATCH_LOCK_WAIT}'")
                for drop in batch:
                    try:
                        self._make_task(cur, drop.doc, drop.fp)
                    except TaskError as exc:  # raised before the drop wrote anything: the batch goes on
                        refused.append((drop.path, str(exc)))
        except BoardError as exc:
            if len(batch) > 1:
                for drop in batch:  # one drop the database will not take must not hold back the others
                    self._ingest_batch([drop], report)
                return
            if self._connection_lost():
                raise
            refused_by_data = (exc.sqlstate or "")[:2] in ("22", "23")  # a value out of range, say: for good
            if not refused_by_data:  # a lock waited for too long, a server shutting down: next time
                report.failed.append({"file": f"inbox/{safe_name(batch[0].path.name)}",
                                      "reason": f"{exc}; it is tried again on the next ingest"})
                return
            refused = [(batch[0].path, f"the board's database refused it: {exc}")]
            batch = []
        refused_paths = {path for path, _ in refused}
        for drop in batch:
            if drop.path not in refused_paths:
                try:
                    drops.archive(self.drop_root, drop.path, drop.doc["id"], drop.identity)  # type: ignore[arg-type]
                except OSError as exc:
                    self._failed(drop.path, exc, report)
                    continue
                report.ingested.append(drop.doc["id"])
        for path, reason in refused:
            try:
                self._reject(path, reason, report)
            except OSError as exc:
                self._failed(path, exc, report)

    def _make_task(self, cur: psycopg.Cursor[Any], doc: TaskDoc, fp: str) -> None:
        """The drop's task, unless this very file's task is on the board already (made by a
        process that died before moving the file away)."""
        rel = doc["source"]["file"]
        # The clock's time, not the transaction's: the tasks of a batch keep the order of their drops.
        now = one(cur.execute(f"SELECT {sql.CLOCK_ISO} AS now"))["now"]
        try:
            self._insert(cur, landed_at(doc, now), fixed_id=True, src="inbox", by="ingest",
                         note=f"ingested from {rel}", at=now)
        except IdTaken:
            # Taken; by this file's own task (made by a process of this host that died before
            # moving the file, or is ingesting it now: the insert waited for its commit) when the
            # fingerprints agree, and then the file is only archived. Both take the drops in the
            # inbox's order; were they to deadlock, the database ends one's batch, which is then
            # retried a drop at a time.
            row = one(cur.execute("SELECT (SELECT document->'source'->>'fingerprint' FROM tasks WHERE id = %s) AS fp",
                                  (doc["id"],)))
            if row["fp"] != fp:
                raise

    def _failed(self, path: Path, exc: OSError, report: IngestReport) -> None:
        # A file that cannot be moved must not stop the drops after it; it is tried again next
        # time, and its task, if already written, is found by its fingerprint.
        report.failed.append({"file": f"inbox/{safe_name(path.name)}",
                              "reason": f"could not be taken: {exc.strerror or exc}; it is tried again "
                                        "on the next ingest"})

    def _reject(self, path: Path, reason: str, report: IngestReport) -> None:
        assert self.drop_root is not None
        name = safe_name(path.name)
        try:
            dest = drops.set_aside(self.drop_root, path, reason)
        except FileNotFoundError:
            return  # another process of this host took it first
        with self._tx() as cur:
            self._event(cur, {"id": name, "src": "inbox", "dst": "rejected", "by": "ingest",
                              "note": storable(reason)})
        report.rejected.append({"file": f"inbox/{name}", "moved_to": f"rejected/{dest.name}", "reason": reason})
