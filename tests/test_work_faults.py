"""An agent's work under faults it did not cause: stopped mid-step, its task cancelled, a question
for a person, a model server that refuses connections. Real agents, real signals, the scripted
LLM server; the pure decisions are tested on their own."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import threading
from datetime import datetime
from pathlib import Path

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.fallback import complete_with_fallback
from hermes_sup.agents.health import CooldownPolicy, ProviderHealth
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig, ProviderError, cooldown_delay
from hermes_sup.agents.terminal import died_of
from hermes_sup.agents.tools import Toolbox, ToolContext, run_step
from hermes_sup.kanban import Board

from .conftest import CLI, ROOT, gone, init_workspace, marked_sleep, running, wait_until


def hermes(ws: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def make_ws(tmp_path: Path, text: str) -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n" + text)
    return ws


def supervisor(ws: Path) -> dict:
    try:
        return json.loads((ws / "runs" / "supervisor.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def agent_state(ws: Path, name: str) -> dict:
    try:
        return json.loads((ws / "runs" / name / "state.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def tool_log(ws: Path, name: str) -> list[dict]:
    path = ws / "runs" / name / "tool_calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- a stop during a step -----------------------------------------------------------------------

def test_the_signal_a_command_died_of():
    assert [died_of(code) for code in (None, 0, 1, -15, -9, 143, 130, 255)] == [None, None, None, 15, 9, 15, 2, None]


def test_a_command_killed_by_our_own_stop_is_interrupted_not_a_result(tmp_path):
    # The supervisor signals the agent's whole session at once: the command may die of the SIGTERM
    # before the agent has turned the same signal into its stop request.
    ctx = ToolContext(scratch=tmp_path, stop=threading.Event())
    toolbox = Toolbox(grants=("shell",))
    threading.Timer(0.3, ctx.stop.set).start()
    with pytest.raises(InterruptedError):
        run_step(ctx, {"tool": "terminal", "args": {"command": "kill -TERM $$"}}, toolbox)
    # A command that kills itself with no stop of ours following is a result like any other.
    # (-15: the shell died of it; 143: bubblewrap's reaper says so as a shell would)
    assert run_step(ToolContext(scratch=tmp_path, stop=threading.Event()),
                    {"tool": "terminal", "args": {"command": "kill -TERM $$"}}, toolbox) in ("exit status -15\n",
                                                                                            "exit status 143\n")


def test_down_during_the_last_terminal_step_gives_the_task_back_not_done(tmp_path, up):
    ws = make_ws(tmp_path, "agents:\n  - name: runner\n    capabilities: [fs.read, fs.write, shell]\n")
    board = Board(ws / "kanban")
    task = board.add({"title": "one long command", "steps": [
        {"tool": "write_file", "args": {"path": "a.txt", "content": "one"}},
        {"tool": "terminal", "args": {"command": "sleep 60"}}]})
    up(ws)
    wait_until(lambda: [(r["call_id"], r["status"]) for r in tool_log(ws, "runner")][-1:] == [("step-2", "started")],
               timeout=60)
    stopped = hermes(ws, "down")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    doc = board.get(task["id"])
    assert doc["status"] == "todo" and doc["result"] is None, doc["history"][-1]
    assert doc["attempts"] == 0, "a stop is not an attempt of the task's fault"
    assert "is stopping" in doc["history"][-1]["note"]
    assert [(r["call_id"], r["status"]) for r in tool_log(ws, "runner")] == [
        ("step-1", "started"), ("step-1", "done"), ("step-2", "started")], "the interrupted step is not done"
    # Taken again, the interrupted step follows the resume rule: terminal is not safe to repeat.
    up(ws)
    blocked = wait_until(lambda: (d := board.get(task["id"]))["status"] == "blocked" and d, timeout=60)
    assert "step 2 (terminal) was running when the agent stopped" in blocked["error"]
    assert len(tool_log(ws, "runner")) == 3, "step 1 was not run again, step 2 not started again"


# -- a cancel -------------------------------------------------------------------------------------

def seconds_between(earlier: str, later: str) -> float:
    def parse(at: str) -> datetime:
        return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ")

    return (parse(later) - parse(earlier)).total_seconds()


def claimed_at(doc: dict) -> str:
    return [h for h in doc["history"] if h["to"] == "doing"][-1]["at"]


def test_a_cancelled_steps_task_stops_at_once_and_the_agent_takes_the_next(tmp_path, up):
    ws = make_ws(tmp_path, "agents:\n  - name: runner\n    capabilities: [fs.read, fs.write, shell]\n")
    board = Board(ws / "kanban")
    mark = marked_sleep()
    slow = board.add({"title": "slow", "priority": 5, "steps": [
        {"tool": "terminal", "args": {"command": f"echo started > slow.pid; {mark}"}},
        {"tool": "write_file", "args": {"path": "late.txt", "content": "too late"}}]})
    following = board.add({"title": "next", "steps": [
        {"tool": "write_file", "args": {"path": "next.txt", "content": "next"}}]})
    up(ws)
    pid_file = ws / "runs/tasks" / slow["id"] / "work/slow.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=60)
    cancelled = hermes(ws, "task", "cancel", slow["id"])
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    done = wait_until(lambda: (d := board.get(following["id"]))["status"] == "done" and d, timeout=30)
    took = seconds_between(board.get(slow["id"])["history"][-1]["at"], claimed_at(done))
    assert took < 1.0, f"the agent took the next task {took:.2f} s after the cancel"
    assert board.get(slow["id"])["status"] == "cancelled"
    assert not (ws / "runs/tasks" / slow["id"] / "work/late.txt").exists(), "no step ran after the cancel"
    assert wait_until(lambda: not running(mark), timeout=5), "the running command was killed"
    assert [(r["call_id"], r["status"]) for r in tool_log(ws, "runner") if r["task"] == slow["id"]] == [
        ("step-1", "started")]
    log = (ws / "runs/runner/agent.log").read_text()
    assert f"stopped work on {slow['id']}: it was moved to cancelled" in log


def test_a_cancelled_llm_task_cuts_the_stream_and_calls_no_model_again(tmp_path, up):
    from .llm_server import ScriptedLLM, openai_reply

    with ScriptedLLM() as llm:
        ws = make_ws(tmp_path, f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m, "
                               "stream: true}\n"
                               "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
                               "agents:\n  - name: thinker\n")
        llm.script("openai", {"drip": 0.05, **openai_reply("word " * 400)}, openai_reply("the next one"))
        board = Board(ws / "kanban")
        talky = board.add({"title": "talk at length", "priority": 5})
        following = board.add({"title": "then this"})
        up(ws)
        wait_until(lambda: len(llm.requests) == 1, timeout=60)
        assert hermes(ws, "task", "cancel", talky["id"]).returncode == 0
        done = wait_until(lambda: (d := board.get(following["id"]))["status"] == "done" and d, timeout=30)
        took = seconds_between(board.get(talky["id"])["history"][-1]["at"], claimed_at(done))
        assert took < 1.0, f"the agent took the next task {took:.2f} s after the cancel"
        assert done["result"] == {"answer": "the next one"}
        wait_until(lambda: llm.requests[0].get("aborted"), timeout=5)  # the stream was cut, not read to its end
        assert [r["body"]["messages"][1]["content"].split(":")[0] for r in llm.requests] == [
            f"Task {talky['id']}", f"Task {following['id']}"], "no model call for the cancelled task after the cancel"
        assert board.get(talky["id"])["status"] == "cancelled"
        assert not (ws / f"runs/thinker/transcripts/{talky['id']}.jsonl").read_text().count('"assistant"')


def test_the_open_subtasks_of_a_task_are_found_through_every_level_and_a_loop_ends():
    from hermes_sup.agents.delegation import open_subtasks

    def doc(task_id: str, status: str, parent: str | None = None) -> dict:
        return {"id": task_id, "status": status, "meta": {"parent": {"task": parent}} if parent else None}

    tasks = [doc("p", "cancelled"), doc("a", "doing", "p"), doc("b", "done", "p"), doc("a1", "todo", "a"),
             doc("b1", "blocked", "b"), doc("x", "todo", "other"), doc("l1", "todo", "l2"), doc("l2", "todo", "l1"),
             {"id": "odd", "status": "todo", "meta": {"parent": "p"}}]
    assert open_subtasks(tasks, "p") == ["a", "a1", "b1"]
    assert open_subtasks(tasks, "l1") == ["l2"]
    assert open_subtasks(tasks, "nothing") == []


def test_cancelling_a_delegating_task_cancels_its_open_subtasks_so_none_waits_for_a_gone_child(tmp_path, up):
    from .llm_server import ScriptedLLM, openai_reply

    with ScriptedLLM() as llm:
        ws = make_ws(tmp_path, f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                               "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
                               "agents:\n  - name: thinker\n"
                               "    capabilities: [fs.read, fs.write, memory, kanban, delegate]\n"
                               "    delegation: {max_concurrent: 1}\n")
        # Two delegations in one turn, one slot: the first child works (its model call hangs), the
        # second subtask waits in todo for a child that is not started yet.
        llm.script("openai", openai_reply(tool_calls=[("delegate_task", {"goal": "Think for a long time"}),
                                                      ("delegate_task", {"goal": "Then this"})]),
                   {"delay": 60, **openai_reply("never delivered")})
        board = Board(ws / "kanban")
        task = board.add({"title": "delegate twice"})
        up(ws)
        children = wait_until(lambda: agent_state(ws, "thinker").get("children"), timeout=60)
        wait_until(lambda: len(llm.requests) >= 2, timeout=30)  # the child is in its model call
        subtasks = wait_until(lambda: len(found := [d for d in board.list().tasks
                                                    if (d.get("meta") or {}).get("parent")]) == 2 and found,
                              timeout=30)
        assert sorted(d["status"] for d in subtasks) == ["doing", "todo"]
        cancelled = hermes(ws, "task", "cancel", task["id"])
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        for sub in subtasks:
            doc = wait_until(lambda s=sub: (d := board.get(s["id"]))["status"] == "cancelled" and d, timeout=30)
            last = doc["history"][-1]
            assert (last["by"], last["note"]) == ("thinker", f"its parent task {task['id']} was cancelled (by cli)")
            assert doc.get("claim") is None
        assert wait_until(lambda: gone(children[0]["pid"]), timeout=30), "the working child was stopped"
        assert board.get(task["id"])["status"] == "cancelled"
        assert len(llm.requests) == 2, "no model call after the cancel"


# -- a question for a person --------------------------------------------------------------------

def test_an_ask_human_step_blocks_with_its_question_and_the_answer_is_its_result(tmp_path, up):
    ws = make_ws(tmp_path, "agents:\n  - name: runner\n")
    board = Board(ws / "kanban")
    task = board.add({"title": "ask first", "steps": [
        {"tool": "ask_human", "args": {"question": "Which colour?"}},
        {"tool": "write_file", "args": {"path": "after.txt", "content": "asked"}}]})
    up(ws)
    blocked = wait_until(lambda: (d := board.get(task["id"]))["status"] == "blocked" and d, timeout=60)
    assert blocked["question"] == "Which colour?" and blocked["attempts"] == 0, "asking is not a failed attempt"
    shown = hermes(ws, "task", "show", task["id"])
    assert "Which colour?" in shown.stdout and f"task answer {task['id']}" in shown.stdout.replace("\n", " ")
    assert not (ws / "runs/tasks" / task["id"] / "work/after.txt").exists(), \
        "the step after the question waits for the answer"
    answered = hermes(ws, "task", "answer", task["id"], "blue, [b]really[/b]")
    assert answered.returncode == 0, answered.stdout + answered.stderr
    done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=60)
    assert done["result"]["steps"] == ["cli answered: blue, [b]really[/b]", "wrote 5 characters to after.txt"]
    assert (ws / "runs/tasks" / task["id"] / "work/after.txt").read_text() == "asked", "where it was looked for"
    assert done["attempts"] == 1 and done.get("question") is None
    assert supervisor(ws)["agents"]["runner"]["restarts"] == 0, "the question did not crash the agent"
    assert [(r["call_id"], r["status"]) for r in tool_log(ws, "runner")] == [
        ("step-1", "started"), ("step-1", "done"), ("step-2", "started"), ("step-2", "done")]


def test_a_model_that_asks_gets_the_answer_as_the_result_of_its_question(tmp_path, up):
    from .llm_server import ScriptedLLM, openai_reply

    with ScriptedLLM() as llm:
        ws = make_ws(tmp_path, f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                               "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
                               "agents:\n  - name: thinker\n")
        llm.script("openai", openai_reply(tool_calls=[("ask_human", {"question": "Which file?"})]),
                   openai_reply("I will use notes.txt."))
        board = Board(ws / "kanban")
        task = board.add({"title": "edit the file"})
        up(ws)
        blocked = wait_until(lambda: (d := board.get(task["id"]))["status"] == "blocked" and d, timeout=60)
        assert (blocked["question"], blocked["attempts"]) == ("Which file?", 0)
        refused = hermes(ws, "task", "answer", "no-such-task", "x")
        assert refused.returncode != 0 and "Traceback" not in refused.stderr
        assert hermes(ws, "task", "answer", task["id"], "notes.txt").returncode == 0
        done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=60)
        assert done["result"] == {"answer": "I will use notes.txt."}
        sent = llm.requests[-1]["body"]["messages"]
        assert sent[-1] == {"role": "tool", "tool_call_id": "call_0", "content": "cli answered: notes.txt"}
        assert len(llm.requests) == 2, "the model was not asked again for the question it already put"
        again = hermes(ws, "task", "answer", task["id"], "late")
        assert again.returncode != 0 and "waits on no question" in again.stderr


# -- a model server that is not there, an error that cannot go away ------------------------------

def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_the_cooldown_doubles_up_to_its_cap_with_bounded_jitter():
    policy = CooldownPolicy(base=5.0, cap=60.0, jitter=0.2)
    assert cooldown_delay(0, policy, 0.5) == 0.0
    assert [cooldown_delay(n, policy, 0.5) for n in (1, 2, 3, 4, 5, 6, 100)] == [5, 10, 20, 40, 60, 60, 60]
    assert (cooldown_delay(1, policy, 0.0), cooldown_delay(1, policy, 0.999999)) == pytest.approx((4.0, 6.0))
    spread = {round(cooldown_delay(3, policy, random.Random(seed).random()), 3) for seed in range(20)}
    assert len(spread) > 10 and all(16.0 <= delay <= 24.0 for delay in spread), "agents do not knock in step"


def test_a_provider_that_refuses_connections_cools_down_and_is_skipped_meanwhile():
    now = [1000.0]
    health = ProviderHealth(CooldownPolicy(base=5.0, cap=60.0, jitter=0.0), clock=lambda: now[0])
    down = OpenAIProvider(ProviderConfig(name="down", kind="openai", model="m", base_url=f"{closed_port_url()}/v1"))
    attempts = []
    with pytest.raises(ProviderError) as first:
        complete_with_fallback([down], [{"role": "user", "content": "hi"}], None, log=attempts.append, health=health)
    assert (first.value.kind, first.value.retry_at) == ("unreachable", 1005.0)
    assert str(first.value) == "provider down down until 1970-01-01T00:16:45Z (unreachable)"
    with pytest.raises(ProviderError) as second:
        complete_with_fallback([down], [{"role": "user", "content": "hi"}], None, log=attempts.append, health=health)
    assert second.value.kind == "unreachable" and len(attempts) == 1, "a cooling provider is not called"
    now[0] = 1006.0
    with pytest.raises(ProviderError) as third:
        complete_with_fallback([down], [{"role": "user", "content": "hi"}], None, log=attempts.append, health=health)
    assert third.value.retry_at == 1016.0 and len(attempts) == 2, "tried again after the cooldown, then longer"
    health.answered("down")
    assert health.cooling("down") is None


def test_a_provider_rate_limiting_past_the_retries_cools_down_for_its_retry_after():
    from .llm_server import ScriptedLLM, error_reply

    now = [1000.0]
    health = ProviderHealth(CooldownPolicy(base=5.0, cap=60.0, jitter=0.0), clock=lambda: now[0])
    with ScriptedLLM() as llm:
        llm.script("openai", error_reply(429, "slow down", kind="rate_limit_exceeded", headers={"retry-after": "90"}))
        busy = OpenAIProvider(ProviderConfig(name="busy", kind="openai", model="m", base_url=f"{llm.url}/v1"))
        with pytest.raises(ProviderError) as info:
            complete_with_fallback([busy], [{"role": "user", "content": "hi"}], None, health=health)
        assert len(llm.requests) == 1
    assert (info.value.kind, info.value.retry_at) == ("unreachable", 1090.0), "its retry-after, not the cooldown"
    assert str(info.value).startswith("provider busy down until ") and str(info.value).endswith("(rate limited)")
    assert health.cooling("busy") == (1090.0, "rate limited")


def test_a_rejected_key_or_exhausted_quota_cools_down_rather_than_failing_task_after_task():
    from .llm_server import ScriptedLLM, error_reply

    now = [1000.0]
    health = ProviderHealth(CooldownPolicy(base=5.0, cap=60.0, jitter=0.0), clock=lambda: now[0])
    with ScriptedLLM() as llm:
        llm.script("openai", error_reply(401, "invalid api key", kind="invalid_api_key"),
                   error_reply(429, "You exceeded your current quota", kind="insufficient_quota"))
        keyed = OpenAIProvider(ProviderConfig(name="keyed", kind="openai", model="m", base_url=f"{llm.url}/v1"))
        paid = OpenAIProvider(ProviderConfig(name="paid", kind="openai", model="m", base_url=f"{llm.url}/v1"))
        with pytest.raises(ProviderError) as info:
            complete_with_fallback([keyed, paid], [{"role": "user", "content": "hi"}], None, health=health)
        assert len(llm.requests) == 2, "neither is retried"
    assert info.value.kind == "unreachable"
    assert str(info.value) == ("provider keyed down until 1970-01-01T00:16:45Z (rejected its key); "
                               "provider paid down until 1970-01-01T00:16:45Z (out of quota)")


def test_an_unreachable_provider_leaves_the_tasks_waiting_without_spending_attempts(tmp_path, up):
    ws = make_ws(tmp_path, f"providers:\n  gone: {{kind: openai, base_url: '{closed_port_url()}/v1', model: m}}\n"
                           "tiers: {cheap: [gone], standard: [gone], premium: [gone]}\n"
                           "agents:\n  - name: thinker\n")
    board = Board(ws / "kanban")
    tasks = [board.add({"title": f"think {n}"}) for n in range(3)]
    up(ws)
    log = ws / "runs/thinker/llm_calls.jsonl"
    wait_until(lambda: log.exists() and '"outcome":"unavailable"' in log.read_text(), timeout=60)

    def all_waiting() -> list[dict]:
        docs = [board.get(t["id"]) for t in tasks]
        return docs if all(d["status"] == "todo" and (d.get("waiting") or "").startswith(
            "provider gone down until ") for d in docs) else []

    docs = wait_until(all_waiting, timeout=30)
    assert [d["attempts"] for d in docs] == [0, 0, 0], "a server that is not there costs no attempt"
    assert "failed" not in json.dumps([d["history"] for d in docs])
    calls = [json.loads(line) for line in log.read_text().splitlines() if '"outcome":"started"' not in line]
    assert [c["outcome"] for c in calls] == ["unavailable"], "one refused connection, then the cooldown"


def test_a_step_that_can_never_succeed_fails_at_once(tmp_path, up):
    ws = make_ws(tmp_path, "agents:\n  - name: runner\n")
    board = Board(ws / "kanban")
    unknown = board.add({"title": "no such tool", "steps": [{"tool": "teleport", "args": {}}]})
    lacking = board.add({"title": "no shell", "steps": [{"tool": "terminal", "args": {"command": "true"}}]})
    up(ws)
    for task, why in ((unknown, "unknown tool 'teleport'"), (lacking, "needs the shell capability")):
        doc = wait_until(lambda t=task: (d := board.get(t["id"]))["status"] == "failed" and d, timeout=60)
        assert doc["attempts"] == 1 and why in doc["error"], doc["history"]
        assert doc["history"][-1]["note"].startswith("cannot succeed, not retried: step 1")


def test_doctor_probes_each_named_provider(tmp_path):
    from .llm_server import ScriptedLLM

    with ScriptedLLM() as llm:
        ws = make_ws(tmp_path, f"providers:\n  here: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                               f"  claude: {{kind: anthropic, base_url: '{llm.url}', model: c}}\n"
                               f"  gone: {{kind: openai, base_url: '{closed_port_url()}/v1', model: m}}\n"
                               "agents:\n  - name: a\n")
        result = hermes(ws, "doctor", "--json")
        checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert (checks["provider here"]["level"], checks["provider here"]["detail"][-9:]) == ("ok", "reachable")
    assert checks["provider claude"]["level"] == "ok" and checks["provider claude"]["detail"].endswith("reachable")
    assert checks["provider gone"]["level"] == "warn"
    assert "unreachable (" in checks["provider gone"]["detail"] and "refused" in checks["provider gone"]["detail"]


def test_a_task_that_trips_the_agent_fails_without_taking_the_agent_down(tmp_path):
    from hermes_sup.agents.worker import Agent

    agent = Agent({"name": "a"}, tmp_path, tmp_path / "runs" / "a")
    try:
        task = agent.board.add({"title": "trips a bug", "steps": [{"tool": "wait", "args": {"seconds": 0}}]})
        doc = agent.board.claim("a")

        def bug(doc, halt):  # stands for any bug a task's input trips inside the agent
            raise RuntimeError("a bug")

        agent._work = bug
        agent.work(doc)  # returns: the agent goes on with its next task
        failed = agent.board.get(task["id"])
        assert failed["status"] == "todo"
        assert failed["error"] == "the agent could not work this task: RuntimeError: a bug"
        assert failed["attempts"] == 1 and failed["claim"] is None
    finally:
        agent.board.close()


# -- the pure decisions -----------------------------------------------------------------------------

def test_whether_a_claim_is_still_held():
    from hermes_sup.agents.worker import claim_gone

    held = {"status": "doing", "claim": {"token": 3, "agent": "a"}, "history": []}
    assert claim_gone(held, 3) is None
    assert claim_gone(held, 2) == "it was claimed again by a"
    assert claim_gone(None, 3) == "it is no longer on the board"
    cancelled = {"status": "cancelled", "claim": None, "history": [{"note": "cancelled; claim of a revoked"}]}
    assert claim_gone(cancelled, 3) == "it was moved to cancelled (cancelled; claim of a revoked)"


def test_the_tasks_waiting_for_a_provider_are_marked_at_once_when_the_reason_changes_else_once_a_while():
    from hermes_sup.agents.worker import MARK_EVERY, mark_due

    said = ("no LLM provider available", 100.0)
    assert mark_due("no LLM provider available", ("", -MARK_EVERY), 0.0, 5.0) == (True, 5.0), "the first turn"
    assert mark_due(None, said, 100.1, 60.0) == (True, 60.0), "a new reason at once"
    # The same one again soon after (a task done in between): not written, and the wait ends in time.
    due, timeout = mark_due("no LLM provider available", said, 100.0 + MARK_EVERY / 4, 5.0)
    assert not due and timeout == pytest.approx(MARK_EVERY * 3 / 4)
    assert mark_due("no LLM provider available", said, 100.0 + MARK_EVERY, 5.0) == (True, 5.0)


def test_the_answer_a_question_gets_is_the_latest_one_given_after_it_was_asked():
    from hermes_sup.agents.durable import answer_since

    task = {"comments": [{"at": "2026-01-01T00:00:01.000000Z", "by": "ana", "text": "old", "answers": "Q?"},
                         {"at": "2026-01-01T00:00:05.000000Z", "by": "bo", "text": "a comment"},
                         {"at": "2026-01-01T00:00:06.000000Z", "by": "cy", "text": "new", "answers": "Q?"}]}
    assert answer_since(task, "2026-01-01T00:00:00.000000Z") == "cy answered: new"
    assert answer_since(task, "2026-01-01T00:00:07.000000Z") is None, "an answer to an earlier question"
    assert answer_since({}, "") is None


def test_a_new_key_in_dot_env_ends_the_cooldowns_at_once(tmp_path, monkeypatch):
    from hermes_sup.agents.worker import Agent

    monkeypatch.delenv("H5_TEST_KEY", raising=False)
    llm = {"providers": {"keyed": {"kind": "openai", "base_url": f"{closed_port_url()}/v1", "model": "m",
                                   "api_key_env": "H5_TEST_KEY"}},
           "tiers": {"cheap": ["keyed"], "standard": ["keyed"], "premium": ["keyed"]}}
    (tmp_path / ".env").write_text("H5_TEST_KEY=wrong\n")
    agent = Agent({"name": "a", "llm": llm}, tmp_path, tmp_path / "runs" / "a")
    try:
        assert agent.has_llm()
        retry_at = agent.health.refused("keyed", "rejected its key", at_least=300)
        agent._paused = (retry_at, "provider keyed rejected its key, retry at later")
        assert agent._waiting_reason()[0] == "provider keyed rejected its key, retry at later"
        (tmp_path / ".env").write_text("H5_TEST_KEY=fixed\n")
        assert agent._waiting_reason() is None, "the LLM tasks are taken again with the new key"
        assert agent.health.cooling("keyed") is None
    finally:
        agent.board.close()
