"""What a task shows: `task show` (models, files written, cost, the open question, --transcript) and
`task log [-f]`, with a real team served by the scripted LLM server, and the gathering and merging of
the agents' records as pure functions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path

from hermes_sup.kanban import Board
from hermes_sup.supervisor.views import render, taskrecords, timeline
from hermes_sup.supervisor.views.taskrecords import Raw, Source

from .conftest import CLI, init_workspace, wait_until
from .test_supervisor import ROOT, hermes, llm_workspace


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}.000000Z"


def raw(agent: str, kind: str, records: list[dict]) -> Raw:
    name = {"model": "llm_calls.jsonl", "tool": "tool_calls.jsonl", "message": "transcripts/t.jsonl"}[kind]
    return Raw(Source(agent, kind, Path("/runs") / agent / name), records)


def model(second: int, outcome: str = "ok", cost: float | None = 0.001, **more) -> dict:
    return {"at": at(second), "task": "t", "provider": "p", "model": "m", "outcome": outcome, "latency_s": 0.5,
            "tokens_in": 10, "tokens_out": 5, "tokens_cached": 0, "cost_usd": cost, **more}


def started(second: int, call: str, tool: str = "write_file", args: dict | None = None) -> dict:
    return {"at": at(second), "task": "t", "turn": "1", "call_id": call, "tool": tool,
            "args": args or {"path": "a.txt", "content": "x"}, "status": "started"}


def done(second: int, call: str, tool: str = "write_file", outcome: str = "ok") -> dict:
    return {"at": at(second), "task": "t", "turn": "1", "call_id": call, "tool": tool, "status": "done",
            "outcome": outcome, "result": "wrote 1 characters", "is_error": outcome != "ok", "duration_s": 0.01}


SYSTEM = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Task t: write"}
ASKS = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "write_file", "arguments": '{"path": "a.txt", "content": "x"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "wrote 1 characters"}
ANSWER = {"role": "assistant", "content": "Written."}


def describe(entry: dict) -> tuple:
    if entry["kind"] == "message":
        return (entry["agent"], entry["role"])
    if entry["kind"] == "tool":
        return (entry["agent"], "tool", entry["status"])
    return (entry["agent"], "model", entry["at"][17:19])


def test_a_reclaimed_task_is_merged_in_time_order_each_record_once_under_the_agent_that_wrote_it():
    # Agent a asked for a write and it ran; a died; b took the task over, copying a's transcript and
    # tool records (as agents/loop.py's take_over does), then answered.
    a_tools = [started(2, "c1"), done(3, "c1")]
    raws = [
        raw("b", "message", [SYSTEM, USER, ASKS, RESULT, ANSWER]),
        raw("b", "tool", a_tools),
        raw("b", "model", [model(8)]),
        raw("a", "model", [model(1), model(4, outcome="timeout", cost=0.0)]),
        raw("a", "tool", a_tools),
        raw("a", "message", [SYSTEM, USER, ASKS, RESULT]),
    ]
    entries = timeline.merge(raws)
    assert [describe(e) for e in entries] == [
        ("a", "system"), ("a", "user"), ("a", "model", "01"), ("a", "assistant"),
        ("a", "tool", "started"), ("a", "tool", "done"), ("a", "tool"), ("a", "model", "04"),
        ("b", "model", "08"), ("b", "assistant")]
    assert entries[3]["tool_calls"] == [{"id": "c1", "name": "write_file",
                                         "arguments": '{"path": "a.txt", "content": "x"}'}]
    assert entries[-1]["content"] == "Written." and entries[-1]["at"] == at(8)


def test_an_assistant_message_follows_the_model_call_that_answered_it_not_a_later_one():
    raws = [raw("a", "model", [model(1), model(5)]),
            raw("a", "tool", [started(2, "c1"), done(3, "c1")]),
            raw("a", "message", [SYSTEM, USER, ASKS, RESULT, ANSWER])]
    kinds = [describe(e) for e in timeline.merge(raws)]
    assert kinds.index(("a", "assistant")) == kinds.index(("a", "model", "01")) + 1
    assert kinds[-2:] == [("a", "model", "05"), ("a", "assistant")]


def test_the_overview_names_models_files_and_cost_with_unpriced_calls_apart():
    raws = [raw("a", "model", [model(1, cost=0.25), model(2, cost=None, provider="q"),
                               model(3, outcome="timeout", cost=0.0)]),
            raw("a", "tool", [started(4, "c1", args={"path": "out/report.md", "content": "x"}), done(5, "c1"),
                              started(6, "c2", tool="patch", args={"path": "bad.txt"}),
                              done(7, "c2", tool="patch", outcome="error"),
                              started(8, "c3", tool="read_file", args={"path": "in.txt"}), done(9, "c3", "read_file")])]
    found = timeline.overview(timeline.merge(raws))
    assert found["models"] == [{"provider": "p", "model": "m", "calls": 1}, {"provider": "q", "model": "m", "calls": 1}]
    assert found["files"] == [{"agent": "a", "path": "out/report.md", "tool": "write_file"}]
    assert found["cost"]["cost_usd"] == 0.25 and found["cost"]["unpriced_calls"] == 1
    assert found["cost"]["calls"] == 3 and found["cost"]["failed_calls"] == 1
    lines = dict(render.activity_fields(found))
    assert lines["cost"] == "$0.2500 over 3 model call(s) (1 unpriced, not counted; 1 failed)"
    assert lines["files written"] == "out/report.md (a)"


def test_log_lines_print_model_and_tool_text_literally():
    entry = {"kind": "message", "agent": "a", "at": at(1), "role": "assistant",
             "content": "line one\x1b[31m\nline two [bold]x[/bold]",
             "tool_calls": [{"id": "c", "name": "write_file", "arguments": '{"path": "\\u001b"}\x07'}]}
    lines = render.log_lines(entry)
    assert lines == ["00:00:01 a  assistant: line one\\x1b[31m", "    line two [bold]x[/bold]",
                     '    calls write_file {"path": "\\u001b"}\\x07']
    long = render.log_lines({"kind": "tool", "agent": "a", "at": at(2), "tool": "read_file", "status": "done",
                             "outcome": "ok", "duration_s": 0.5, "result": "y" * 5000})
    assert len(long) == 1 and long[0].endswith("(4,700 more characters)")


def test_reading_takes_complete_lines_skips_damage_and_never_opens_a_fifo(tmp_path):
    runs = tmp_path / "runs"
    folder = runs / "a" / "children" / "a.sub-1"
    folder.mkdir(parents=True)
    log = folder / "llm_calls.jsonl"
    log.write_text(json.dumps(model(1)) + "\nnot json\n" + json.dumps(model(2, task="other")) + "\n"
                   + json.dumps(model(3))[:20])
    os.mkfifo(runs / "a" / "tool_calls.jsonl")  # a writer never comes: opening it to read must not block
    gatherer = taskrecords.Gatherer(runs, "t")
    notes = gatherer.poll()
    assert [r["at"] for raw_ in gatherer.all() for r in raw_.records] == [at(1)]
    assert gatherer.all()[0].source.agent == "a.sub-1"
    assert any("not JSON" in note for note in notes) and any("not a regular file" in note for note in notes)
    with open(log, "a") as handle:
        handle.write(json.dumps(model(3))[20:] + "\n")  # the torn line, finished
    gatherer.poll()
    assert [r["at"] for raw_ in gatherer.all() for r in raw_.records] == [at(1), at(3)]


def test_a_read_of_a_large_journal_is_bounded_to_its_end(tmp_path):
    path = tmp_path / "llm_calls.jsonl"
    path.write_text("".join(json.dumps(model(n % 60)) + "\n" for n in range(1000)))
    found = taskrecords.read_lines(path, 0, limit=4096)
    assert 0 < len(found.lines) < 40 and found.offset == path.stat().st_size
    assert all(json.loads(line)["task"] == "t" for line in found.lines)  # none cut at its start
    assert "bytes skipped" in found.notes[0]


# -- with a real team --------------------------------------------------------------------------------

def run_team_task(tmp_path, up, llm, title: str) -> tuple[Path, dict]:
    from .llm_server import openai_reply

    ws = llm_workspace(tmp_path, llm)
    llm.script("openai",
               openai_reply(tool_calls=[("write_file", {"path": "notes/draft.txt", "content": "first draft"})]),
               openai_reply("The draft is \x1b[2J\u202ewritten."))
    board = Board(ws / "kanban")
    task = board.add({"title": title})
    return ws, task


def test_task_show_and_task_log_of_a_task_that_called_a_tool_then_answered(tmp_path, up):
    from .llm_server import ScriptedLLM

    with ScriptedLLM() as llm:
        ws, task = run_team_task(tmp_path, up, llm, "write a draft")
        up(ws)
        board = Board(ws / "kanban")
        wait_until(lambda: board.get(task["id"])["status"] == "done", timeout=60)
        shown = hermes(ws, "task", "show", task["id"], "--json")
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["models"] == [{"provider": "scripted", "model": "scripted-gpt", "calls": 2}]
        assert doc["files"] == [{"agent": "thinker", "path": "notes/draft.txt", "tool": "write_file"}]
        assert doc["cost"]["calls"] == 2 and doc["cost"]["unpriced_calls"] == 2  # no price table: never free
        text = hermes(ws, "task", "show", task["id"])
        assert "notes/draft.txt (thinker)" in text.stdout and "scripted (scripted-gpt) x2" in text.stdout
        assert "2 unpriced" in text.stdout

        logged = hermes(ws, "task", "log", task["id"], "--json")
        assert logged.returncode == 0, logged.stderr
        entries = [json.loads(line) for line in logged.stdout.splitlines()]
        assert [(e["kind"], e.get("role") or e.get("status") or e.get("outcome")) for e in entries] == [
            ("message", "system"), ("message", "user"), ("model", "ok"), ("message", "assistant"),
            ("tool", "started"), ("tool", "done"), ("message", "tool"), ("model", "ok"), ("message", "assistant")]
        assert entries[4]["args"] == {"path": "notes/draft.txt", "content": "first draft"}
        assert entries[5]["outcome"] == "ok" and isinstance(entries[5]["duration_s"], float)
        assert entries[7]["provider"] == "scripted" and entries[7]["tokens_in"] > 0
        assert entries[-1]["content"] == "The draft is \x1b[2J\u202ewritten."  # JSON keeps it exact
        assert "\u202e" not in logged.stdout and "\\u202e" in logged.stdout  # escaped, never raw

        plain = hermes(ws, "task", "log", task["id"])
        assert "\x1b" not in plain.stdout and "The draft is \\x1b[2J\\u202ewritten." in plain.stdout
        assert "tool   write_file -> ok in" in plain.stdout and "calls write_file" in plain.stdout
        together = hermes(ws, "task", "show", task["id"], "--transcript")
        answer = together.stdout.index("assistant: The draft is \\x1b[2J\\u202ewritten.")
        assert together.stdout.index("history") < answer


def test_task_log_follow_prints_records_as_they_are_appended_and_ends_cleanly_on_sigterm(tmp_path, up):
    from .llm_server import ScriptedLLM

    with ScriptedLLM() as llm:
        ws, task = run_team_task(tmp_path, up, llm, "write a draft")
        follower = subprocess.Popen([*CLI, "-w", str(ws), "task", "log", task["id"], "-f", "--json"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(follower.stdout), daemon=True)
        reader.start()
        try:
            up(ws)  # started after the follower: everything it prints came live
            # All nine: the answer's model record may be appended a poll after the answer itself.
            wait_until(lambda: len(lines) >= 9, timeout=60)
        finally:
            follower.send_signal(signal.SIGTERM)
            code = follower.wait(timeout=30)
        reader.join(timeout=30)
        assert code == 0, follower.stderr.read()
        entries = [json.loads(line) for line in lines]  # every line whole
        kinds = [(e["kind"], e.get("role") or e.get("status")) for e in entries]
        assert Counter(kinds) == Counter([
            ("message", "system"), ("message", "user"), ("model", None), ("message", "assistant"), ("tool", "started"),
            ("tool", "done"), ("message", "tool"), ("model", None), ("message", "assistant")]), kinds
        assert entries[-1]["kind"] == "model" or entries[-1]["content"].startswith("The draft is"), entries[-1]


def test_a_steps_task_shows_its_files_and_its_open_question(tmp_path, up):
    from .llm_server import ScriptedLLM

    with ScriptedLLM() as llm:
        ws = llm_workspace(tmp_path, llm)
        board = Board(ws / "kanban")
        task = board.add({"title": "write then ask", "steps": [
            {"tool": "write_file", "args": {"path": "plan.md", "content": "# plan"}},
            {"tool": "ask_human", "args": {"question": "Ship it\x1b[5m?"}}]})
        up(ws)
        wait_until(lambda: board.get(task["id"])["status"] == "blocked", timeout=60)
        text = hermes(ws, "task", "show", task["id"])
        assert "question: Ship it\\x1b[5m?" in text.stdout and "plan.md (thinker)" in text.stdout
        doc = json.loads(hermes(ws, "task", "show", task["id"], "--json", "--transcript").stdout)
        assert doc["files"] == [{"agent": "thinker", "path": "plan.md", "tool": "write_file"}]
        assert doc["models"] == [] and doc["cost"]["calls"] == 0
        steps = [(e["tool"], e["status"]) for e in doc["transcript"]]
        assert steps == [("write_file", "started"), ("write_file", "done"), ("ask_human", "started")]
        assert not llm.requests


def test_a_transcript_replaced_whole_is_read_again_from_its_start(tmp_path):
    transcripts = tmp_path / "runs" / "a" / "transcripts"
    transcripts.mkdir(parents=True)
    path = transcripts / "t.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in (SYSTEM, USER)))
    gatherer = taskrecords.Gatherer(tmp_path / "runs", "t")
    gatherer.poll()
    # A take-over or a compression writes a new file and renames it over the old one (longer here).
    replaced = transcripts / "t.jsonl.new"
    replaced.write_text("".join(json.dumps(m) + "\n" for m in (SYSTEM, USER, ASKS, RESULT, ANSWER)))
    os.replace(replaced, path)
    assert gatherer.poll() == []
    [raw_] = gatherer.all()
    assert raw_.records == [SYSTEM, USER, ASKS, RESULT, ANSWER] and raw_.source in gatherer.rewritten


def test_task_log_of_a_task_nobody_worked_on_says_so(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    task = Board(ws / "kanban").add({"title": "idle"})
    shown = hermes(ws, "task", "log", task["id"][:6])  # a unique prefix is enough
    assert shown.returncode == 0 and shown.stdout == ""
    assert f"no records of {task['id']} yet" in shown.stderr
    assert hermes(ws, "task", "log", task["id"], "--json").stdout == ""


def test_a_task_reclaimed_by_another_agent_shows_both_agents_records_once_in_order(tmp_path, up):
    from .llm_server import ScriptedLLM, openai_reply

    with ScriptedLLM() as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
            "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
            "agents:\n  - name: ann\n  - name: bob\n")
        llm.script("openai",
                   openai_reply(tool_calls=[("write_file", {"path": "draft.txt", "content": "first draft"})]),
                   {"delay": 60, **openai_reply("never delivered")},  # its agent is stopped while waiting
                   openai_reply("Finished the draft."))
        board = Board(ws / "kanban")
        task = board.add({"title": "write a draft"})
        up(ws)
        wait_until(lambda: len(llm.requests) >= 2, timeout=60)
        first = board.get(task["id"])["claim"]["agent"]
        other = "bob" if first == "ann" else "ann"
        assert hermes(ws, "stop", first).returncode == 0
        done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=60)
        assert done["result"] == {"answer": "Finished the draft."}
        entries = [json.loads(line) for line in hermes(ws, "task", "log", task["id"], "--json").stdout.splitlines()]
        seen = [(e["agent"], e["kind"], e.get("role") or e.get("status") or e.get("outcome")) for e in entries]
        assert seen == [
            (first, "message", "system"), (first, "message", "user"), (first, "model", "ok"),
            (first, "message", "assistant"), (first, "tool", "started"), (first, "tool", "done"),
            (first, "message", "tool"), (first, "model", "interrupted"),
            (other, "model", "ok"), (other, "message", "assistant")], seen
        doc = json.loads(hermes(ws, "task", "show", task["id"], "--json").stdout)
        assert doc["files"] == [{"agent": first, "path": "draft.txt", "tool": "write_file"}]
        assert doc["cost"]["calls"] == 3 and doc["cost"]["failed_calls"] == 1


def test_a_tool_record_copied_to_the_next_holder_is_shown_under_the_holder_that_ran_it():
    # The copy sits in both logs; "ann" (who took over) sorts before "zed" (who ran the call).
    tools = [started(2, "c1"), done(3, "c1")]
    raws = [raw("ann", "tool", tools), raw("zed", "tool", tools), raw("zed", "model", [model(1)]),
            raw("ann", "model", [model(8)])]
    doc = {"history": [{"at": at(0), "by": "cli", "to": "todo"}, {"at": at(0), "by": "zed", "to": "doing"},
                       {"at": at(5), "by": "zed", "to": "todo"}, {"at": at(6), "by": "ann", "to": "doing"}]}
    entries = timeline.merge(raws, timeline.claims(doc))
    assert [(e["agent"], e["kind"]) for e in entries] == [("zed", "model"), ("zed", "tool"), ("zed", "tool"),
                                                          ("ann", "model")]
    assert timeline.overview(entries)["files"] == [{"agent": "zed", "path": "a.txt", "tool": "write_file"}]


def test_a_call_that_never_ended_is_shown_interrupted_but_not_while_following_its_agents_last_record():
    start = {"at": "2026-01-01T00:00:00Z", "task": "t", "call": "c1", "outcome": "started", "provider": "p",
             "model": "m", "prompt_estimate": 42}
    raws = [raw("a", "model", [start])]
    [entry] = timeline.merge(raws)
    assert (entry["outcome"], entry["tokens_in"], entry["estimated"]) == ("interrupted", 42, True)
    assert timeline.merge_keyed(raws, open_calls=False) == []  # maybe still under way
    later = {**start, "call": "c2", "outcome": "ok", "at": "2026-01-01T00:01:00Z", "tokens_in": 5}
    following = timeline.merge_keyed([raw("a", "model", [start, later])], open_calls=False)
    assert [e["outcome"] for _, e in following] == ["interrupted", "ok"]  # its agent went on: it never ended
    ended = {**start, "outcome": "ok", "tokens_in": 5}
    assert [e["outcome"] for e in timeline.merge([raw("a", "model", [start, ended])])] == ["ok"]
