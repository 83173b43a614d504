"""Lock-free scans of the status folders, and the generation that says whether a scan saw one moment."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from .doccache import FIELDS_NAME, VERSION, DocCache, collector_paused
from .errors import Damaged
from .fsio import safe_name
from .task import STATUSES, is_valid_id

TaskDoc = dict[str, Any]
Generation = tuple[tuple[int, int, int] | None, ...]

_ID, _CREATED, _PRIORITY = itemgetter("id"), itemgetter("created_at"), itemgetter("priority")

# What a board listing shows of a task and judges it by (order, why it waits), kept as they are.
LISTED = ("id", "title", "status", "priority", "created_at", "updated_at", "assignee", "role", "depends_on",
          "attempts", "max_attempts", "error", "waiting", "question")
CLAIM_LISTED = ("agent", "host", "lease_until_ts")  # of a held task's claim (never its token)


def listed_fields(doc: TaskDoc) -> TaskDoc:
    """The fields of a checked task document a listing needs (pure): LISTED, the claim's agent, host
    and lease end (the dashboard's cards show them), `steps` as whether it has any, `meta` as its
    parent alone (a delegated subtask), and `history` as the number of its entries. Its body,
    result, history and steps (most of a finished task's bytes) are left out: a listing of 10,000
    tasks reads them from its cache for nothing."""
    fields = {name: doc[name] for name in LISTED if name in doc}
    claim = doc.get("claim")
    fields["claim"] = {key: claim.get(key) for key in CLAIM_LISTED} if isinstance(claim, dict) else None
    fields["steps"] = bool(doc.get("steps"))
    meta = doc.get("meta")
    parent = meta.get("parent") if isinstance(meta, dict) else None
    fields["meta"] = {"parent": parent} if isinstance(parent, dict) else {}
    fields["history"] = len(doc["history"])
    return fields


# A cache of other fields is never believed: a change to what listed_fields keeps renames its version.
FIELDS_VERSION = f"{VERSION}:" + ",".join((*LISTED, *(f"claim.{key}" for key in CLAIM_LISTED), "steps?",
                                            "meta.parent", "history#"))


@dataclass
class Listing:
    tasks: list[TaskDoc]
    damaged: list[dict[str, str]]
    # (folder, id) of documents whose status is not their folder's, outside doing/: moved by hand,
    # or caught mid-transition by a lock-free scan (the board tells them apart under its lock).
    misplaced: list[tuple[str, str]] = field(default_factory=list)


def generation(root: Path) -> Generation:
    """What every move changes: the event log's size (each transition is logged before its file is
    moved) and the status folders' modification times (for the moves a recovery finishes without
    logging again)."""
    parts: list[tuple[int, int, int] | None] = []
    for name in ("events.jsonl", *STATUSES):
        try:
            info = os.lstat(root / name)
        except FileNotFoundError:
            parts.append(None)
            continue
        parts.append((info.st_ino, info.st_size if name == "events.jsonl" else 0, info.st_mtime_ns))
    return tuple(parts)


def scan(root: Path, status: str | None, read: Callable[[Path], TaskDoc], *, fields: bool = False) -> Listing:
    """Every task document in the status folders (or one), each id once, in claim order; with
    `fields`, each as its listed_fields only (from a cache of those alone)."""
    with collector_paused():
        return _scan(root, status, read, fields)


def _scan(root: Path, status: str | None, read: Callable[[Path], TaskDoc], fields: bool) -> Listing:
    found: dict[str, TaskDoc] = {}
    damaged: list[dict[str, str]] = []
    misplaced: list[tuple[str, str]] = []
    cache = DocCache(root, FIELDS_NAME, listed_fields, FIELDS_VERSION) if fields else DocCache(root)
    for folder in [status] if status else STATUSES:
        try:
            entries = list(os.scandir(root / folder))
        except FileNotFoundError:
            damaged.append({"path": f"{folder}/", "reason": "status folder is missing"})
            continue
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                doc = cache.read(folder, entry, read)
            except FileNotFoundError:
                continue
            except Damaged as exc:
                damaged.append({"path": f"{folder}/{safe_name(entry.name, 255)}", "reason": str(exc)})
                continue
            if doc["status"] != folder and folder != "doing":
                misplaced.append((folder, doc["id"]))
            seen = found.get(doc["id"])
            # A transition caught between its write and its rename shows up twice; the longer
            # history is the newer state.
            if seen is None or (doc["history"] > seen["history"] if fields
                                else len(doc["history"]) > len(seen["history"])):
                found[doc["id"]] = doc
    cache.save()
    columns: dict[str, list[TaskDoc]] = {name: [] for name in STATUSES}
    for doc in found.values():
        if status is None or doc["status"] == status:
            columns[doc["status"]].append(doc)
    tasks = []
    for docs in columns.values():
        in_claim_order(docs)
        tasks += docs
    return Listing(tasks, damaged, misplaced)


def in_claim_order(docs: list[TaskDoc]) -> None:
    """Sort checked documents (whose priority is an int, created_at a string) in place into
    rules.claim_order: by id, then by age, then by priority, each sort stable. Three sorts on one
    plain field each take a quarter of the time of one on the key tuple (4 against 13 ms for 10,000)."""
    docs.sort(key=_ID)
    docs.sort(key=_CREATED)
    docs.sort(key=_PRIORITY, reverse=True)  # reverse keeps equal ones in order


def ids(root: Path) -> set[str]:
    """The ids of the task files in the status folders (names only: nothing is read)."""
    found: set[str] = set()
    for status in STATUSES:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(root / status) as entries:
            for entry in entries:
                stem = entry.name[:-5] if entry.name.endswith(".json") else ""
                if is_valid_id(stem):
                    found.add(stem)
    return found


def count(root: Path) -> dict[str, int]:
    """How many task files each status folder holds."""
    counts = {}
    for status in STATUSES:
        try:
            counts[status] = sum(1 for entry in os.scandir(root / status)
                                 if entry.name.endswith(".json") and not entry.name.startswith("."))
        except FileNotFoundError:
            counts[status] = 0
    return counts
