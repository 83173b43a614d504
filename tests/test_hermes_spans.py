"""A Hermes run's tool calls as spans (agents/hermestools.py): its session store's rows to tool calls and
the run's session among the store's, pure, over the shapes the real CLI writes (tests/test_runtime_hermes.py
runs it) and hostile ones; then the store read at the edge from SQLite files that are no store of this run."""

from __future__ import annotations

import json
import sqlite3
import time

from hermes_sup.agents import hermestools
from hermes_sup.agents.hermestools import match_session, outcome_of, read, reported_session, tool_calls

T0 = 1_800_000_000.0
RUN = (T0, T0 + 60)


def asked(at: float, *calls: tuple[str, str, dict]) -> tuple:
    """An assistant row as Hermes 0.19 writes it (run_agent.py _flush_messages_to_session_db)."""
    listed = [{"id": cid, "call_id": cid, "type": "function",
               "function": {"name": name, "arguments": json.dumps(args)}} for cid, name, args in calls]
    return ("assistant", "", None, json.dumps(listed), None, at)


def answered(at: float, cid: str, name: str, result: str) -> tuple:
    return ("tool", result, cid, None, name, at)


REAL = [("user", "please", None, None, None, T0 + 1),
        asked(T0 + 2, ("call_0", "read_file", {"path": "/nowhere"}),
              ("call_1", "write_file", {"path": "o", "content": "hi"})),
        answered(T0 + 3, "call_0", "read_file", '{"content": "", "error": "File not found: /nowhere"}'),
        answered(T0 + 3.1, "call_1", "write_file", '{"bytes_written": 2, "lint": {"status": "skipped"}}'),
        asked(T0 + 4, ("call_0", "terminal", {"command": "exit 3"})),
        answered(T0 + 5, "call_0", "terminal", '{"output": "", "exit_code": 3, "error": null}'),
        asked(T0 + 6, ("call_0", "terminal", {"command": "true"})),
        answered(T0 + 7, "call_0", "terminal", '{"output": "x", "exit_code": 0, "error": null}\n\n[Tool loop warning]'),
        ("assistant", "done", None, None, None, T0 + 8)]


def test_a_runs_rows_give_a_call_each_named_timed_and_judged_as_hermes_records_them():
    calls, left_out = tool_calls(REAL, *RUN)
    assert left_out == 0
    assert [(c.name, c.call_id, c.outcome) for c in calls] == [
        ("read_file", "call_0", "error"), ("write_file", "call_1", "ok"), ("terminal", "call_0", "error"),
        ("terminal", "call_0", "ok")], "call ids repeat from turn to turn: each answer is its own turn's"
    assert [(c.start, c.end) for c in calls] == [(T0 + 2, T0 + 3), (T0 + 2, T0 + 3.1), (T0 + 4, T0 + 5),
                                                (T0 + 6, T0 + 7)]
    assert {c.timing for c in calls} == {"store"}
    assert all(c.args is None and c.result is None for c in calls), "content only when asked for"
    with_content, _ = tool_calls(REAL, *RUN, content=True)
    assert json.loads(with_content[1].args) == {"path": "o", "content": "hi"}
    assert with_content[2].result.startswith('{"output": ""')


def test_the_flat_form_unanswered_calls_and_answers_to_nothing_are_still_calls():
    flat = ("assistant", None, None, json.dumps([{"name": "memory", "arguments": {"op": "add"}}]), None, T0 + 1)
    calls, _ = tool_calls([flat, answered(T0 + 2, "stray", "web_search", "Error: offline"),
                           asked(T0 + 3, ("c9", "terminal", {"command": "sleep 100"})),
                           asked(T0 + 4, ("c9", "read_file", {"path": "a"})),
                           answered(T0 + 5, "c9", "read_file", '{"content": "a"}')], *RUN, content=True)
    memory, stray, cut_off, again = calls
    assert (memory.name, memory.outcome, memory.timing, memory.args) == ("memory", "unknown", "run", '{"op": "add"}')
    assert (stray.name, stray.outcome, stray.timing) == ("web_search", "error", "run")
    assert (cut_off.name, cut_off.outcome, (cut_off.start, cut_off.end)) == ("terminal", "unknown", RUN)
    assert (again.name, again.outcome, again.start, again.end) == ("read_file", "ok", T0 + 4, T0 + 5), \
        "an answer is the latest call's of its id, not an older one left unanswered"


def test_hostile_rows_give_bounded_calls_or_none_and_never_raise():
    huge = "x" * 10_000_000
    rows = [(), ("assistant",), (None,) * 6, (1, 2, 3, 4, 5, 6),
            ("assistant", None, None, "not json", None, T0), ("assistant", None, None, '{"a": 1}', None, T0),
            ("assistant", None, None, "[1, null, \"s\", []]", None, T0),
            ("assistant", None, None, "[" * 100_000, None, T0),
            ("assistant", None, None, json.dumps([{"id": 5, "function": "nope"}]), None, "yesterday"),
            ("assistant", None, None, json.dumps([{"id": "big", "function": {"name": huge, "arguments": huge}}]), None,
             T0),  # a list longer than MAX_CALLS_JSON: no list
            ("assistant", None, None, json.dumps([{"id": "h", "function": {"name": "x" * 400_000,
                                                                            "arguments": "y" * 400_000}}]), None,
             float("nan")),
            ("tool", huge, "h", None, 7, float("inf")),
            ("tool", b"bytes", ["id"], None, None, True),
            asked(1e300, ("z", "terminal", {})),
            answered(-1e300, "z", "terminal", '{"exit_code": 99999999999999999999}'),
            asked(T0 - 1000, ("old", "terminal", {})), answered(T0 - 999, "old", "terminal", '{"exit_code": 0}')]
    calls, left_out = tool_calls(rows, *RUN, content=True)
    assert left_out == 0
    assert [c.name for c in calls] == [hermestools.UNKNOWN, "x" * hermestools.MAX_ID, "unknown", "terminal",
                                       "terminal"]
    assert all(c.timing == "run" and (c.start, c.end) == RUN for c in calls), "no time outside the run is taken"
    assert len(calls[1].args) == hermestools.MAX_ARGS and len(calls[1].result) == hermestools.MAX_RESULT
    assert calls[1].outcome == "ok" and calls[2].outcome == "unknown"
    assert calls[3].outcome == "error", "a huge exit code is still not 0"
    assert calls[4].outcome == "ok"


def test_a_hundred_thousand_rows_give_at_most_max_spans_quickly():
    rows = []
    for i in range(50_000):
        rows += [("assistant", "", None, f'[{{"id": "c{i}", "function": {{"name": "terminal"}}}}]', None, T0 + 1),
                 answered(T0 + 2, f"c{i}", "terminal", '{"exit_code": 0}')]
    began = time.monotonic()
    calls, left_out = tool_calls(rows, *RUN)
    assert time.monotonic() - began < 3
    assert len(calls) == hermestools.MAX_SPANS and left_out == 50_000 - hermestools.MAX_SPANS
    assert all(c.outcome == "ok" for c in calls)


def test_outcomes_are_hermes_own_structured_judgement():
    assert [outcome_of(tool, result) for tool, result in [
        ("terminal", '{"exit_code": 0, "error": "warned"}'), ("terminal", '{"exit_code": 2}'),
        ("terminal", "no json"), ("terminal", None), ("write_file", '{"bytes_written": 3}'),
        ("patch", '{"success": false}'), ("read_file", '{"error": null}'), ("read_file", '{"error": "gone"}'),
        ("x", "Error: boom"), ("x", "fine"), ("x", '{"error": "cut sh'), ("x", '{"error": null, "out": "cut')]] == [
        "ok", "error", "ok", "unknown", "ok", "error", "ok", "error", "error", "ok", "error", "ok"]


def test_the_runs_session_is_the_one_hermes_reported_else_the_only_one_begun_while_it_ran():
    mine, other = ("20261127_221922_e2d97b", "cli", None, T0 + 1), ("s-2", "cli", None, T0 + 2)
    assert match_session(mine[0], [other, mine], *RUN) == mine[0]
    assert match_session("s-9", [mine], *RUN) is None, "a reported id the store lacks: no guess, even of the one"
    assert match_session(None, [mine], *RUN) == mine[0]
    assert match_session(None, [mine, other], *RUN) is None, "two begun while it ran: never a guess"
    assert match_session(None, [mine, ("s-3", "telegram", None, T0), ("s-4", "cli", mine[0], T0),
                                ("s-5", "cli", None, T0 - 10), ("s-6", "cli", None, "now"), (None, "cli", None, T0),
                                ()], *RUN) == mine[0]
    assert [reported_session(v) for v in ("s-1", "", "a\n", "x" * 201, 5, None, ["s"])] == ["s-1"] + [None] * 6


# -- the edge: SQLite files ------------------------------------------------------------------------

def store(path, sessions, messages, *, extra: str = "") -> None:
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, parent_session_id TEXT,"
                       " started_at REAL NOT NULL);"
                       "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT,"
                       " content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL);" + extra)
    conn.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?)", sessions)
    if messages:
        conn.executemany("INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name,"
                         " timestamp) VALUES (?, ?, ?, ?, ?, ?, ?)", messages)
    conn.commit()
    conn.close()


def test_the_store_is_read_for_the_reported_session_only(tmp_path):
    store(tmp_path / "state.db", [("mine", "cli", None, T0 + 1), ("other", "cli", None, T0 + 1)],
          [("mine", *row) for row in REAL] + [("other", *asked(T0 + 2, ("c", "terminal", {})))])
    calls, problem = read(tmp_path, "mine", *RUN)
    assert problem is None and [c.name for c in calls] == ["read_file", "write_file", "terminal", "terminal"]
    assert [c.name for c in read(tmp_path, "other", *RUN)[0]] == ["terminal"]
    calls, problem = read(tmp_path, None, *RUN)
    assert calls == [] and "holds no session of this run" in problem, "two sessions began: neither is taken"


def test_a_store_missing_corrupt_foreign_or_hostile_gives_no_spans_and_a_sentence(tmp_path):
    assert read(tmp_path, "s", *RUN)[1].endswith("is larger than 512 MB")  # none there
    (tmp_path / "state.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    calls, problem = read(tmp_path, "s", *RUN)
    assert calls == [] and "state.db could not be" in problem
    (tmp_path / "state.db").unlink()
    conn = sqlite3.connect(tmp_path / "state.db")
    conn.execute("CREATE TABLE sessions (name TEXT)")
    conn.close()
    calls, problem = read(tmp_path, "s", *RUN)
    assert calls == [] and "could not be read as Hermes' session store" in problem
    (tmp_path / "state.db").unlink()
    store(tmp_path / "state.db", [("s", "cli", None, T0)], [],
          extra="CREATE VIEW v AS SELECT 1; DROP TABLE messages; CREATE VIEW messages AS SELECT * FROM v;")
    calls, problem = read(tmp_path, "s", *RUN)
    assert calls == [] and "messages is a view" in problem
    (tmp_path / "state.db").unlink()
    store(tmp_path / "state.db", [("s", "cli", None, T0)], [("s", *REAL[1])])
    locker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        calls, problem = read(tmp_path, "s", *RUN)  # a copy is read: a writer's lock holds nothing up
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert problem is None and [c.outcome for c in calls] == ["unknown", "unknown"]
