"""Hermes Agent's tool calls work here: every argument its schemas declare is accepted (driven from
tests/fixtures/hermes/tool_schemas.json, hermes-agent 0.19.0), and the ones with a meaning do what
they do in Hermes, for real: files, processes, the board, the loop against the scripted server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the tools
from hermes_sup.agents.delegation import MAX_BATCH, batch, delegate_task, start_early
from hermes_sup.agents.memory import Memories
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.steps import StepRun
from hermes_sup.agents.terminal import BACKGROUND_LOG_KEEP, BackgroundLog, _watch_background
from hermes_sup.agents.tools import (
    HERMES_ONLY,
    REGISTRY,
    Finished,
    NeedsPerson,
    Refused,
    Toolbox,
    ToolContext,
    ToolError,
)
from hermes_sup.kanban import Board

from .conftest import init_workspace, marked_sleep, running, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .loops import task_loop

SCHEMAS: dict[str, Any] = json.loads((Path(__file__).parent / "fixtures/hermes/tool_schemas.json").read_text())
# Hermes' orchestrator tools that move other agents' tasks: left out on purpose (agents/kanban_tools.py).
LEFT_OUT = {"kanban_unblock", "kanban_link"}
ALL = ("fs.read", "fs.write", "shell", "memory", "delegate", "skills", "kanban")


def sample(schema: dict[str, Any]) -> Any:
    """A value of the shape a Hermes schema declares (its first choice, a non-empty string, ...)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: sample(props[name]) for name in schema.get("required") or []}
    if kind == "array":
        return [sample(schema.get("items") or {"type": "string"})]
    return {"string": "x", "integer": 1, "number": 1, "boolean": True}.get(kind, "x")


@pytest.mark.parametrize("name", sorted(set(SCHEMAS) - LEFT_OUT))
def test_every_argument_hermes_declares_is_accepted(name):
    tool = REGISTRY[name]
    hermes = SCHEMAS[name]["parameters"]
    required = sample(hermes)
    box = Toolbox(grants=ALL, toolsets=tuple({t.toolset for t in REGISTRY.values()}))
    box.check(name, required)  # Hermes' required arguments alone: a valid call here
    for argument, shape in hermes["properties"].items():
        box.check(name, {**required, argument: sample(shape)})
    assert tool.name == SCHEMAS[name]["name"]


def test_the_left_out_tools_are_the_only_ones():
    assert set(SCHEMAS) - set(REGISTRY) == LEFT_OUT


def ctx_for(tmp_path: Path, task: dict | None = None, **kwargs: Any) -> ToolContext:
    (tmp_path / "scratch").mkdir(parents=True, exist_ok=True)
    return ToolContext(scratch=tmp_path / "scratch", stop=threading.Event(), board=kwargs.pop("board", None),
                       memory=Memories(tmp_path / "memory"), agent="w1", task=task, **kwargs)


def call(ctx: ToolContext, name: str, **args: Any) -> Any:
    return Toolbox(grants=ALL, toolsets=tuple({t.toolset for t in REGISTRY.values()})).call(ctx, name, args)


# -- files ------------------------------------------------------------------------------------------

V4A = """*** Begin Patch
*** Update File: app.py
@@ def main @@
 def main():
-    print("hello")
+    print("hello, world")
*** End of File
*** Add File: docs/notes.md
+# Notes
+second line
*** Delete File: old.txt
*** Move File: a.txt -> moved/a.txt
*** End Patch"""


def test_patch_in_hermes_modes(tmp_path):
    ctx = ctx_for(tmp_path)
    scratch = ctx.scratch
    (scratch / "app.py").write_text('import sys\n\n\ndef main():\n    print("hello")\n')
    (scratch / "old.txt").write_text("bye")
    (scratch / "a.txt").write_text("moving")
    said = call(ctx, "patch", mode="patch", patch=V4A)
    assert said == "updated app.py; added docs/notes.md; deleted old.txt; moved a.txt to moved/a.txt"
    assert (scratch / "app.py").read_text() == 'import sys\n\n\ndef main():\n    print("hello, world")\n'
    assert (scratch / "docs/notes.md").read_text() == "# Notes\nsecond line\n"
    assert not (scratch / "old.txt").exists() and not (scratch / "a.txt").exists()
    assert (scratch / "moved/a.txt").read_text() == "moving"
    call(ctx, "patch", mode="replace", path="app.py", old_string="world", new_string="there")
    assert "hello, there" in (scratch / "app.py").read_text()


def test_a_patch_that_does_not_apply_changes_nothing(tmp_path):
    ctx = ctx_for(tmp_path)
    (ctx.scratch / "a.txt").write_text("one\n")
    (ctx.scratch / "b.txt").write_text("two\n")
    broken = ("*** Begin Patch\n*** Update File: a.txt\n-one\n+ONE\n*** Update File: b.txt\n-three\n+THREE\n"
              "*** End Patch")
    with pytest.raises(ToolError, match=r"b\.txt: a hunk's context and removed lines are not in the file"):
        call(ctx, "patch", mode="patch", patch=broken)
    assert (ctx.scratch / "a.txt").read_text() == "one\n", "the first file was not written either"
    for escape, reason in (("../x.txt", "'..' is refused"), ("/etc/passwd", "absolute paths are refused")):
        with pytest.raises(ToolError, match=reason):
            call(ctx, "patch", mode="patch", patch=f"*** Begin Patch\n*** Add File: {escape}\n+x\n*** End Patch")
    with pytest.raises(ToolError, match="mode patch needs patch"):
        call(ctx, "patch", mode="patch")
    with pytest.raises(ToolError, match="mode replace needs path, old_string and new_string"):
        call(ctx, "patch", path="a.txt")


def test_search_files_with_hermes_options(tmp_path):
    ctx = ctx_for(tmp_path)
    for index in range(5):
        (ctx.scratch / f"m{index}.py").write_text(f"first\nneedle {index}\nlast\n")
    (ctx.scratch / "notes.md").write_text("needle too\n")
    assert call(ctx, "search_files", pattern="*.md", target="files") == "notes.md"
    assert call(ctx, "search_files", pattern="needle", limit=2).splitlines() == [
        "m0.py:2: needle 0", "m1.py:2: needle 1",
        "[... more results; narrow the search, or page on with offset 2]"]
    assert call(ctx, "search_files", pattern="needle", limit=2, offset=4).splitlines() == [
        "m4.py:2: needle 4", "notes.md:1: needle too"]
    counted = call(ctx, "search_files", pattern="needle", output_mode="count", file_glob="m[01].py")
    assert counted == "m0.py: 1\nm1.py: 1"
    assert call(ctx, "search_files", pattern="needle", output_mode="files_only", target="content",
                path="notes.md") == "notes.md"
    around = call(ctx, "search_files", pattern="needle 3", context=1)
    assert around == "m3.py-1- first\nm3.py:2: needle 3\nm3.py-3- last"


# -- terminal ---------------------------------------------------------------------------------------

def log_of(ctx: ToolContext, said: str) -> Path:
    return ctx.scratch / said.split("its output goes to ")[1].split(" ")[0]


def test_terminal_background_returns_at_once_and_logs_the_output(tmp_path):
    ctx = ctx_for(tmp_path)
    (ctx.scratch / "sub").mkdir()
    os.mkfifo(ctx.scratch / "sub" / "fifo")  # the command waits on it: the call must not
    said = call(ctx, "terminal", command="echo started; pwd; read line < fifo; echo finished", background=True,
                workdir=str(ctx.scratch / "sub"), notify_on_complete=True)
    assert "started in the background: pid" in said and "notify_on_complete: not available here" in said
    log = log_of(ctx, said)
    wait_until(lambda: "started" in log.read_text(), timeout=30)
    assert log.read_text().splitlines()[1] == str((ctx.scratch / "sub").resolve())
    assert "finished" not in log.read_text(), "the call did not wait for the command"
    (ctx.scratch / "sub" / "fifo").write_text("go\n")
    wait_until(lambda: "finished" in log.read_text(), timeout=30)


def test_a_background_command_is_killed_at_its_deadline_and_with_its_task(tmp_path):
    ctx = ctx_for(tmp_path)
    mark = marked_sleep()
    call(ctx, "terminal", command=f"exec {mark}", background=True, timeout=1)
    assert wait_until(lambda: not running(mark), timeout=30)
    stopped, mark = ctx_for(tmp_path / "other"), marked_sleep()
    said = call(stopped, "terminal", command=f"echo started; exec {mark}", background=True)
    log = log_of(stopped, said)
    wait_until(lambda: log.read_text().strip(), timeout=30)
    assert running(mark)
    stopped.stop.set()
    assert wait_until(lambda: not running(mark), timeout=30)


def test_a_background_log_keeps_its_start_and_its_latest_output_only(tmp_path):
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    log = BackgroundLog(fd, keep=100)
    log.add(b"start\n" + b"a" * 94)
    log.add(b"b" * 80)
    assert (tmp_path / "log").read_bytes() == b"start\n" + b"a" * 94 + b"b" * 80, "all of it, while it is small"
    for _ in range(50):
        log.add(b"c" * 100)
    log.add(b"the end\n")
    log.flush()
    os.close(fd)
    kept = (tmp_path / "log").read_bytes()
    assert kept.startswith(b"start\n" + b"a" * 94 + b"\n[... 4,988 bytes of output cut; the latest follow ...]\n")
    assert kept.endswith(b"c" * 92 + b"the end\n") and len(kept) < 300


def test_a_background_command_writing_without_end_fills_no_disk(tmp_path):
    ctx = ctx_for(tmp_path)
    said = call(ctx, "terminal", command="exec yes", background=True)
    log = log_of(ctx, said)
    produced = re.compile(rb"\[\.\.\. ([0-9,]+) bytes of output cut")

    def written() -> int:
        data = log.read_bytes()
        found = produced.search(data)
        return len(data) + (int(found.group(1).replace(b",", b"")) if found else 0)

    try:
        wait_until(lambda: written() > 4 * BACKGROUND_LOG_KEEP + (4 << 20), timeout=60)
        assert log.stat().st_size <= 2 * BACKGROUND_LOG_KEEP + 100
    finally:
        ctx.stop.set()


def test_a_background_command_whose_log_cannot_be_written_is_still_stopped_at_its_deadline():
    proc = subprocess.Popen(["/bin/sh", "-c", "echo output; exec sleep 300"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, process_group=0)
    full = BackgroundLog(os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC))  # every write: ENOSPC, a full disk
    watcher = threading.Thread(target=_watch_background, args=(proc, threading.Event(), 1.0, full), daemon=True)
    try:
        watcher.start()
        watcher.join(timeout=30)
        assert not watcher.is_alive() and proc.poll() is not None, "the command outlived its deadline"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def test_terminal_workdir_stays_in_the_folder_and_long_foreground_timeouts_are_refused(tmp_path):
    ctx = ctx_for(tmp_path)
    for workdir, reason in (("/etc", "absolute paths are refused"), ("../", "'..' is refused"),
                            ("nowhere", "not a folder")):
        with pytest.raises(ToolError, match=reason):
            call(ctx, "terminal", command="pwd", workdir=workdir)
    with pytest.raises(ToolError, match="run a longer one with background: true"):
        call(ctx, "terminal", command="true", timeout=601)


# -- board ------------------------------------------------------------------------------------------

@pytest.fixture
def board(tmp_path):
    board = Board(tmp_path / "kanban")
    yield board
    board.close()


def test_kanban_create_and_comment_with_hermes_arguments(tmp_path, board):
    ctx = ctx_for(tmp_path, {"id": "lead-1"}, board=board)
    first = call(ctx, "kanban_create", title="Research A", assignee="researcher", id="res-a")
    assert first == "created task res-a: Research A"
    said = call(ctx, "kanban_create", title="Synthesize", assignee="writer", parents=["res-a"], skills=["polymarket"],
                idempotency_key="synth-1", tenant="acme", goal_mode=True)
    assert "(ignored here: tenant (no tenants in hermes-sup); goal_mode (no goal loop in hermes-sup))" in said
    task_id = said.split()[2].rstrip(":")
    doc = board.get(task_id)
    assert doc["depends_on"] == ["res-a"] and doc["assignee"] == "writer"
    assert doc["body"].endswith("Skills to read first (skill_view): polymarket")
    again = call(ctx, "kanban_create", title="Synthesize", assignee="writer", idempotency_key="synth-1")
    assert again.startswith(f"created task {task_id}: Synthesize (it was already on the board)")
    assert len(board.list().tasks) == 2
    call(ctx, "kanban_comment", task_id="res-a", body="**Markdown** body")
    call(ctx, "kanban_comment", task_id="res-a", text="still text")
    assert [c["text"] for c in board.get("res-a")["comments"]] == ["**Markdown** body", "still text"]
    with pytest.raises(ToolError, match="give body"):
        call(ctx, "kanban_comment", task_id="res-a")


def test_kanban_show_and_list(tmp_path, board):
    ctx = ctx_for(tmp_path, None, board=board)
    call(ctx, "kanban_create", title="One", assignee="a", id="one")
    call(ctx, "kanban_create", title="Two", assignee="b", id="two")
    board.move("two", "cancelled", by="cli")
    shown = call(ctx_for(tmp_path, {"id": "one"}, board=board), "kanban_show")
    assert json.loads(shown)["title"] == "One" and json.loads(shown)["status"] == "todo"
    assert [row["id"] for row in json.loads(call(ctx, "kanban_list", status="ready"))] == ["one"]
    assert [row["id"] for row in json.loads(call(ctx, "kanban_list", include_archived=True))] == ["one", "two"]
    assert json.loads(call(ctx, "kanban_list", assignee="b", status="archived"))[0]["id"] == "two"
    assert call(ctx, "kanban_list", limit=1, include_archived=True, board="other").endswith(
        "(1 more; raise limit, up to 200)\n(ignored here: board (one board per workspace))")


def test_complete_and_block_act_on_the_task_in_hand_only(tmp_path, board):
    ctx = ctx_for(tmp_path, {"id": "mine"}, board=board)
    call(ctx, "kanban_create", title="Child", assignee="a", id="child-1")
    with pytest.raises(Finished) as done:
        call(ctx, "kanban_complete", summary="Did it.", metadata={"tests_run": 3}, created_cards=["child-1"])
    assert done.value.summary == 'Did it.\nmetadata: {"tests_run": 3}\ncreated cards: child-1'
    with pytest.raises(ToolError, match="tasks this task did not create: ghost"):
        call(ctx, "kanban_complete", summary="x", created_cards=["ghost"])
    for tool, args in (("kanban_complete", {"summary": "x"}), ("kanban_block", {"reason": "y"})):
        with pytest.raises(ToolError, match="works only on the task you are working on"):
            call(ctx, tool, task_id="child-1", **args)
    with pytest.raises(NeedsPerson, match=r"Which API key\? \(needs input\)"):
        call(ctx, "kanban_block", reason="Which API key?", kind="needs_input")


def test_the_worker_tools_are_offered_only_to_agents_that_ask_for_them():
    assert "kanban_complete" not in {s["function"]["name"] for s in Toolbox().schemas()}
    offered = {s["function"]["name"] for s in Toolbox(toolsets=("board", "kanban")).schemas()}
    assert {"kanban_complete", "kanban_block", "kanban_show", "kanban_list", "kanban_create"} <= offered
    with pytest.raises(Refused, match="needs the kanban capability"):
        Toolbox(grants=("fs.read",), toolsets=("kanban",)).check("kanban_show", {})


@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


def test_kanban_complete_ends_a_models_task_done_and_kanban_block_blocks_it(llm, tmp_path, board):
    task = {"id": "t-1", "title": "Report", "body": "Work it as a Hermes worker would."}
    provider = OpenAIProvider(ProviderConfig(name="scripted", kind="openai", model="m", base_url=f"{llm.url}/v1"))

    def run(name: str, doc: dict = task) -> Any:
        ctx = ctx_for(tmp_path / name, doc, board=board)
        return task_loop(task=doc, chain=[provider], workdir=tmp_path / name, ctx=ctx, agent=name,
                         toolbox=Toolbox(grants=ALL, toolsets=("board", "kanban"))).run()

    llm.script("openai", openai_reply(tool_calls=[("kanban_complete", {"summary": "Reported.", "task_id": "t-1"})]))
    outcome = run("a")
    assert (outcome.kind, outcome.text) == ("done", "Reported.")
    llm.script("openai", openai_reply(tool_calls=[("kanban_block", {"reason": "Which quarter?"})]))
    outcome = run("b")
    assert (outcome.kind, outcome.question) == ("blocked", "Which quarter?")
    answered = {**task, "comments": [{"at": "2099-01-01T00:00:00.000000Z", "by": "ops", "text": "Q3",
                                      "answers": "Which quarter?"}]}
    llm.script("openai", openai_reply("Reported for Q3."))
    outcome = run("b", answered)
    assert (outcome.kind, outcome.text) == ("done", "Reported for Q3.")
    assert llm.requests[-1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": "call_0",
                                                         "content": "ops answered: Q3"}, "the answer is its result"


def test_kanban_complete_as_a_step_ends_the_plan_done(tmp_path, board):
    task = {"id": "t-2", "steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "x"}},
                                   {"tool": "kanban_complete", "args": {"summary": "Wrote a.txt."}},
                                   {"tool": "write_file", "args": {"path": "b.txt", "content": "never"}}],
            "history": []}
    ctx = ctx_for(tmp_path, task, board=board)
    outcome = StepRun(task=task, ctx=ctx, toolbox=Toolbox(grants=ALL, toolsets=("files", "kanban")),
                      workdir=tmp_path, agent="w1").run()
    assert outcome.kind == "done" and outcome.results[-1] == "Wrote a.txt."
    assert not (ctx.scratch / "b.txt").exists()


# -- delegation -------------------------------------------------------------------------------------

def test_a_hermes_batch_is_one_delegation_per_task():
    assert batch({"goal": "A", "context": "c"}) == [{"goal": "A", "context": "c"}]
    assert batch({"tasks": [{"goal": "A", "role": "leaf"}, {"goal": "B", "context": "own"}], "context": "shared",
                  "toolsets": ["files"]}) == [{"goal": "A", "context": "shared", "toolsets": ["files"]},
                                              {"goal": "B", "context": "own", "toolsets": ["files"]}]
    with pytest.raises(ToolError, match="needs goal, or tasks"):
        batch({"context": "no goal"})
    # A goal of blank lines passes the schema's minLength; its title (its first line) was then an IndexError.
    for blank in ({"goal": " \n "}, {"tasks": [{"goal": "A"}, {"goal": "\n"}]}):
        with pytest.raises(ToolError, match="goal must say what to do"):
            batch(blank)


def test_a_batch_is_bounded_before_anything_is_started():
    assert len(batch({"tasks": [{"goal": f"part {n}"} for n in range(MAX_BATCH)]})) == MAX_BATCH
    too_many = {"tasks": [{"goal": f"part {n}"} for n in range(MAX_BATCH + 1)]}
    with pytest.raises(ToolError, match=f"at most {MAX_BATCH} tasks in one call \\({MAX_BATCH + 1} given\\)"):
        batch(too_many)
    started: list[dict] = []

    class Recorder:
        def start(self, ctx: ToolContext, item: dict, block: bool) -> None:
            started.append(item)

        def run(self, ctx: ToolContext, item: dict) -> str:
            started.append(item)
            return "done"

    ctx = ToolContext(scratch=Path("."), stop=threading.Event(), services={"delegation": Recorder()})
    start_early(ctx, too_many)  # a turn's calls are started early: not one of these
    with pytest.raises(ToolError, match="at most"):
        delegate_task(ctx, too_many)
    assert started == []


def test_a_hermes_batch_is_worked_by_child_agents_and_answered_in_order(tmp_path, up):
    with ScriptedLLM() as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
            "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
            "agents:\n  - name: lead\n    capabilities: [fs.read, fs.write, memory, kanban, delegate]\n")
        batch_call = ("delegate_task", {"tasks": [{"goal": "Summarize part one", "role": "leaf"},
                                                  {"goal": "Summarize part two", "context": "pages 5-9"}]})
        llm.script("openai", openai_reply(tool_calls=[batch_call]),
                   openai_reply("a summary"), openai_reply("a summary"),  # the two children, in either order
                   openai_reply("Both parts summarized."))
        board = Board(ws / "kanban")
        try:
            task = board.add({"title": "summarize with helpers"})
            up(ws)
            done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=120)
            assert done["result"] == {"answer": "Both parts summarized."}
            children = sorted((d for d in board.list().tasks if (d.get("meta") or {}).get("parent")),
                              key=lambda d: d["title"])
            assert [(c["title"], c["status"]) for c in children] == [("Summarize part one", "done"),
                                                                   ("Summarize part two", "done")]
            assert children[1]["body"] == "Summarize part two\n\nContext:\npages 5-9"
            result = llm.requests[-1]["body"]["messages"][-1]["content"]
            assert result == "## 1. Summarize part one\na summary\n\n## 2. Summarize part two\na summary"
        finally:
            board.close()


def test_a_patch_naming_one_file_twice_loses_nothing(tmp_path):
    # A Move onto itself wrote the file, then deleted it; two sections on one file each started
    # from the file on disk, so the later one silently undid the earlier.
    ctx = ctx_for(tmp_path)
    (ctx.scratch / "a.txt").write_text("keep me\n")
    for patch in ("*** Begin Patch\n*** Move File: a.txt -> ./a.txt\n*** End Patch",
                  "*** Begin Patch\n*** Update File: a.txt\n-keep me\n+first\n*** Update File: a.txt\n"
                  "-keep me\n+second\n*** End Patch",
                  "*** Begin Patch\n*** Add File: b.txt\n+new\n*** Move File: a.txt -> b.txt\n*** End Patch"):
        with pytest.raises(ToolError, match=r"names .* more than once"):
            call(ctx, "patch", mode="patch", patch=patch)
        assert (ctx.scratch / "a.txt").read_text() == "keep me\n"
        assert not (ctx.scratch / "b.txt").exists()


def test_a_background_command_ends_with_the_task_that_started_it(tmp_path, up):
    # Killed only at its deadline (an hour), on a stop, or with the agent, a background command of a
    # finished task ran on through the agent's next tasks, which its own rights did not cover.
    from .test_supervisor import make_ws

    ws = make_ws(tmp_path, "- name: worker\n  roles: [work]\n  capabilities: [fs.read, fs.write, shell]\n")
    board = Board(ws / "kanban")
    mark = marked_sleep()
    task = board.add({"title": "serve", "role": "work", "steps": [
        {"tool": "terminal", "args": {"command": f"echo started > bg.pid; exec {mark}", "background": True}},
        {"tool": "wait", "args": {"seconds": 0.01}}]})
    up(ws)
    wait_until(lambda: board.get(task["id"])["status"] in ("done", "failed"), timeout=60)
    assert board.get(task["id"])["status"] == "done", board.get(task["id"]).get("error")
    from hermes_sup.agents.taskdir import work_folder

    pid_file = work_folder(ws / "runs", task["id"]) / "bg.pid"  # the task's own folder, where its shell ran
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30)
    assert wait_until(lambda: not running(mark), timeout=30)


def test_a_patch_that_cannot_write_one_of_its_files_writes_none(tmp_path):
    # A file where a folder must go failed on the second write, after the first file was changed.
    ctx = ctx_for(tmp_path)
    (ctx.scratch / "a.txt").write_text("one\n")
    (ctx.scratch / "c.txt").write_text("a file\n")
    (ctx.scratch / "d").mkdir()
    for second, blocker in (("*** Add File: c.txt/new\n+x\n", "c.txt is a file"),
                            ("*** Move File: c.txt -> d\n", "d is a folder")):
        with pytest.raises(ToolError, match=f"the patch was not applied: {blocker}"):
            call(ctx, "patch", mode="patch",
                 patch=f"*** Begin Patch\n*** Update File: a.txt\n-one\n+ONE\n{second}*** End Patch")
        assert (ctx.scratch / "a.txt").read_text() == "one\n"
        assert (ctx.scratch / "c.txt").read_text() == "a file\n"


@pytest.mark.parametrize("name", sorted(HERMES_ONLY))
def test_a_hermes_tool_left_out_is_refused_naming_what_to_use_here(name):
    """A Hermes prompt or skill that calls a tool of Hermes' that has no counterpart gets told what to
    do instead, not a bare unknown tool."""
    box = Toolbox(grants=ALL, toolsets=tuple({t.toolset for t in REGISTRY.values()}))
    with pytest.raises(Refused) as refused:
        box.check(name, {})
    assert str(refused.value).startswith(f"{name} is Hermes Agent's tool and has no counterpart here: ")
    assert str(refused.value).endswith(HERMES_ONLY[name])


def test_every_left_out_hermes_tool_has_its_counterpart_said():
    assert set(HERMES_ONLY) >= LEFT_OUT and not set(HERMES_ONLY) & set(REGISTRY)
