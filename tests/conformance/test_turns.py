"""Waiters' turns (kanban/watchslots.py) on each backend: a claimer working through a backlog
looks before it watches."""

from __future__ import annotations

from hermes_sup.kanban import watchslots


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
