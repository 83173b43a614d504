"""Comments and waiting notes (no transition) and answers to a blocked task's question."""

from __future__ import annotations

import time
from collections.abc import Iterable

from . import base, rules
from .base import COMMENT_RESERVE, Folder, TaskDoc
from .claims import Claims
from .errors import Damaged, InvalidTransition
from .fsio import dumps, write_atomic, write_json_atomic
from .task import MAX_BYTES, TaskError, now_iso
from .txn import Transactions


class Notes:
    """The board's comment, answer and waiting-note verbs, through its transaction core and claim index."""

    def __init__(self, disk: Folder, txn: Transactions, claims: Claims) -> None:
        self.disk = disk
        self.txn = txn
        self.claims = claims
        self.noted: dict[str, tuple[str | None, str | None]] = {}  # mark_waiting's last note, per version

    def mark_waiting(self, reason: str | None, *, needs_llm: bool = True, agent: str | None = None,
                     roles: Iterable[str] = ()) -> int:
        """Say on each todo task (without `steps`, when `needs_llm`) why it is not being worked, or
        clear that note with None. Not a transition: no event, no history entry. Candidates come
        from the in-memory index (which knows which tasks have no steps and which had a note) and
        this board remembers what it noted, so a call reads only tasks whose note it would change:
        agents call this after every task. With `agent` (and its `roles`), only the
        tasks it could claim now are noted: its provider is no reason for a task it could not take."""
        if not self.claims.catch_up():
            with self.disk.locked():
                self.claims.refresh_index()
        roles = tuple(roles)
        index = self.disk.index

        def indexed_done(dep: str) -> bool:
            return index.status.get(dep) == "done"

        # Only tasks whose note could change: those this call would note (without steps, when a
        # provider is what is missing), and with no reason only those noted, as read or by us; a
        # walk of the whole backlog after every task made each task cost more the longer it was.
        for gone in [task_id for task_id in self.noted if index.meta(task_id) is None]:
            del self.noted[gone]  # each once: it left todo (a task back in todo is read again)
        pool = index.plain if needs_llm else index.todo_ids()
        if reason is None:
            pool = pool & (index.noted | {task_id for task_id, (said, _at) in self.noted.items() if said is not None})
        # A note stands for the task as it was: any transition changes updated_at, a note does not.
        candidates = [meta["id"] for meta in map(index.meta, sorted(pool))
                      if meta is not None
                      and (agent is None or rules.can_claim(meta, agent, roles, indexed_done))
                      and self.noted.get(meta["id"]) != (reason, meta["updated_at"])]
        changed = 0
        for task_id in candidates:
            with self.disk.locked():
                path = self.disk.path("todo", task_id)
                try:
                    current = self.disk.read(path)
                except (FileNotFoundError, Damaged):
                    continue
                if current["status"] != "todo" or self.txn.has_marker(task_id):
                    continue
                if current.get("waiting") != reason:
                    noted = {k: v for k, v in current.items() if k != "waiting"}
                    write_json_atomic(path, {**noted, "waiting": reason} if reason else noted, fsync=False)
                    changed += 1
                self.noted[task_id] = (reason, current.get("updated_at"))
        return changed

    def comment(self, task_id: str, text: str, *, by: str = "cli", wait: float = 5.0) -> TaskDoc:
        """Add a comment to a task in any status. Not a transition: no event, the status and
        updated_at stay; the comment carries its own time and author. A claim or move in flight
        (its marker) is waited out, as a transition would overwrite the comment."""
        if not isinstance(text, str):
            raise TaskError(f"a comment is text, not {type(text).__name__}")
        size = len(text.encode("utf-8", "backslashreplace"))
        if size > MAX_BYTES:
            raise TaskError(f"the comment is {size} bytes; the limit for a comment is {MAX_BYTES} bytes (1 MiB)")
        deadline = time.monotonic() + wait
        while True:
            with self.disk.locked():
                found = self.disk.locate_or_raise(task_id)
                if not self.txn.has_marker(task_id):
                    doc = self.disk.read(found[1])
                    entry = {"at": now_iso(), "by": by, "text": text}
                    new = {**doc, "comments": [*(doc.get("comments") or []), entry]}
                    data = dumps(new)
                    if len(data) > base.MAX_DOCUMENT_BYTES - COMMENT_RESERVE:
                        raise TaskError(f"task {task_id} has no room for this comment: its comments may fill "
                                        f"{base.MAX_DOCUMENT_BYTES - COMMENT_RESERVE} bytes of its document, the "
                                        "rest is kept for its result")
                    write_atomic(found[1], data)
                    return new
            if time.monotonic() > deadline:
                raise InvalidTransition(f"task {task_id} is being moved; try the comment again")
            time.sleep(0.01)

    def answer(self, task_id: str, text: str, *, by: str = "cli") -> TaskDoc:
        """Answer the question a blocked task asked: it goes back to todo with the answer among its
        comments, marked as the answer to that question, for the agent that takes it next."""
        if not isinstance(text, str):
            raise TaskError(f"an answer is text, not {type(text).__name__}")
        if not text.strip():
            raise InvalidTransition("an answer must not be empty")
        size = len(text.encode("utf-8", "backslashreplace"))
        if size > MAX_BYTES:
            raise TaskError(f"the answer is {size} bytes; the limit for an answer is {MAX_BYTES} bytes (1 MiB)")
        with self.disk.locked():
            folder, path = self.disk.locate_or_raise(task_id)
            return self.txn.commit(folder, rules.answered(self.disk.read(path), text, by=by, now=now_iso()))
