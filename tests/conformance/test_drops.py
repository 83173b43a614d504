"""Who takes the drops: a claimer that ingests while it waits, or an ingester (the supervisor) it leaves them to."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from hermes_sup.kanban.watch import BURST_RESCAN_DELAY

from ..conftest import wait_until


def drop(inbox: Path, task_id: str) -> None:
    """A drop as a tool makes one: written beside inbox/ under a skipped name, renamed in whole."""
    part = inbox / f".{task_id}.json.part"
    part.write_text(json.dumps({"id": task_id, "title": f"dropped {task_id}"}))
    os.rename(part, inbox / f"{task_id}.json")


def waiting_for_drops(store, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=store.wait_for_drops, args=(seconds,), daemon=True)
    thread.start()
    return thread


def test_a_claimer_that_leaves_the_drops_to_an_ingester_never_takes_one(backend, store):
    inbox = backend.inbox(store)
    drop(inbox, "first")
    assert store.wait_for_work("w", timeout=0.3, ingest=False) is None
    assert (inbox / "first.json").exists(), "a claimer told to leave the drops ingested one"
    assert store.ingest().ingested == ["first"]  # the ingester's pass
    claimed = store.wait_for_work("w", timeout=10, ingest=False)
    assert claimed is not None and claimed["id"] == "first"


def test_an_ingester_sleeps_until_a_drop_arrives_or_it_is_woken(backend, store):
    inbox = backend.inbox(store)
    first = waiting_for_drops(store, 60)
    first.join(10)
    assert not first.is_alive(), "the first wait did not return at once (drops made before it would wait)"
    second = waiting_for_drops(store, 60)
    second.join(0.3)
    assert second.is_alive(), "the ingester woke with no drop"
    drop(inbox, "arrived")
    second.join(10)
    assert not second.is_alive(), "a drop arriving did not wake the ingester"
    assert store.ingest().ingested == ["arrived"]
    # A burst of events is followed by one more wake-up shortly after (kanban/watch.py): let it pass.
    while store.signal.wait(store.signal.generation, 2 * BURST_RESCAN_DELAY):
        pass
    store.wait_for_drops(0)
    stop_following = store.watch_events()  # as the supervisor's ingest warnings follow the log
    try:
        third = waiting_for_drops(store, 60)
        other = store.add({"title": "added, not dropped"})  # the board changes, no drop arrives
        claimed = store.claim("w")
        store.complete(claimed["id"], claimed["claim"]["token"], "ok")
        assert claimed["id"] in (other["id"], "arrived")
        third.join(0.5)
        assert third.is_alive(), "the ingester woke for a change that was not a drop"
    finally:
        if stop_following is not None:
            stop_following()
    store.wake()  # how a stopping supervisor ends the wait
    wait_until(lambda: not third.is_alive(), timeout=10)


def test_an_ingested_tasks_event_carries_what_the_supervisor_judges_it_by(backend, store):
    # The supervisor's warnings judge a task claimable as ingested from its event alone
    # (supervisor/ingestwarn.py to_judge): the event as events_since hands it out carries it.
    from hermes_sup.kanban.why import Member, Team
    from hermes_sup.supervisor.ingestwarn import to_judge

    inbox = backend.inbox(store)
    start = store.events_end()
    drop(inbox, "plain")
    (inbox / "coded.json").write_text(json.dumps({"id": "coded", "title": "coded", "role": "code"}))
    assert sorted(store.ingest().ingested) == ["coded", "plain"]
    events = [event for _cursor, event in store.events_since(start).events]
    assert {event["task"]: event["index"]["role"] for event in events} == {"plain": None, "coded": "code"}
    team = Team(members=(Member(name="writer", roles=("docs",), tier=None),))
    assert to_judge(events, team) == ["coded"], "read back: only the task no agent of the team could claim"
