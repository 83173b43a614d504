"""The board invariants of the contract's section 3 as one check over a store at rest."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hermes_sup.kanban.task import STATUSES

from .backends import Backend, Store, all_events, tasks


def check_invariants(backend: Backend, store: Store) -> dict[str, dict[str, Any]]:
    """Assert every invariant that holds of a board no process is changing; the documents by id.

    - each task is in exactly one place, and its status is the status of that place;
    - `list`, `get`, `counts` and `task_ids` agree with each other;
    - a task in doing holds one claim with a token, a task elsewhere holds none;
    - the event log accounts for every transition in each task's history, once and in order;
    - no task was completed twice; nothing half-done is left behind.
    """
    docs = tasks(store)
    ids = [doc["id"] for doc in docs]
    assert len(ids) == len(set(ids)), f"list() returns a task twice: {[i for i, n in Counter(ids).items() if n > 1]}"
    by_id = {doc["id"]: doc for doc in docs}
    for doc in docs:
        assert doc["status"] in STATUSES, f"{doc['id']} has status {doc['status']!r}"
        assert store.get(doc["id"])["status"] == doc["status"]
    places = backend.places(store)
    assert set(places) == set(by_id), f"stored {sorted(places)} but listed {sorted(by_id)}"
    assert store.task_ids() == sorted(places), "task_ids names every stored task once, sorted"
    for task_id, where in places.items():
        assert where == [by_id[task_id]["status"]], f"{task_id} is in {where}, its status is {by_id[task_id]['status']}"
    counts = store.counts()
    assert {s: counts.get(s, 0) for s in STATUSES} == {s: Counter(d["status"] for d in docs).get(s, 0)
                                                         for s in STATUSES}
    for doc in docs:
        claim = doc.get("claim")
        if doc["status"] == "doing":
            assert claim and isinstance(claim.get("token"), int) and claim.get("agent"), f"{doc['id']}: {claim}"
        else:
            assert not claim, f"{doc['id']} is {doc['status']} but still claimed: {claim}"
    moves: dict[str, list[str | None]] = {}
    for _cursor, event in all_events(backend, store):
        if event["task"] in by_id:
            moves.setdefault(event["task"], []).append(event["to"])
    for task_id, doc in by_id.items():
        history = [entry["to"] for entry in doc["history"]]
        assert moves.get(task_id, []) == history, f"{task_id}: events {moves.get(task_id)} but history {history}"
        completions = sum(1 for entry in doc["history"] if (entry["from"], entry["to"]) == ("doing", "done"))
        assert completions <= 1, f"{task_id} was completed {completions} times"
    assert backend.leftovers(store) == [], f"a transition left something half-done behind: {backend.leftovers(store)}"
    return by_id
