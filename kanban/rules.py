"""The board's rules as pure functions over task documents, written once and used by every backend.

Claim order and eligibility (status, role, assignee, dependencies, steps), max attempts, lease
expiry and recovery, and which hand changes are allowed. Nothing here reads a file or a clock: the
caller passes what it knows (`done(id)`, `now`), so a PostgreSQL backend applies the same rules
inside its own transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import InvalidTransition
from .task import STATUSES, transition

TaskDoc = dict[str, Any]

# A person may put a task in any status but doing (only a claim enters it); these may be retried.
RETRYABLE = ("blocked", "failed", "cancelled")
FINAL = ("done", "cancelled")  # cancel refuses these: there is nothing left to stop


def claim_order(doc: Mapping[str, Any]) -> tuple[int, str, str]:
    """Claim order: higher priority first, then older, then id, so that ties have one order."""
    return (-int(doc.get("priority", 0)), str(doc.get("created_at", "")), str(doc["id"]))


def can_claim(doc: Mapping[str, Any], agent: str, roles: Iterable[str], done: Callable[[str], bool]) -> bool:
    """Whether `agent` (with `roles`) may claim `doc` now. `done(id)` tells if a dependency is done."""
    if doc.get("status") != "todo":
        return False
    assignee = doc.get("assignee")
    if assignee and assignee != agent:
        return False
    role = doc.get("role")
    if role and role not in set(roles):
        return False
    return all(done(dep) for dep in doc.get("depends_on") or ())


def eligible(doc: Mapping[str, Any], agent: str, roles: Iterable[str], done: Callable[[str], bool], *,
             steps_only: bool = False, assigned_only: bool = False, has_steps: bool | None = None) -> bool:
    """`can_claim`, narrowed for a claimer that takes only tasks with `steps` (no LLM provider) or
    only its own assigned tasks (a delegated child). `has_steps` stands in for `doc["steps"]` when
    `doc` is an index entry that keeps only whether it has some."""
    if steps_only and not (doc.get("steps") if has_steps is None else has_steps):
        return False
    if assigned_only and doc.get("assignee") != agent:
        return False
    return can_claim(doc, agent, roles, done)


def exhausted(doc: Mapping[str, Any]) -> bool:
    """Whether the task used up its attempts: a failed or abandoned one goes to failed, not todo."""
    return int(doc.get("attempts") or 0) >= int(doc.get("max_attempts") or 1)


def lease_expired(claim: Mapping[str, Any] | None, now: float) -> bool:
    lease_until = (claim or {}).get("lease_until_ts")
    return isinstance(lease_until, (int, float)) and now > lease_until


def held_by(doc: Mapping[str, Any], token: int) -> bool:
    """Whether `token` holds the task: the fence every holder's write passes."""
    return doc.get("status") == "doing" and (doc.get("claim") or {}).get("token") == token


# -- ends of a claim (the holder's verbs and recovery) ------------------------------------------------


def claimed(doc: TaskDoc, claim: dict[str, Any], *, now: str) -> TaskDoc:
    """The document of a todo task once `claim` (its agent, pid, lease) holds it: token and attempt counted."""
    token = int(doc.get("claims") or 0) + 1
    attempt = int(doc.get("attempts") or 0) + 1
    agent = claim["agent"]
    return transition(doc, "doing", by=agent, now=now,
                      note=f"claimed by {agent} (attempt {attempt} of {doc['max_attempts']})",
                      claim={**claim, "token": token}, attempts=attempt, claims=token)


def ended(doc: TaskDoc, to: str, note: str, *, now: str, give_back_attempt: bool = False,
          **changes: Any) -> TaskDoc:
    """The document of a held task after its holder ends the claim, going to `to`. An attempt that
    did not really happen (a shutdown, a question) is given back."""
    if give_back_attempt:
        changes["attempts"] = max(0, int(doc["attempts"]) - 1)
    return transition(doc, to, by=doc["claim"]["agent"], now=now, note=note, claim=None, **changes)


def failed_attempt(doc: TaskDoc, error: str, *, now: str) -> TaskDoc:
    """A failed attempt: back to todo, or to failed once max attempts is reached."""
    to = "failed" if exhausted(doc) else "todo"
    note = f"attempt {doc['attempts']} of {doc['max_attempts']} failed: {error}"
    return ended(doc, to, note, now=now, error=error)


def recovered(doc: TaskDoc, reason: str, *, now: str) -> TaskDoc:
    """A held task whose holder died or whose lease ran out: todo (attempt kept), or failed when exhausted."""
    gave_up = exhausted(doc)
    note = f"recovered: {reason}" + (f"; gave up after {doc['attempts']} attempts" if gave_up else "")
    return transition(doc, "failed" if gave_up else "todo", by="board", now=now, note=note, claim=None, error=note)


# -- changes by hand -----------------------------------------------------------------------------------


def check_move_target(to: str) -> None:
    """InvalidTransition unless a person may move a task to status `to`."""
    if to not in STATUSES:
        raise InvalidTransition(f"unknown status '{to}'; statuses are {', '.join(STATUSES)}")
    if to == "doing":
        raise InvalidTransition("a task enters doing/ only when an agent claims it")


def by_hand(doc: TaskDoc, to: str) -> dict[str, Any]:
    """What a person's move of a task to `to` changes, whichever way they made it (`task move`, or
    its file moved between folders): any claim revoked, but for a file put into doing/ (the folder
    is the intent there, and only a claim enters doing otherwise); an open question dropped (moved
    on without an answer, it waits on it no more, and `answer` would be refused); its attempts given
    again when it goes back to todo."""
    changes: dict[str, Any] = {} if to == "doing" else {"claim": None}
    if doc.get("question"):
        changes["question"] = None
    if to == "todo":
        changes["attempts"] = 0
    return changes


def moved(doc: TaskDoc, to: str, *, by: str, now: str, note: str = "") -> TaskDoc:
    """A task moved to `to` by a person (`by_hand`). InvalidTransition for an unknown status, doing,
    or its own status."""
    check_move_target(to)
    if doc["status"] == to:
        raise InvalidTransition(f"task {doc['id']} is already {to}")
    changes = by_hand(doc, to)
    if doc.get("claim"):
        note = f"{note}; " if note else ""
        note += f"claim of {doc['claim'].get('agent')} revoked"
    return transition(doc, to, by=by, now=now, note=note or f"moved to {to}", **changes)


def check_cancel(doc: Mapping[str, Any]) -> None:
    if doc["status"] in FINAL:
        raise InvalidTransition(f"task {doc['id']} is already {doc['status']}")


def check_retry(doc: Mapping[str, Any]) -> None:
    if doc["status"] not in RETRYABLE:
        raise InvalidTransition(f"task {doc['id']} is {doc['status']}; retry takes a blocked, failed or "
                                "cancelled task")


def answered(doc: TaskDoc, text: str, *, by: str, now: str) -> TaskDoc:
    """A blocked task's question answered: to todo with the answer among its comments.
    InvalidTransition if it waits on no question."""
    question = doc.get("question")
    if doc["status"] != "blocked" or not question:
        # Point only at commands that exist: a blocked task without a question goes back by retry.
        hint = f"; `hermes-sup task retry {doc['id']}` puts it back in todo" if doc["status"] == "blocked" else ""
        raise InvalidTransition(f"task {doc['id']} is {doc['status']} and waits on no question{hint}")
    entry = {"at": now, "by": by, "text": text, "answers": question}
    return transition(doc, "todo", by=by, now=now, note=f"answered by {by}", question=None, error=None,
                      comments=[*(doc.get("comments") or []), entry])


def adopted(doc: TaskDoc, folder: str, *, now: str) -> TaskDoc:
    """A document a person moved into `folder` by hand: the folder is their intent, the document
    follows, changed as `task move` changes it (`by_hand`)."""
    return transition(doc, folder, by="board", now=now, note=f"moved into {folder}/ by hand",
                      **by_hand(doc, folder))
