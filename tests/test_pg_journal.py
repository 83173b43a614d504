"""A task's journal in the PostgreSQL board (kanban/pg/journal.py), against the suite's real server:
the TaskJournal protocol over the journal table, every write fenced by the claim's token and
scrubbed of keys, and an agent on another host resuming a conversation without running a completed
tool call again."""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.loop import TaskLoop
from hermes_sup.agents.memory import MemoryFile
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.tools import Toolbox, ToolContext
from hermes_sup.kanban import Board
from hermes_sup.kanban.errors import ClaimLost
from hermes_sup.kanban.journal import FileTaskJournal
from hermes_sup.kanban.pg.journal import PgTaskJournal, attempt_name, next_free
from hermes_sup.kanban.pg.store import PgStore
from hermes_sup.kanban.redact import remember
from hermes_sup.supervisor.views import taskrecords, timeline

from . import pgserver
from .llm_server import ScriptedLLM, error_reply, openai_reply
from .loops import task_loop
from .pgserver import PgServer

Factory = Callable[..., PgStore]
KEY = "sk-journal-" + uuid.uuid4().hex


@pytest.fixture
def make_store(pg_server: PgServer) -> Iterator[Factory]:
    """Stores on one fresh schema, each as if on a host of its own."""
    with pgserver.stores_on_one_schema(pg_server, f"j_{uuid.uuid4().hex[:12]}") as make:
        yield make


def rows(store: PgStore, task_id: str) -> list[dict[str, Any]]:
    with store._locked() as conn:  # the table as it is, not as the journal reads it
        return [dict(r) for r in conn.execute("SELECT kind, agent, name, entry FROM journal WHERE task_id = %s "
                                              "ORDER BY seq", (task_id,)).fetchall()]


def test_names_for_set_aside_transcripts_are_never_reused():
    assert next_free("t.jsonl", set()) == "t.jsonl.1"
    assert next_free("t.jsonl", {"t.jsonl", "t.jsonl.1"}) == "t.jsonl.2"
    assert attempt_name("t", 2, {"t.jsonl"}) == "t.attempt-2.jsonl"
    assert attempt_name("t", 2, {"t.attempt-2.jsonl"}) == "t.attempt-2.jsonl.1"


def test_the_database_journal_reads_as_the_journal_files_would_for_task_log():
    rows = {
        "message": [{"seq": 1, "agent": "w1", "name": "t-1.jsonl", "entry": {"role": "user", "content": "now"}},
                    {"seq": 2, "agent": "w1", "name": "t-1.jsonl.1", "entry": {"role": "user", "content": "copy"}},
                    {"seq": 3, "agent": "w1", "name": "t-1.attempt-1.jsonl", "entry": {"role": "user", "content": "1"}},
                    {"seq": 4, "agent": "w2", "name": "t-1.jsonl", "entry": ["not", "a", "record"]}],
        "tool": [{"seq": 5, "agent": "w2", "name": "", "entry": {"task": "t-1", "call_id": "c1", "status": "done"}},
                 {"seq": 6, "agent": "w2", "name": "", "entry": {"task": "t-2", "call_id": "c9", "status": "done"}}],
        "llm": [{"seq": 7, "agent": "w1", "name": "", "entry": {"task": "t-1", "outcome": "ok"}}]}
    raws, notes = taskrecords.db_raws(rows, "t-1")
    found = {(r.source.agent, r.source.kind, r.source.path.name): r.records for r in raws}
    assert found == {("w1", "message", "t-1.jsonl"): [{"role": "user", "content": "now"}],
                     ("w1", "message", "t-1.attempt-1.jsonl"): [{"role": "user", "content": "1"}],
                     ("w2", "tool", "tool_calls.jsonl"): [{"task": "t-1", "call_id": "c1", "status": "done"}],
                     ("w1", "model", "llm_calls.jsonl"): [{"task": "t-1", "outcome": "ok"}]}
    assert notes == ["journal row 4 in the board database is not a record and is skipped"]


def test_task_log_on_the_file_board_reads_the_agents_files_alone(tmp_path: Path) -> None:
    (tmp_path / "runs" / "w1").mkdir(parents=True)
    record = {"task": "t-1", "at": "2026-01-01T00:00:00Z", "call": "c", "outcome": "ok", "provider": "p"}
    (tmp_path / "runs" / "w1" / "llm_calls.jsonl").write_text(json.dumps(record) + "\n")
    with Board(tmp_path / "kanban") as board:
        raws, notes = taskrecords.gather(tmp_path / "runs", "t-1", taskrecords.board_rows(board))
    assert notes == []
    assert [(raw.source.agent, raw.source.kind, raw.records) for raw in raws] == [("w1", "model", [record])]


def test_a_model_call_logged_in_the_agents_file_and_in_the_database_is_shown_once(tmp_path: Path) -> None:
    record = {"task": "t-1", "at": "2026-01-01T00:00:00Z", "call": "c", "outcome": "ok", "provider": "p"}
    (tmp_path / "w1").mkdir()
    (tmp_path / "w1" / "llm_calls.jsonl").write_text(json.dumps(record) + "\n")
    in_db: list[dict[str, Any]] = []

    def rows(task_id: str, kind: str) -> list[dict[str, Any]]:  # the database's rows, as journal_rows gives them
        return [row for row in in_db if row["kind"] == kind]

    gatherer = taskrecords.Gatherer(tmp_path, "t-1", rows)
    gatherer.poll()  # the agent's file has it, the database not yet
    in_db.append({"seq": 1, "kind": "llm", "agent": "w1", "name": "", "entry": record})
    gatherer.poll()
    models = [e for e in timeline.merge(gatherer.all()) if e["kind"] == "model"]
    assert [(e["agent"], e["provider"]) for e in models] == [("w1", "p")]
    assert len([e for e in timeline.merge(taskrecords.gather(tmp_path, "t-1", rows)[0])
                if e["kind"] == "model"]) == 1


def test_the_board_gives_each_backend_its_journal(make_store: Factory, tmp_path: Path) -> None:
    with Board(tmp_path / "kanban") as board:
        assert isinstance(board.task_journal("t-1", 1, "w1", tmp_path / "w1"), FileTaskJournal)
    assert isinstance(make_store().task_journal("t-1", 1, "w1", tmp_path / "w1"), PgTaskJournal)


def test_the_whole_protocol_over_the_journal_table(make_store: Factory, tmp_path: Path) -> None:
    store = make_store()
    task = store.add({"id": "t-1", "title": "t"})
    token = store.claim("w1")["claim"]["token"]
    journal = store.task_journal(task["id"], token, "w1", tmp_path / "w1")
    journal.append_message({"role": "user", "content": "hi"})
    journal.append_tool_call({"task": "t-1", "turn": "a", "call_id": "c1", "status": "done", "result": "r"})
    journal.append_llm_call({"task": "t-1", "tokens_in": 7, "tokens_out": 1})
    assert journal.transcript().records == [{"role": "user", "content": "hi"}]
    assert journal.replace_transcript([{"role": "user", "content": "summary"}]) == "t-1.jsonl.1"
    assert journal.replace_transcript([{"role": "user", "content": "again"}]) == "t-1.jsonl.2"
    assert journal.transcript().records == [{"role": "user", "content": "again"}]
    assert journal.set_aside_attempt(1) == "t-1.attempt-1.jsonl"
    assert journal.set_aside_attempt(1) is None, "nothing left to set aside"
    assert journal.transcript().records == []
    kept = {(r["name"], r["entry"]["content"]) for r in rows(store, "t-1") if r["kind"] == "message"}
    assert kept == {("t-1.jsonl.1", "hi"), ("t-1.jsonl.2", "summary"), ("t-1.attempt-1.jsonl", "again")}
    # The model call is in the agent's own log (usage reads it) and in the database (any host's ceilings).
    local = [json.loads(line) for line in (tmp_path / "w1" / "llm_calls.jsonl").read_text().splitlines()]
    assert local == [{"task": "t-1", "tokens_in": 7, "tokens_out": 1}]
    assert journal.llm_calls() == local
    journal.close()


def test_another_host_reads_the_holders_journal_and_takes_its_tool_calls(make_store: Factory,
                                                                         tmp_path: Path) -> None:
    host_a, host_b = make_store("host-a"), make_store("host-b")
    host_a.add({"id": "t-1", "title": "t"})
    first = host_a.claim("w1")["claim"]["token"]
    a = host_a.task_journal("t-1", first, "w1", tmp_path / "a" / "w1")
    a.append_message({"role": "user", "content": "from a"})
    a.append_tool_call({"task": "t-1", "turn": "x", "call_id": "c1", "status": "started"})
    a.append_tool_call({"task": "t-1", "turn": "x", "call_id": "c1", "status": "done", "result": "ran on a"})
    a.append_llm_call({"task": "t-1", "tokens_in": 3})
    host_a.release("t-1", first)
    second = host_b.claim("w2")["claim"]["token"]
    b = host_b.task_journal("t-1", second, "w2", tmp_path / "b" / "w2")
    assert b.holder_transcript("w1").records == [{"role": "user", "content": "from a"}]
    assert b.transcript().records == [] and b.tool_calls() == []
    taken = b.take_tool_calls("w1", ("turn", "call_id", "status"))
    assert [r["status"] for r in taken] == ["started", "done"]
    assert b.take_tool_calls("w1", ("turn", "call_id", "status")) == taken, "taken once, not twice"
    assert [r["result"] for r in b.tool_calls() if r["status"] == "done"] == ["ran on a"]
    assert b.llm_calls(["w1"]) == [{"task": "t-1", "tokens_in": 3}], "host a's spending counts on host b"
    assert not (tmp_path / "b" / "w2" / "llm_calls.jsonl").exists()


def test_a_write_after_the_claim_moved_on_raises_claim_lost_and_stores_nothing(make_store: Factory,
                                                                              tmp_path: Path) -> None:
    host_a, host_b = make_store("host-a"), make_store("host-b")
    host_a.add({"id": "t-1", "title": "t"})
    stale = host_a.claim("w1")["claim"]["token"]
    zombie = host_a.task_journal("t-1", stale, "w1", tmp_path / "w1")
    zombie.append_message({"role": "user", "content": "before"})
    host_b.move("t-1", "todo", note="taken back")
    host_b.claim("w2")
    for write in (lambda: zombie.append_message({"role": "assistant", "content": "late"}),
                  lambda: zombie.append_tool_call({"task": "t-1", "call_id": "c9", "status": "started"}),
                  lambda: zombie.replace_transcript([{"role": "user", "content": "late"}]),
                  lambda: zombie.set_aside_attempt(1)):
        with pytest.raises(ClaimLost):
            write()
    zombie.append_llm_call({"task": "t-1", "tokens_in": 5})  # spending is kept here, never refused
    assert [(r["kind"], r["name"], r["entry"]) for r in rows(host_b, "t-1")] == [
        ("message", "t-1.jsonl", {"role": "user", "content": "before"})]
    assert (tmp_path / "w1" / "llm_calls.jsonl").read_text().count('"tokens_in":5') == 1


def test_a_first_claims_journal_reads_nothing_back_until_it_writes_and_a_later_claim_reads_it(
        make_store: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The claim says whether the task has journal rows: none, and only this claim's token can write
    # one, so the task's first reads (a statement each, every task) are answered without one.
    store = make_store()
    store.add({"id": "t-1", "title": "t"})
    token = store.claim("w1")["claim"]["token"]
    reads: list[Any] = []
    real = store.journal_rows
    monkeypatch.setattr(store, "journal_rows", lambda *a, **k: reads.append(a) or real(*a, **k))
    journal = store.task_journal("t-1", token, "w1", tmp_path / "w1")
    assert (journal.tool_calls(), journal.transcript().records, journal.llm_calls(), reads) == ([], [], [], [])
    record = {"task": "t-1", "call_id": "c1", "status": "started", "turn": 0, "at": 1.0}
    journal.append_tool_call(record)
    assert [r["call_id"] for r in journal.tool_calls()] == ["c1"] and reads, "read back once it wrote"
    second = store.task_journal("t-1", token, "w1", tmp_path / "w1")  # only the first starts empty
    assert [r["call_id"] for r in second.tool_calls()] == ["c1"]
    store.release("t-1", token)
    token = store.claim("w1")["claim"]["token"]
    third = store.task_journal("t-1", token, "w1", tmp_path / "w1")
    assert [r["call_id"] for r in third.tool_calls()] == ["c1"], "a claim of a task with rows reads them"


def test_a_tasks_second_claim_reads_its_journal_back_even_where_the_claim_saw_no_row(
        make_store: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another agent's claim, rows and release can all fall within one claim statement, whose EXISTS
    # reads the statement's start: only a first claim is known to have no row.
    store = make_store()
    store.add({"id": "t-1", "title": "t"})
    store.release("t-1", store.claim("w1")["claim"]["token"])
    token = store.claim("w1")["claim"]["token"]
    reads: list[Any] = []
    real = store.journal_rows
    monkeypatch.setattr(store, "journal_rows", lambda *a, **k: reads.append(a) or real(*a, **k))
    assert store.task_journal("t-1", token, "w1", tmp_path / "w1").tool_calls() == [] and reads


def test_keys_never_reach_the_database(make_store: Factory, tmp_path: Path) -> None:
    store = make_store()
    store.add({"id": "t-1", "title": "t"})
    token = store.claim("w1")["claim"]["token"]
    journal = store.task_journal("t-1", token, "w1", tmp_path / "w1")
    remember([KEY])
    journal.append_message({"role": "tool", "content": f"the server said: bad key {KEY}"})
    journal.append_tool_call({"task": "t-1", "call_id": "c1", "status": "done", "result": KEY})
    journal.append_llm_call({"task": "t-1", "error": f"401 {KEY}"})
    journal.replace_transcript([{"role": "user", "content": f"summary {KEY}"}])
    stored = json.dumps(rows(store, "t-1"))
    assert KEY not in stored and stored.count("[redacted]") == 4
    assert KEY not in (tmp_path / "w1" / "llm_calls.jsonl").read_text()


def test_what_jsonb_refuses_in_a_record_is_replaced_never_refused(make_store: Factory, tmp_path: Path) -> None:
    # A tool's result may hold a NUL or a lone surrogate (a binary file read, a broken encoder):
    # jsonb takes neither, and a refused record would end the task.
    store = make_store()
    store.add({"id": "t-1", "title": "t"})
    token = store.claim("w1")["claim"]["token"]
    journal = store.task_journal("t-1", token, "w1", tmp_path / "w1")
    journal.append_tool_call({"task": "t-1", "call_id": "c1", "status": "done", "result": "a\x00b \ud800 c",
                              "turn": 0, "at": 1.0})
    assert [r["result"] for r in journal.tool_calls()] == ["a\ufffdb \ufffd c"]


def make_loop(llm: ScriptedLLM, store: PgStore, task: dict[str, Any], agent: str, workdir: Path,
              **kwargs: Any) -> TaskLoop:
    scratch = workdir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=MemoryFile(workdir / "MEMORY.md"))
    provider = OpenAIProvider(ProviderConfig(name="scripted", kind="openai", model="m", base_url=f"{llm.url}/v1"))
    return task_loop(task=task, chain=[provider], workdir=workdir, ctx=ctx, agent=agent,
                     toolbox=Toolbox(grants=("fs.read", "fs.write", "memory", "kanban")),
                     journal=store.task_journal(task["id"], task["claim"]["token"], agent, workdir), **kwargs)


def test_a_conversation_resumes_on_another_host_without_running_its_tool_call_again(
        make_store: Factory, tmp_path: Path) -> None:
    host_a, host_b = make_store("host-a"), make_store("host-b")
    host_a.add({"id": "t-1", "title": "append a line", "max_attempts": 3})
    with ScriptedLLM() as llm:
        # Host a's model asks for the call, the call runs, and the next model call fails: the end of host a.
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "mark.txt", "content": "once"})]),
                   error_reply(400, "host a is going away"))
        first = host_a.claim("w1")
        make_loop(llm, host_a, first, "w1", tmp_path / "a" / "w1").run()
        assert (tmp_path / "a" / "w1" / "scratch" / "mark.txt").read_text() == "once"
        host_a.release("t-1", first["claim"]["token"], "released: host a went away")
        second = host_b.claim("w2")
        llm.script("openai", openai_reply("done on host b"))
        loop = make_loop(llm, host_b, second, "w2", tmp_path / "b" / "w2")
        assert loop.run().text == "done on host b"
    sent = llm.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"], "host b continued host a's turns"
    assert sent[-1]["content"].startswith("wrote"), sent[-1]
    assert not (tmp_path / "b" / "w2" / "scratch" / "mark.txt").exists(), "the completed call ran again"
    assert not (tmp_path / "b" / "w2" / "transcripts").exists(), "host b kept no transcript file"


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    with pgserver.fresh_database(pg_server, "journal") as dsn:
        yield dsn


def test_an_agent_whose_journal_write_finds_the_claim_gone_stops_the_task_and_runs_nothing(
        database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_sup.agents import worker
    from hermes_sup.agents.worker import Agent

    # The claim watcher (which also stops the task, by looking at the board) looks only after the
    # test: what finds the claim gone here is the fenced journal write itself.
    monkeypatch.setattr(worker, "CLAIM_CHECK", 3600.0)
    monkeypatch.setenv("W14D_JOURNAL_DSN", database)
    agent = Agent({"name": "a", "host": "box-a", "board": {"backend": "postgres", "dsn_env": "W14D_JOURNAL_DSN"}},
                  tmp_path, tmp_path / "runs" / "a")
    try:
        with PgStore(database, host="box-b", boot_id="b") as other:
            task = other.add({"id": "t-1", "title": "write", "max_attempts": 3,
                              "steps": [{"tool": "write_file", "args": {"path": "late.txt", "content": "x"}}]})
            stale = agent.board.claim("a")
            # box-a was judged dead meanwhile: its task went back and box-b's agent holds it now.
            other.move(task["id"], "todo", note="taken back")
            other.claim("b")
            agent.work(stale)
            held = other.get(task["id"])
    finally:
        agent.board.close()
    out = capsys.readouterr()
    assert "stopped work on t-1: it was claimed again by b" in out.out, out
    assert "Traceback" not in out.err, out.err
    assert held["status"] == "doing" and held["claim"]["agent"] == "b" and held["attempts"] == 1
    assert not list(tmp_path.rglob("late.txt")), "a stale holder ran a step"


def test_prune_removes_finished_tasks_journal_rows_but_their_model_calls(make_store: Factory, tmp_path: Path) -> None:
    """`prune` on PostgreSQL: a finished task's transcript and tool-call rows go (the database is where
    they take room), its model-call rows (what `usage` counts), its document and every other task's
    rows stay; a dry run removes nothing."""
    from hermes_sup.supervisor.upkeep.prune import prune

    store = make_store()
    ids = {status: store.add({"id": f"{status}-task", "title": status, "priority": 9 - n})["id"]
           for n, status in enumerate(("done", "doing"))}
    for status, task_id in ids.items():
        claimed = store.claim("w1")
        assert claimed is not None and claimed["id"] == task_id
        token = claimed["claim"]["token"]
        journal = store.task_journal(task_id, token, "w1", tmp_path / "runs" / "w1")
        journal.append_message({"role": "user", "content": "go"})
        journal.append_tool_call({"task": task_id, "call_id": "c1", "status": "done"})
        journal.append_llm_call({"task": task_id, "call": "m1", "outcome": "ok"})
        journal.close()
        if status == "done":
            store.complete(task_id, token, {"answer": "ok"})
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)

    dry = prune(tmp_path / "runs", store, 86400, dry_run=True, now=later)
    assert dry.database is not None and (dry.database["tasks"], dry.database["rows"]) == (1, 2)
    assert dry.database["bytes"] > 0 and len(rows(store, ids["done"])) == 3, "a dry run removes nothing"

    done = prune(tmp_path / "runs", store, 86400, now=later)
    assert done.database == dry.database and done.as_dict()["database"] == dry.database
    assert [r["kind"] for r in rows(store, ids["done"])] == ["llm"], "the model calls stay for usage"
    assert [r["kind"] for r in rows(store, ids["doing"])] == ["message", "tool", "llm"], "a held task is not touched"
    assert store.get(ids["done"])["status"] == "done"
    again = prune(tmp_path / "runs", store, 86400, now=later)
    assert again.database == {"tasks": 0, "rows": 0, "bytes": 0}


def test_a_task_retried_before_its_rows_go_keeps_them(make_store: Factory, tmp_path: Path) -> None:
    """The rows go only while the task is finished, checked in the deleting transaction: a `retry`
    between prune's listing and the deletion keeps the task's journal."""
    store = make_store()
    task_id = store.add({"title": "x", "max_attempts": 1})["id"]
    claimed = store.claim("w1")
    assert claimed is not None
    journal = store.task_journal(task_id, claimed["claim"]["token"], "w1", tmp_path / "w1")
    journal.append_message({"role": "user", "content": "go"})
    journal.close()
    store.fail(task_id, claimed["claim"]["token"], "no", permanent=True)
    store.retry(task_id)  # after a prune listed it as failed
    assert store.journal_prune([task_id]) == {"tasks": 0, "rows": 0, "bytes": 0}
    assert len(rows(store, task_id)) == 1
    store.cancel(task_id)
    assert store.journal_prune([task_id, "no-such-task"])["rows"] == 1
    assert rows(store, task_id) == []


def test_a_tool_call_row_of_odd_shape_is_left_out_not_fatal_to_the_take_over(make_store: Factory,
                                                                               tmp_path: Path) -> None:
    """Any host (anyone with the database) can write a task's tool rows: a call id or turn that is an
    object made the take-over's set of keys raise TypeError, a done record without a call id the
    loop's KeyError; every agent resuming the task crashed, attempt after attempt. Such a record is
    left out; the holder's others are taken as before."""
    store = make_store("box-a")
    store.add({"id": "t", "title": "t"}, by="cli")
    held = store.claim("w1")
    token = held["claim"]["token"]
    good = {"at": "2026-01-01T00:00:00Z", "task": "t", "turn": "1", "call_id": "c1", "tool": "wait", "status": "done",
            "outcome": "ok", "result": "fine"}
    store.journal_write("t", token, kind="tool", agent="w1", entries=[
        good, {**good, "call_id": {"x": 1}}, {**good, "turn": ["1"]},
        {k: v for k, v in good.items() if k != "call_id"}])
    mine = PgTaskJournal(store, "t", token, "w2", tmp_path)
    try:
        taken = mine.take_tool_calls("w1", ("turn", "call_id", "status"))
    finally:
        mine.close()
    assert taken == [good]


def test_a_message_row_of_odd_shape_is_left_out_not_fatal_to_the_take_over(make_store: Factory,
                                                                             tmp_path: Path) -> None:
    """A task's message rows are written by any host: an assistant message whose tool call has no id,
    or whose result names its call by an object, made the take-over's search for unanswered calls
    raise (KeyError, TypeError) in every agent resuming the task. Such a message is left out."""
    from hermes_sup.agents.conversation import unanswered

    store = make_store("box-a")
    store.add({"id": "t", "title": "t"}, by="cli")
    token = store.claim("w1")["claim"]["token"]
    call = {"id": "c1", "type": "function", "function": {"name": "wait", "arguments": "{}"}}
    good = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call], "turn": "1"}]
    odd = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "wait"}}]},
           {"role": "assistant", "tool_calls": [{**call, "function": "wait"}]},
           {"role": "assistant", "tool_calls": "all of them"},
           {"role": "tool", "tool_call_id": {"id": "c1"}, "content": "x"}, {"role": ["user"], "content": "x"}]
    store.journal_write("t", token, kind="message", agent="w1", name="t.jsonl", entries=[*good, *odd])
    mine = PgTaskJournal(store, "t", token, "w2", tmp_path)
    try:
        theirs = mine.holder_transcript("w1").records
    finally:
        mine.close()
    assert theirs == good
    assert unanswered(theirs) == ("1", [call])


@pytest.mark.parametrize("empty", [1, 2])
def test_a_conversation_resumes_past_holders_that_died_before_writing_a_row(
        make_store: Factory, tmp_path: Path, empty: int) -> None:
    host_a, host_b = make_store("host-a"), make_store("host-b")
    host_a.add({"id": "t-1", "title": "append a line", "max_attempts": 3})
    with ScriptedLLM() as llm:
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "mark.txt", "content": "once"})]),
                   error_reply(400, "host a is going away"))
        first = host_a.claim("w1")
        make_loop(llm, host_a, first, "w1", tmp_path / "a" / "w1").run()
        host_a.release("t-1", first["claim"]["token"], "released: host a went away")
        for index in range(empty):  # claimed on host b, judged gone before its first journal row
            gone = host_b.claim(f"gone-{index}")
            host_b.release("t-1", gone["claim"]["token"], "released: judged gone")
        last = host_b.claim("w3")
        llm.script("openai", openai_reply("done past the empty holders"))
        loop = make_loop(llm, host_b, last, "w3", tmp_path / "b" / "w3")
        assert loop.run().text == "done past the empty holders"
    sent = llm.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"], "w3 continued w1's turns"
    assert sent[-1]["content"].startswith("wrote"), sent[-1]
    assert "continued the conversation of w1 (4 messages)" in loop.notes
    assert not (tmp_path / "b" / "w3" / "scratch" / "mark.txt").exists(), "the completed call ran again"


@pytest.mark.parametrize("back", ["gone", "wrote"])
def test_the_conversation_written_last_in_the_database_is_continued(make_store: Factory, tmp_path: Path,
                                                                    back: str) -> None:
    # w1 writes one file and goes away; w2 continues, writes a second and goes away; w1 claims again
    # and is judged gone before writing a row ("gone": w2's conversation is the newest though w1
    # holds the later claim), or continues w2's and writes a third ("wrote": w1's is the newest,
    # though w1 also keeps its first transcript, set aside). w3 continues the newest, every file in it.
    host_a, host_b = make_store("host-a"), make_store("host-b")
    host_a.add({"id": "t-1", "title": "write the files", "max_attempts": 5})
    with ScriptedLLM() as llm:
        def hold(store: PgStore, agent: str, path: str | None) -> None:
            doc = store.claim(agent)
            if path is not None:
                llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": path, "content": "x"})]),
                           error_reply(400, "going away"))
                make_loop(llm, store, doc, agent, tmp_path / store.host / agent).run()
            store.release("t-1", doc["claim"]["token"], "released: went away")

        hold(host_a, "w1", "one.txt")
        hold(host_b, "w2", "two.txt")
        hold(host_a, "w1", "three.txt" if back == "wrote" else None)
        llm.script("openai", openai_reply("all written"))
        last = host_b.claim("w3")
        loop = make_loop(llm, host_b, last, "w3", tmp_path / "b" / "w3")
        assert loop.run().text == "all written"
    sent = llm.requests[-1]["body"]["messages"]
    written = [json.loads(call["function"]["arguments"])["path"] for m in sent for call in m.get("tool_calls") or []]
    assert written == ["one.txt", "two.txt", *(["three.txt"] if back == "wrote" else [])]
    assert f"continued the conversation of {'w1' if back == 'wrote' else 'w2'} ({len(sent)} messages)" in loop.notes
