"""The event log read by cursor: readers that are killed and resume with their last cursor miss no
event and see none twice, in order; a line still being written is not an event until it is whole."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from ..conftest import wait_until
from .backends import EVENT_LOG_FILE, all_events

TRANSITIONS = 100
RACED_TASKS, RACERS = 200, 4


def written_down(out: Path) -> list[dict]:
    """The events a reader wrote down, its own torn last line left out."""
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines(keepends=True) if line.endswith("\n")]


def make_transitions(store, count: int, killed: threading.Event, resumed: threading.Event,
                     pause_at: int, resume_at: int, errors: list[BaseException]) -> None:
    """`count` transitions (add, claim, complete, ...), pausing at `pause_at` until a reader is
    killed and at `resume_at` until it runs again, so both happen while the board is changing."""
    try:
        made = 0
        while made < count:
            store.add({"title": f"t{made}"})
            made += 1
            for step in ("claim", "complete"):
                if made == pause_at:
                    assert killed.wait(60)
                if made == resume_at:
                    assert resumed.wait(60)
                if made >= count:
                    break
                if step == "claim":
                    held = store.claim("w")
                else:
                    store.complete(held["id"], held["claim"]["token"], "ok")
                made += 1
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


@pytest.mark.slow
def test_two_readers_one_killed_and_resumed_see_every_event_once_in_order(backend, store, tmp_path, workers):
    store.add({"title": "before the readers"})
    outs = [tmp_path / "steady.jsonl", tmp_path / "killed.jsonl"]
    steady, victim = (workers.start("reader", backend.kind, str(tmp_path), str(out), stdout=subprocess.PIPE)
                      for out in outs)
    for proc in (steady, victim):
        assert proc.stdout.readline() == b"reading\n"
    killed, resumed, errors = threading.Event(), threading.Event(), []
    maker = threading.Thread(target=make_transitions,
                             args=(store, TRANSITIONS, killed, resumed, 40, 70, errors))
    maker.start()
    try:
        wait_until(lambda: errors or len(written_down(outs[1])) >= 20, timeout=60)
        assert not errors, errors
        victim.kill()  # SIGKILL: whatever it was doing, mid-line included
        victim.wait(timeout=10)
        had = len(written_down(outs[1]))
        killed.set()
        wait_until(lambda: errors or len(all_events(backend, store)) >= 1 + 60, timeout=60)
        victim = workers.start("reader", backend.kind, str(tmp_path), str(outs[1]), stdout=subprocess.PIPE)
        assert victim.stdout.readline() == b"reading\n"
        resumed.set()
    finally:
        killed.set()
        resumed.set()
        maker.join(timeout=120)
    assert not errors, errors
    expected = [{"cursor": cursor, **event} for cursor, event in all_events(backend, store)]
    assert len(expected) == 1 + TRANSITIONS
    for out in outs:
        wait_until(lambda out=out: len(written_down(out)) >= len(expected), timeout=60)
    for proc in (steady, victim):
        proc.kill()
        proc.wait(timeout=10)
    assert 20 <= had < len(expected), "the reader was killed in the middle of the stream"
    for out in outs:
        seen = written_down(out)
        assert seen == expected, f"{out.name}: {len(seen)} events written down, {len(expected)} on the board"
    cursors = [entry["cursor"] for entry in expected]
    assert cursors == sorted(set(cursors)), "cursors grow with every event"


@pytest.mark.slow
def test_readers_miss_no_event_while_processes_race_to_commit(backend, store, tmp_path, workers):
    """Claimer processes write at once, so where a backend lets transactions overlap, a later cursor
    can commit before an earlier one: readers following by cursor meanwhile still get every event
    once, in order."""
    for n in range(RACED_TASKS):
        store.add({"title": f"raced {n}"})
    outs = [tmp_path / f"reader-{n}.jsonl" for n in range(2)]
    readers = [workers.start("reader", backend.kind, str(tmp_path), str(out), stdout=subprocess.PIPE) for out in outs]
    for proc in readers:
        assert proc.stdout.readline() == b"reading\n"
    go = tmp_path / "go"
    claimers = [workers.start("claimer", backend.kind, str(tmp_path), str(tmp_path / f"claims-{n}.jsonl"), f"c{n}",
                              str(go)) for n in range(RACERS)]
    go.touch()
    for proc in claimers:
        assert proc.wait(timeout=150) == 0
    expected = [{"cursor": cursor, **event} for cursor, event in all_events(backend, store)]
    assert len(expected) == 3 * RACED_TASKS
    last = expected[-1]["cursor"]
    for out in outs:
        wait_until(lambda out=out: (seen := written_down(out)) and seen[-1]["cursor"] >= last, timeout=60)
    for proc in readers:
        proc.kill()
        proc.wait(timeout=10)
    for out in outs:
        seen = written_down(out)
        missed = [entry["cursor"] for entry in expected if entry not in seen]
        assert missed == [], f"{out.name} missed {len(missed)} events, e.g. cursors {missed[:5]}"
        assert seen == expected


def test_reading_from_a_cursor_returns_exactly_the_later_events(backend, store):
    store.add({"title": "one"})
    store.add({"title": "two"})
    first = all_events(backend, store)
    middle = first[0][0]
    later, cursor = backend.read_events(store, middle)
    assert later == first[1:] and cursor == first[-1][0]
    assert backend.read_events(store, cursor) == ([], cursor), "nothing new: nothing returned, cursor kept"
    third = store.add({"title": "three"})
    newer, _cursor = backend.read_events(store, cursor)
    assert [event["task"] for _c, event in newer] == [third["id"]]


@pytest.mark.requires(EVENT_LOG_FILE)
def test_a_torn_last_line_is_not_returned_until_it_is_complete(backend, store):
    store.add({"title": "whole"})
    before, cursor = backend.read_events(store, 0)
    line = json.dumps({"at": "2026-01-01T00:00:00.000000Z", "task": "late", "from": "todo", "to": "doing",
                       "by": "w", "note": ""}) + "\n"
    half = len(line) // 2
    with open(store.events_path, "ab") as log:  # a writer part-way through its one write
        log.write(line[:half].encode())
    assert backend.read_events(store, cursor) == ([], cursor), "half a line is no event"
    with open(store.events_path, "ab") as log:
        log.write(line[half:].encode())
    events, after = backend.read_events(store, cursor)
    assert [event["task"] for _c, event in events] == ["late"] and after > cursor
    assert [event["task"] for _c, event in all_events(backend, store)] == [before[0][1]["task"], "late"]


@pytest.mark.requires(EVENT_LOG_FILE)
def test_a_line_torn_by_a_killed_writer_is_skipped_and_the_next_event_read_once(backend, store):
    store.add({"title": "before"})
    _events, cursor = backend.read_events(store, 0)
    with open(store.events_path, "ab") as log:  # its writer was killed here: the rest never comes
        log.write(b'{"at": "2026-01-01T00:00:00.000000Z", "task": "torn", "fr')
    assert backend.read_events(store, cursor) == ([], cursor)
    after = store.add({"title": "after"})
    events, _cursor = backend.read_events(store, cursor)
    assert [event["task"] for _c, event in events] == [after["id"]]
    assert [event["task"] for _c, event in all_events(backend, store)].count(after["id"]) == 1


def test_events_have_one_shape_on_every_backend(backend, store):
    # A script reading `events --json` (or the dashboard) is handed the same fields whatever the
    # board: a transition is kind "board" with its known fields (and, into todo, `index`: what the
    # claimers' indexes keep of the task); an appended record keeps only the fields of its kind, so
    # a hostile shape stored in it is no event.
    from hermes_sup.kanban.index import CARRIED

    task = store.add({"title": "one"})
    store.append_event({"at": "2026-01-01T00:00:00Z", "kind": "supervisor", "event": "started",
                        "agent": "a", "note": "n", "deep": {"x": [1, 2]}})
    store.append_event({"at": "2026-01-01T00:00:00Z", "kind": "supervisor", "event": {"not": "text"}})
    events = [event for _cursor, event in all_events(backend, store)]
    assert events[0]["kind"] == "board" and events[0]["task"] == task["id"] and events[0]["to"] == "todo"
    assert set(events[0]) == {"kind", "at", "task", "from", "to", "by", "note", "index"}
    assert set(events[0]["index"]) == set(CARRIED) and events[0]["index"]["role"] is None
    assert {k: v for k, v in events[1].items() if k != "at"} == {
        "kind": "supervisor", "event": "started", "agent": "a", "note": "n"}
    assert len(events) == 2, events
