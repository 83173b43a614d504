"""The task loop on real servers' quirks (the scripted server reproducing them, the real openai SDK):
a transcript holding an empty answer still runs, an error inside a stream fails the task with its
reason, a cut stream never completes a task, tools reach a server that needs tool_choice and one
that drops them is named, and every call is logged, with estimated tokens where the server sent none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.loop import TaskLoop
from hermes_sup.agents.memory import MemoryFile
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.tools import Toolbox, ToolContext
from hermes_sup.agents.tooluse import IGNORED_AFTER, ToolUse, ignores_tools
from hermes_sup.kanban.board import Board

from .conftest import CLI, gone, init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .loops import task_loop
from .test_supervisor import ROOT, agent

CAPS = ("fs.read", "fs.write", "memory", "kanban")
TASK = {"id": "t-1", "title": "Write n.txt", "body": "Put 7 into n.txt."}
CONTEXT_EXCEEDED = {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}


def make_loop(llm: ScriptedLLM, tmp_path, *, stream: bool = True, base: str = "/v1", **kwargs) -> TaskLoop:
    scratch = tmp_path / "agent" / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=MemoryFile(tmp_path / "agent" / "MEMORY.md"))
    chain = kwargs.pop("chain", None) or [OpenAIProvider(ProviderConfig(
        name="local", kind="openai", model="m", base_url=f"{llm.url}{base}", timeout=5, stream=stream))]
    return task_loop(task=TASK, chain=chain, workdir=tmp_path / "agent", ctx=ctx, toolbox=Toolbox(grants=CAPS),
                     agent="agent", **kwargs)


def calls_log(tmp_path, *, starts: bool = False) -> list[dict]:
    """The LLM-call log's records, without the start records logged before each call unless `starts`."""
    path = tmp_path / "agent" / "llm_calls.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in records if starts or r.get("outcome") != "started"]


def test_a_transcript_with_an_empty_answer_runs_on_a_server_that_refuses_null_content(tmp_path):
    # What an empty answer and a failed attempt leave on disk; the retry sends it all again.
    transcript = tmp_path / "agent" / "transcripts" / "t-1.jsonl"
    transcript.parent.mkdir(parents=True)
    saved = [{"role": "system", "content": "You are a worker."}, {"role": "user", "content": "Put 7 into n.txt."},
             {"role": "assistant", "content": None, "turn": "a1"}, {"not": "a message"}]
    transcript.write_text("".join(json.dumps(m) + "\n" for m in saved))
    with ScriptedLLM(quirks=("null_content_500",)) as llm:
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "n.txt", "content": "7"})]),
                   openai_reply("n.txt holds 7."))
        loop = make_loop(llm, tmp_path, stream=False)
        outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "n.txt holds 7.")
    assert (tmp_path / "agent" / "scratch" / "n.txt").read_text() == "7"
    assert any("not messages" in note for note in loop.notes)


def test_context_exceeded_inside_a_stream_fails_the_task_with_that_reason_and_is_logged(tmp_path):
    with ScriptedLLM() as llm:
        llm.script("openai", {**openai_reply("Writing the file now, then"), "stream_error": CONTEXT_EXCEEDED})
        outcome = make_loop(llm, tmp_path).run()
    assert outcome.kind == "failed" and "Context size has been exceeded" in outcome.text
    [record] = calls_log(tmp_path)
    assert record["outcome"] == "context_overflow" and "Context size has been exceeded" in record["error"]


def test_a_cut_stream_never_completes_a_task(tmp_path):
    with ScriptedLLM() as llm:
        llm.script("openai", *[{**openai_reply("The file n.txt now holds the numb"), "cut": True}] * 3)
        outcome = make_loop(llm, tmp_path).run()
    assert outcome.kind == "failed" and "without a finish reason" in outcome.text
    assert [r["outcome"] for r in calls_log(tmp_path)] == ["truncated"] * 3


def test_a_cut_stream_is_asked_again_and_the_whole_answer_completes_the_task(tmp_path):
    with ScriptedLLM() as llm:
        llm.script("openai", {**openai_reply("n.txt holds the numb"), "cut": True}, openai_reply("n.txt holds 7."))
        outcome = make_loop(llm, tmp_path).run()
    assert (outcome.kind, outcome.text) == ("done", "n.txt holds 7.")


def test_tools_reach_a_server_that_drops_them_without_tool_choice(tmp_path):
    with ScriptedLLM(quirks=("tools_need_choice",)) as llm:
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "n.txt", "content": "7"})]),
                   openai_reply("n.txt holds 7."))
        loop = make_loop(llm, tmp_path)
        outcome = loop.run()
    assert outcome.kind == "done" and not outcome.warnings
    assert (tmp_path / "agent" / "scratch" / "n.txt").read_text() == "7"


def test_a_server_that_drops_the_tools_is_named_in_the_log_and_on_the_task(tmp_path):
    tool_use: dict[str, ToolUse] = {}
    with ScriptedLLM(quirks=("tools_ignored",)) as llm:
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "n.txt", "content": "7"})]))
        loop = make_loop(llm, tmp_path, tool_use=tool_use)
        outcome = loop.run()
    assert outcome.kind == "done" and "write_file" in outcome.text  # the prose of a model without tools
    assert len(outcome.warnings) == 1 and "provider local" in outcome.warnings[0]
    assert "write_file" in outcome.warnings[0] and "dropping the tools" in outcome.warnings[0]
    assert any("dropping the tools" in note for note in loop.notes)
    assert tool_use["local"] == ToolUse(offered=1, called=0, warned=True)


def test_doctor_warns_of_a_provider_that_dropped_every_tool_it_was_offered(tmp_path):
    """The agent's verdict outlives the task: saved beside its breakers, `doctor` shows it (text, --json)."""
    ws = tmp_path / "ws"
    init_workspace(ws)
    with ScriptedLLM(quirks=("tools_ignored",)) as llm:
        (ws / "hermes.yaml").write_text(f"providers:\n  local: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                                        "agents:\n  - name: agent\n")
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "n.txt", "content": "7"})]))
        assert make_loop(llm, ws / "runs").run().kind == "done"
        doctor = [subprocess.run([*CLI, "-w", str(ws), "doctor", *flag], capture_output=True, text=True,
                                 timeout=60, cwd=ROOT) for flag in ((), ("--json",))]
    expected = ("agent: provider local: never returned a tool call in 1 calls with tools offered: "
                "its chat template may not support tools; see docs/explanation/llm-providers.md")
    checks = {c["name"]: c for c in json.loads(doctor[1].stdout)["checks"]}
    assert (checks["tools local"]["level"], checks["tools local"]["detail"]) == ("warn", expected)
    assert f"warn tools local: {expected}" in " ".join(doctor[0].stdout.split())  # text wraps long lines


def test_ignores_tools_decisions():
    known = {"write_file", "read_file"}
    assert ignores_tools(ToolUse(offered=1), "I would use write_file here.", known)[1] is True
    assert ignores_tools(ToolUse(offered=1, called=1), "I would use write_file here.", known) is None
    assert ignores_tools(ToolUse(offered=1), "Done: the file is written.", known) is None
    assert ignores_tools(ToolUse(offered=1), "see my_write_file_notes", known) is None  # not the tool's name
    hint = ignores_tools(ToolUse(offered=IGNORED_AFTER), "A haiku.", known)
    assert hint is not None and hint[1] is False  # said in the log only: a task may need no tool
    assert ignores_tools(ToolUse(offered=0), "write_file", known) is None


def test_a_stream_without_usage_is_logged_with_estimated_tokens(tmp_path):
    with ScriptedLLM(quirks=("no_stream_usage",)) as llm:
        llm.script("openai", openai_reply("n.txt holds 7, as asked.", prompt=999, completion=99))
        outcome = make_loop(llm, tmp_path).run()
    assert outcome.kind == "done"
    [record] = calls_log(tmp_path)
    assert record["estimated"] is True and record["tokens_in"] > 100 and record["tokens_out"] > 0
    assert (record["tokens_in"], record["tokens_out"]) != (999, 99)


def test_a_provider_without_v1_is_skipped_and_the_note_says_why(tmp_path):
    with ScriptedLLM(quirks=("v1_only",)) as llm:
        llm.script("openai", openai_reply("n.txt holds 7."))
        chain = [OpenAIProvider(ProviderConfig(name=name, kind="openai", model="m", base_url=f"{llm.url}{base}",
                                               timeout=5)) for name, base in (("wrong", ""), ("right", "/v1"))]
        loop = make_loop(llm, tmp_path, chain=chain)
        outcome = loop.run()
    assert (outcome.kind, outcome.text) == ("done", "n.txt holds 7.")
    assert [(r["provider"], r["outcome"]) for r in calls_log(tmp_path)] == [("wrong", "misconfigured"), ("right", "ok")]
    assert any("provider wrong skipped" in note and "HTTP 404" in note and "/v1" in note for note in loop.notes)


def test_a_team_on_a_server_with_these_quirks_fails_and_notes_tasks_for_their_real_reasons(
        tmp_path, up):
    """End to end, through the supervisor: a context overflow inside a stream fails its task with that
    reason (the agent does not crash and restart into "holder is gone"), and a task whose model never
    sees its tools is done, with a comment on it and a line in the agent's log saying why."""

    def respond(api: str, body: dict) -> dict:
        task = body["messages"][1]["content"]
        if "overflow" in task:
            return {**openai_reply("Reading everything first, then"), "stream_error": CONTEXT_EXCEEDED}
        return openai_reply(tool_calls=[("write_file", {"path": "n.txt", "content": "7"})])

    with ScriptedLLM(respond, quirks=("tools_ignored", "no_stream_usage")) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            f"providers:\n  local: {{kind: openai, base_url: '{llm.url}/v1', model: m, stream: true}}\n"
            "tiers: {cheap: [local], standard: [local], premium: [local]}\n"
            "agents:\n  - name: thinker\n")
        board = Board(ws / "kanban")
        overflow = board.add({"title": "read the whole overflow corpus", "max_attempts": 1})
        tools = board.add({"title": "write 7 into n.txt"})
        up(ws)
        failed = wait_until(lambda: (d := board.get(overflow["id"]))["status"] == "failed" and d, timeout=60)
        done = wait_until(lambda: (d := board.get(tools["id"]))["status"] == "done" and d, timeout=60)
    assert "Context size has been exceeded" in failed["error"]
    assert agent(ws, "thinker").get("restarts", 0) == 0
    comments = [c for c in done.get("comments") or [] if c.get("by") == "thinker"]
    assert len(comments) == 1 and "write_file" in comments[0]["text"] and "dropping the tools" in comments[0]["text"]
    log = (ws / "runs" / "thinker" / "agent.log").read_text()
    assert "provider local: the model answered in prose" in log
    calls = [json.loads(line) for line in (ws / "runs" / "thinker" / "llm_calls.jsonl").read_text().splitlines()
             if "\"outcome\":\"started\"" not in line]
    assert [c["outcome"] for c in calls if c["task"] == overflow["id"]] == ["context_overflow"]
    assert all(c.get("estimated") for c in calls if c["outcome"] == "ok")


def test_doctor_tool_use_lines_from_saved_documents():
    from hermes_sup.supervisor.config.doctor import tool_use_checks_from

    saved = {"a": {"providers": {"dropper": {"offered": 4, "called": 0, "warned": True},
                                 "caller": {"offered": 4, "called": 1, "warned": True},
                                 "early": {"offered": 1, "called": 0, "warned": False}, "junk": [1]}},
             "b": None, "c": {"providers": "x"}}
    checks = tool_use_checks_from(saved)
    assert [(c["name"], c["level"]) for c in checks] == [("tools dropper", "warn"), ("tools", "warn"),
                                                         ("tools", "warn")]
    assert "in 4 calls with tools offered" in checks[0]["detail"]
    assert checks[1]["detail"] == "b: its tool_use.json cannot be read"


def test_a_call_the_agent_did_not_survive_is_shown_interrupted_with_estimated_tokens(tmp_path, up):
    """kill -9 while the server holds the call open: its start, logged before the call, is what is
    left of it; `usage` and `task log` count it as interrupted with estimated prompt tokens, and the
    retried call that answers is counted once."""
    with ScriptedLLM() as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            f"providers:\n  local: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
            "tiers: {cheap: [local], standard: [local], premium: [local]}\n"
            "agents:\n  - name: thinker\n")
        llm.script("openai", {"delay": 30, **openai_reply("never delivered")}, openai_reply("All done."))
        board = Board(ws / "kanban")
        task = board.add({"title": "think it over"})
        up(ws)
        wait_until(lambda: len(llm.requests) >= 1, timeout=60)
        pid = agent(ws, "thinker")["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: gone(pid), timeout=30)
        wait_until(lambda: board.get(task["id"])["status"] == "done", timeout=90)
        usage = subprocess.run([*CLI, "-w", str(ws), "usage", "--json"], capture_output=True, text=True,
                               timeout=60, cwd=ROOT)
        shown = subprocess.run([*CLI, "-w", str(ws), "task", "log", task["id"]], capture_output=True, text=True,
                               timeout=60, cwd=ROOT)
    total = json.loads(usage.stdout)["tasks"][task["id"]]
    assert (total["calls"], total["failed_calls"], total["estimated_calls"]) == (2, 1, 1)
    assert total["tokens_in"] > 100 and total["tokens_estimated"] == total["tokens_in"] - 100  # the answer: 100 in
    assert total["tokens_out"] == 10
    lines = [line for line in shown.stdout.splitlines() if " model " in line]
    assert len(lines) == 2 and "interrupted" in lines[0] and "(estimated)" in lines[0] and " ok " in lines[1]
