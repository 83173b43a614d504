"""A new attempt after a failed one starts a new conversation (with a note of how the last one
ended); one after its holder died or gave the task back resumes the conversation."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.conversation import NOTE_CHARS, fresh_start
from hermes_sup.agents.loop import TaskLoop
from hermes_sup.agents.memory import MemoryFile
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.tools import Toolbox, ToolContext
from hermes_sup.kanban import Board, rules
from hermes_sup.kanban.task import normalize

from .conftest import gone, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .loops import task_loop
from .test_work_faults import hermes, make_ws, supervisor

NOW = "2026-01-01T00:00:00Z"


def claim(doc: dict, agent: str) -> dict:
    return rules.claimed(doc, {"agent": agent, "pid": 4242, "lease_until_ts": 1e12}, now=NOW)


def fresh_doc() -> dict:
    return normalize({"title": "Count and report", "body": "Use the tools.", "max_attempts": 3},
                     default_id="t-1", now=NOW, by="cli", note="added")


def test_a_failed_attempt_or_a_retry_starts_afresh_a_dead_or_released_holder_resumes():
    first = claim(fresh_doc(), "alice")
    assert fresh_start(first) is None, "a first attempt has nothing to set aside"
    failed = claim(rules.failed_attempt(first, "no final answer after 60 model turns", now=NOW), "alice")
    assert fresh_start(failed) == "attempt 1 of 3 failed: no final answer after 60 model turns"
    died = claim(rules.recovered(first, "holder pid 4242 is gone", now=NOW), "bob")
    assert fresh_start(died) is None, "a holder's death resumes the conversation"
    released = claim(rules.ended(first, "todo", "released: alice is stopping", now=NOW, give_back_attempt=True),
                     "alice")
    assert fresh_start(released) is None
    # Given up for good (a recovery that used up the attempts), then retried by a person: afresh.
    gave_up = rules.recovered({**first, "attempts": 3}, "lease expired", now=NOW)
    retried = claim(rules.moved(gave_up, "todo", by="cli", now=NOW, note="retry (attempts reset)"), "alice")
    assert fresh_start(retried).startswith("a person (cli) retried it after: recovered: lease expired")
    # A question answered is no retry: the conversation goes on with the answer.
    blocked = rules.ended(first, "blocked", "asked", now=NOW, question="Which file?")
    assert fresh_start(claim(rules.answered(blocked, "notes.txt", by="cli", now=NOW), "alice")) is None
    # Only the attempt just before counts: a failure long ago does not set aside a resumed conversation.
    assert fresh_start(claim(rules.recovered(failed, "holder pid 4242 is gone", now=NOW), "alice")) is None
    long = claim(rules.failed_attempt(first, "x" * 5000, now=NOW), "alice")
    assert len(fresh_start(long)) == NOTE_CHARS + 1


@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


def make_loop(llm, tmp_path, task: dict, name: str = "alice", **kwargs) -> TaskLoop:
    scratch = tmp_path / name / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=MemoryFile(tmp_path / name / "MEMORY.md"))
    provider = OpenAIProvider(ProviderConfig(name="scripted", kind="openai", model="m", base_url=f"{llm.url}/v1"))
    return task_loop(task=task, chain=[provider], workdir=tmp_path / name, ctx=ctx,
                     toolbox=Toolbox(grants=("fs.read", "fs.write", "memory", "kanban")), agent=name, **kwargs)


def test_the_attempt_after_one_that_ran_out_of_turns_starts_a_new_conversation_with_a_note(llm, tmp_path):
    first = claim(fresh_doc(), "alice")
    llm.script("openai", *[openai_reply(tool_calls=[("wait", {"seconds": i / 1000})]) for i in range(2)])
    outcome = make_loop(llm, tmp_path, first, max_iterations=2).run()
    assert outcome.kind == "failed"
    second = claim(rules.failed_attempt(first, outcome.text, now=NOW), "alice")
    llm.script("openai", openai_reply("done at last"))
    loop = make_loop(llm, tmp_path, second)
    assert loop.run().text == "done at last"
    sent = llm.requests[2]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user"], "no message of attempt 1 is sent again"
    assert "attempt 1 of 3 failed: no final answer after 2 model turns" in sent[1]["content"]
    kept = [json.loads(line) for line in (tmp_path / "alice/transcripts/t-1.attempt-1.jsonl").read_text().splitlines()]
    assert [m["role"] for m in kept] == ["system", "user", "assistant", "tool", "assistant"], \
        "attempt 1's conversation is kept beside the new one"
    assert any("kept as" in note for note in loop.notes)


def test_the_attempt_after_a_holder_died_resumes_its_conversation_even_on_another_agent(llm, tmp_path):
    first = claim(fresh_doc(), "alice")
    llm.script("openai", openai_reply(tool_calls=[("wait", {"seconds": 0.001})]))
    make_loop(llm, tmp_path, first, max_iterations=1).run()  # alice is killed after one turn
    taken = claim(rules.recovered(first, "holder pid 4242 is gone", now=NOW), "bob")
    llm.script("openai", openai_reply("done by bob"))
    assert make_loop(llm, tmp_path, taken, name="bob").run().text == "done by bob"
    sent = llm.requests[1]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"], "bob continued alice's turns"
    assert "did not succeed" not in sent[1]["content"]


def test_a_person_retrying_a_failed_task_gets_a_new_conversation_and_the_log_keeps_the_old(tmp_path, up):
    with ScriptedLLM() as llm:
        ws = make_ws(tmp_path, f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                               "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
                               "agents:\n  - name: doer\n    max_iterations: 1\n")
        llm.script("openai", openai_reply(tool_calls=[("wait", {"seconds": 0.001})]))
        board = Board(ws / "kanban")
        task = board.add({"title": "count the files", "max_attempts": 1})
        up(ws)
        failed = wait_until(lambda: (d := board.get(task["id"]))["status"] == "failed" and d, timeout=60)
        assert "no final answer after 1 model turns" in failed["error"]
        llm.script("openai", openai_reply("three files"))
        assert hermes(ws, "task", "retry", task["id"]).returncode == 0
        done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=60)
        assert done["result"] == {"answer": "three files"}
        sent = llm.requests[-1]["body"]["messages"]
        assert [m["role"] for m in sent] == ["system", "user"], "the retry did not replay attempt 1"
        assert "no final answer after 1 model turns" in sent[1]["content"]
        log = hermes(ws, "task", "log", task["id"])
        assert log.returncode == 0, log.stderr
        out = log.stdout
        assert "calls wait" in out, "attempt 1's conversation is still in the log"
        assert out.index("calls wait") < out.index("did not succeed") < out.index("three files"), out


def test_prune_removes_the_conversations_of_a_finished_tasks_earlier_attempts(tmp_path):
    from hermes_sup.supervisor.upkeep.prune import task_paths

    folder = tmp_path / "runs" / "doer" / "transcripts"
    folder.mkdir(parents=True)
    names = ["t-1.jsonl", "t-1.attempt-1.jsonl", "t-1.attempt-12.jsonl", "t-1.attempt-x.jsonl", "t-10.attempt-1.jsonl",
             "t-1.attempt-1.jsonl.bak"]
    for name in names:
        (folder / name).write_text("{}\n")
    assert [path.name for path in task_paths(tmp_path / "runs", "t-1")] == [
        "t-1.attempt-1.jsonl", "t-1.attempt-12.jsonl", "t-1.jsonl"]


def test_an_agent_killed_mid_conversation_resumes_it_after_its_restart(tmp_path, up):
    with ScriptedLLM() as llm:
        ws = make_ws(tmp_path, f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                               "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
                               "agents:\n  - name: doer\n")
        # Turn 2 is answered late: the agent is killed while it waits for it.
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "a.txt", "content": "1"})]),
                   {**openai_reply("too late"), "delay": 5}, openai_reply("done after the kill"))
        board = Board(ws / "kanban")
        task = board.add({"title": "write the file", "max_attempts": 3})
        up(ws)
        assert wait_until(lambda: len(llm.requests) >= 2, timeout=60)
        pid = supervisor(ws)["agents"]["doer"]["pid"]
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: gone(pid), timeout=30)
        done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=90)
        assert done["result"] == {"answer": "done after the kill"}
        sent = llm.requests[2]["body"]["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"], "the conversation resumed"
        assert "did not succeed" not in sent[1]["content"]
