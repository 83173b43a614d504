"""Steps, a task's plan run without an LLM: what the log says is done, what a resume runs again."""

from __future__ import annotations

import json
import threading

from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.memory import MemoryFile
from hermes_sup.agents.steps import StepRun, progress, retried_since, step_grants
from hermes_sup.agents.tools import Toolbox, ToolContext

TASK = "t-1"


def record(call_id, status, outcome=None, at="2026-01-01T00:00:00.000000Z", task=TASK, turn="steps", **extra):
    return {"task": task, "turn": turn, "call_id": call_id, "status": status, "at": at,
            **({"outcome": outcome} if outcome else {}), **extra}


def test_progress_folds_the_log():
    seen = progress([
        record("step-1", "started"), record("step-1", "done", "ok", result="a"),
        record("step-2", "started"), record("step-2", "done", "error", result="error: boom"),
        record("step-3", "started", at="2026-01-01T00:00:05.000000Z"),
        record("step-4", "started", task="other"), record("c1", "started", turn="t0"),
        record("step-5", "started"), record("step-5", "done", "ok", result="[1, 2]", value=[1, 2]),
    ], TASK)
    assert seen.done == {"step-1": "a", "step-5": [1, 2]}, "an error is not done; a value keeps its type"
    assert seen.started == {"step-3": "2026-01-01T00:00:05.000000Z"}


def test_a_retry_counts_only_after_the_step_started():
    task = {"history": [{"at": "2026-01-01T00:00:01.000000Z", "from": "blocked", "to": "todo"},
                        {"at": "2026-01-01T00:00:09.000000Z", "from": "doing", "to": "todo"}]}
    assert not retried_since(task, "2026-01-01T00:00:05.000000Z"), "a release is not a person's retry"
    assert retried_since(task, "2026-01-01T00:00:00.500000Z")


def make_run(tmp_path, task, agent="w1"):
    workdir = tmp_path / "runs" / agent
    (workdir / "scratch").mkdir(parents=True, exist_ok=True)
    memory = MemoryFile(workdir / "memory" / "MEMORY.md")
    ctx = ToolContext(scratch=workdir / "scratch", stop=threading.Event(), memory=memory, agent=agent, task=task)
    return StepRun(task=task, workdir=workdir, ctx=ctx, toolbox=Toolbox(grants=("fs.read", "fs.write", "memory")),
                   agent=agent), workdir


def log_of(workdir):
    return [json.loads(line) for line in (workdir / "tool_calls.jsonl").read_text().splitlines()]


STEPS = [{"tool": "write_file", "args": {"path": "a.txt", "content": "one"}},
         {"tool": "memory", "args": {"action": "add", "content": "a fact"}},
         {"tool": "read_file", "args": {"path": "a.txt"}}]


def test_a_resumed_run_skips_what_was_done_and_blocks_on_an_unsafe_half_done_step(tmp_path):
    task = {"id": TASK, "steps": STEPS, "history": [{"to": "doing", "by": "w1", "at": "2026-01-01T00:00:00Z"}]}
    run, workdir = make_run(tmp_path, task)
    run.log.append_tool_call(record("step-1", "started", tool="write_file"))
    (workdir / "scratch/a.txt").write_text("written before the crash")
    run.log.append_tool_call(record("step-1", "done", "ok", result="done before the crash"))
    run.log.append_tool_call(record("step-2", "started", tool="memory"))
    outcome = run.run()
    assert outcome.kind == "blocked" and "step 2 (memory) was running when the agent stopped" in outcome.reason
    assert f"hermes-sup task retry {TASK}" in outcome.reason
    assert len(log_of(workdir)) == 3, "nothing ran"

    task["history"].append({"at": "2099-01-01T00:00:00.000000Z", "from": "blocked", "to": "todo", "by": "cli"})
    outcome = make_run(tmp_path, task)[0].run()
    assert outcome.kind == "done"
    assert outcome.results[0] == "done before the crash"
    assert "written before the crash" in outcome.results[2], "the completed write was not run again"
    assert (workdir / "memory/MEMORY.md").read_text() == "a fact", "a person's retry runs the step, once"


def test_an_idempotent_half_done_step_is_simply_run_again(tmp_path):
    task = {"id": TASK, "steps": STEPS[:1], "history": []}
    run, workdir = make_run(tmp_path, task)
    run.log.append_tool_call(record("step-1", "started", tool="write_file"))
    assert run.run().kind == "done" and (workdir / "scratch/a.txt").read_text() == "one"


def test_a_reclaiming_agent_continues_from_the_steps_another_agent_completed(tmp_path):
    task = {"id": TASK, "steps": STEPS, "history": [{"to": "doing", "by": "w1"}, {"to": "doing", "by": "w2"}]}
    first, _ = make_run(tmp_path, task, "w1")
    first.log.append_tool_call(record("step-1", "started", tool="write_file"))
    first.log.append_tool_call(record("step-1", "done", "ok", result="wrote 3 characters to a.txt"))
    first.log.append_tool_call(record("step-2", "started", tool="memory"))
    first.log.append_tool_call(record("step-2", "done", "ok", result="memory add: ok"))
    second, second_dir = make_run(tmp_path, task, "w2")
    outcome = second.run()
    assert outcome.kind == "failed" and outcome.reason.startswith("step 3 (read_file)"), \
        "w1's file is in w1's scratch: only step 3 ran, in w2's"
    assert not (second_dir / "memory/MEMORY.md").exists(), "w1's completed memory call was not repeated"
    assert [(r["call_id"], r["status"]) for r in log_of(second_dir)] == [
        ("step-1", "started"), ("step-1", "done"), ("step-2", "started"), ("step-2", "done"),
        ("step-3", "started"), ("step-3", "done")]


# -- whose rights the steps run with -------------------------------------------------------------

CODER = ("fs.read", "fs.write", "kanban", "shell")


def made_by(by, **meta):
    return {"id": "x", "meta": meta, "history": [{"by": by, "from": None, "to": "todo", "at": "t"}]}


def test_a_persons_task_runs_its_steps_with_the_claimers_capabilities():
    assert step_grants(CODER, made_by("cli")) == (CODER, "this agent")
    assert step_grants(CODER, made_by("ingest"))[0] == CODER
    # A person may narrow a task of theirs; never widen it past the claimer.
    assert step_grants(CODER, made_by("ingest", capabilities=["fs.read", "network"]))[0] == ("fs.read",)


def test_an_agents_task_runs_its_steps_with_at_most_its_makers_capabilities():
    grants, whose = step_grants(CODER, made_by("planner", created_by="planner", capabilities=["fs.read", "kanban"]))
    assert grants == ("fs.read", "kanban") and whose == "this task's steps (written by planner)"
    # No record (an older task, or a way of making tasks that writes none): no rights, not the claimer's.
    assert step_grants(CODER, made_by("planner"))[0] == ()
    assert step_grants(CODER, {"id": "x"})[0] == (), "no history at all: nobody vouches for the steps"
    for bad in ("shell", [["shell"]], {"shell": True}, None):
        assert step_grants(CODER, made_by("cli", capabilities=bad))[0] == (), bad


def test_a_step_beyond_the_makers_rights_is_refused_and_says_whose_rights_they_are(tmp_path):
    task = {"id": TASK, "steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "one"}},
                                  {"tool": "terminal", "args": {"command": "touch pwned"}}],
            "meta": {"created_by": "planner", "capabilities": ["fs.read", "fs.write"]},
            "history": [{"by": "planner", "to": "todo", "at": "t"}]}
    workdir = tmp_path / "runs" / "coder"
    (workdir / "scratch").mkdir(parents=True)
    grants, whose = step_grants(CODER, task)
    ctx = ToolContext(scratch=workdir / "scratch", stop=threading.Event(), agent="coder", task=task)
    outcome = StepRun(task=task, workdir=workdir, ctx=ctx, toolbox=Toolbox(grants=grants, whose=whose),
                      agent="coder").run()
    assert outcome.kind == "failed" and outcome.results == ["wrote 3 characters to a.txt"]
    assert outcome.reason == ("step 2 (terminal): refused: terminal needs the shell capability, which this "
                              "task's steps (written by planner) is not granted")
    assert not (workdir / "scratch" / "pwned").exists()


def test_the_operators_other_ways_of_adding_a_task_are_a_persons_too():
    # The dashboard's "add a task" (an authenticated user of this machine) and a schedule of
    # hermes.yaml (written by the operator) made tasks whose steps ran with no rights at all: the
    # docs' own schedule (docs/how-to/schedules.md, then the README's)
    # with a write_file step failed at once with "needs the fs.write capability".
    assert step_grants(CODER, made_by("dashboard")) == (CODER, "this agent")
    assert step_grants(CODER, made_by("schedule every-minute")) == (CODER, "this agent")
    assert step_grants(CODER, made_by("dashboard", capabilities=["fs.read"]))[0] == ("fs.read",)
    # Only those exact authors: a look-alike name vouches for nothing.
    for other in ("schedule", "schedules x", "dashboard-2", "scheduler", "import-hermes"):
        assert step_grants(CODER, made_by(other))[0] == (), other
