"""Waiters' turns (kanban/watchslots.py) on each backend: a waiter without a watch slot naps, and
the bell rung by a waiter that found work, or a stop, ends its nap at once."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.kanban import watchslots

from ..conftest import wait_until
from ..test_watch_slots import napping


@pytest.fixture
def one_slot(monkeypatch: pytest.MonkeyPatch) -> None:  # before the store is built: it reads SLOTS then
    monkeypatch.setattr(watchslots, "SLOTS", 1)
    monkeypatch.setattr(watchslots, "PASSIVE_NAP", 60.0)  # whatever moves a napper here is the bell or a wake


def waiting(store: Any, name: str, got: dict[str, Any], stop: threading.Event) -> threading.Thread:
    def wait() -> None:
        got[name] = store.wait_for_work(name, timeout=60, stop=stop)
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def watcher_and_napper(backend: Any, store: Any, tmp_path: Path) -> Iterator[tuple[Any, list, threading.Event, dict]]:
    """A waiter of `store` holding the one slot and one of another client (yielded) napping; both
    stopped after."""
    other = backend.build(tmp_path)
    stop = threading.Event()
    got: dict[str, Any] = {}
    threads = []
    try:
        threads.append(waiting(store, "w", got, stop))
        wait_until(lambda: store.slots.held is not None, timeout=10)
        threads.append(waiting(other, "p", got, stop))
        wait_until(lambda: napping(threads[1]), timeout=10)
        yield other, threads, stop, got
    finally:
        stop.set()
        store.wake()
        other.wake()
        for thread in threads:
            thread.join(10)
        other.close()


def test_a_backlog_reaches_the_waiter_without_a_slot_at_once(one_slot, backend, store, tmp_path):
    with watcher_and_napper(backend, store, tmp_path) as (_other, threads, _stop, got):
        store.add({"title": "one"})
        store.add({"title": "two"})
        for thread in threads:
            thread.join(10)
        assert sorted(doc["title"] for doc in got.values() if doc) == ["one", "two"], \
            "the napper did not take the second task before its 60 s nap ended"


def test_a_stop_ends_a_nap_at_once(one_slot, backend, store, tmp_path):
    with watcher_and_napper(backend, store, tmp_path) as (other, threads, stop, got):
        stop.set()
        other.wake()
        threads[1].join(10)
        assert not threads[1].is_alive(), "a stop and wake() left a napper asleep"
        assert got["p"] is None


def test_a_claimer_working_through_a_backlog_looks_before_it_watches(backend, store, monkeypatch):
    """Resuming the watch (the file board's inotify masks, PostgreSQL's LISTEN) and pausing it
    again for each task of a backlog: six inotify_add_watch calls a task, and the claim's own
    files woke the watcher's thread three times. While the turns find work, a look comes first;
    once the backlog is gone, the claimer watches again."""
    for n in range(3):
        store.add({"title": f"t{n}"})
    watched: list[int] = []
    real = watchslots._turn

    def counting(slots, watching, *rest):  # type: ignore[no-untyped-def]
        return real(slots, lambda left: watched.append(1) or watching(left), *rest)

    monkeypatch.setattr(watchslots, "_turn", counting)
    got = [store.wait_for_work("w", timeout=10) for _ in range(3)]
    assert sorted(doc["title"] for doc in got if doc) == ["t0", "t1", "t2"]
    assert len(watched) == 1, "after the first turn found work, the next ones watched before they looked"
    assert store.wait_for_work("w", timeout=0.2) is None
    assert len(watched) == 2, "with no work left the claimer did not watch"
