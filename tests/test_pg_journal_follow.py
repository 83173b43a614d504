"""An open drawer follows a task's journal in the PostgreSQL board by its marks: a quiet journal
costs no row, new rows are read alone, and what it shows is what reading the whole journal again at
every poll shows, through transcripts set aside under other names and a row committed late."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from hermes_sup.kanban.pg.store import PgStore
from hermes_sup.supervisor.views import taskrecords, timeline

from .pgserver import PgServer
from .test_pg_journal import Factory, make_store  # noqa: F401 (make_store: a fixture)


class Counted:
    """The store's journal_rows, counting the rows it hands out."""

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.rows = 0

    def __call__(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        found = self.store.journal_rows(*args, **kwargs)
        self.rows += len(found)
        return found


def test_a_followed_journal_reads_only_new_rows_and_shows_what_a_whole_read_shows(
        make_store: Factory, pg_server: PgServer, tmp_path: Path) -> None:  # noqa: F811
    store = make_store()
    store.add({"id": "t-1", "title": "t"})
    token = store.claim("w1")["claim"]["token"]
    journal = store.task_journal("t-1", token, "w1", tmp_path / "w1-work")  # not under runs/: the database only
    runs = tmp_path / "runs"
    runs.mkdir()
    counted = Counted(store)
    followed = taskrecords.Gatherer(runs, "t-1", counted, store.journal_marks)
    whole = taskrecords.Gatherer(runs, "t-1", store.journal_rows)  # reads everything at every poll

    def poll() -> int:
        """Both polled; what they show is the same. The rows the followed one read."""
        before = counted.rows
        assert followed.poll() == whole.poll()
        assert followed.rewritten == whole.rewritten
        followed.rewritten.clear()
        whole.rewritten.clear()
        assert timeline.merge_keyed(followed.all()) == timeline.merge_keyed(whole.all())
        return counted.rows - before

    def message(text: str) -> None:
        journal.append_message({"role": "user", "content": text})

    def tool(call: str) -> None:
        journal.append_tool_call({"task": "t-1", "turn": "a", "call_id": call, "tool": "read_file",
                                  "status": "started", "args": {}, "at": f"2026-01-01T00:00:0{len(call)}Z"})

    assert poll() == 0
    for number in range(3):
        message(f"m{number}")
    tool("c")
    tool("cc")
    journal.append_llm_call({"task": "t-1", "call": "x", "at": "2026-01-01T00:00:05Z", "outcome": "ok",
                             "provider": "p", "model": "m", "tokens_in": 1, "tokens_out": 1, "cost_usd": 0.5})
    assert poll() == 6
    assert sum(poll() for _ in range(20)) == 0, "a quiet journal is not read again"
    message("m3")
    assert poll() == 1

    # Set aside under another name (compressed: a new transcript in the same transaction; a new
    # attempt: renamed alone): the marks say so, the whole journal is read again.
    journal.replace_transcript([{"role": "user", "content": "summary"}])
    assert poll() == 1 + 8  # the new row, then all 8 (4 messages set aside, the summary, 2 tools, 1 llm)
    journal.set_aside_attempt(1)
    assert poll() == 0 + 8
    message("after")
    assert poll() == 1
    assert [e.get("content") for e in timeline.merge(followed.all()) if e["kind"] == "message"] == \
        ["summary", "after"]

    # A row whose seq was taken before another's, committed after it: not missed.
    with psycopg.connect(pg_server.dsn) as late:
        late.execute(f'SET search_path TO "{store.schema}"')
        late.execute("INSERT INTO journal (task_id, fence, kind, agent, name, entry) VALUES "
                     "('t-1', %s, 'tool', 'w1', '', %s::jsonb)",
                     (token, json.dumps({"task": "t-1", "turn": "a", "call_id": "late", "tool": "read_file",
                                         "status": "started", "args": {}, "at": "2026-01-01T00:00:07Z"})))
        tool("ccc")
        assert poll() == 1
        late.commit()
    poll()
    shown = [e["call_id"] for e in timeline.merge(followed.all()) if e["kind"] == "tool"]
    assert sorted(shown) == ["c", "cc", "ccc", "late"]
    assert sum(poll() for _ in range(5)) == 0
