"""The task journal interface: the agent loop and the steps runner resume from any TaskJournal,
and the file journal keeps the on-disk format (transcripts/<task>.jsonl, tool_calls.jsonl, llm_calls.jsonl)."""

from __future__ import annotations

import ast
import itertools
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.memory import MemoryFile
from hermes_sup.agents.steps import StepRun
from hermes_sup.agents.tools import Toolbox, ToolContext
from hermes_sup.kanban.journal import FileTaskJournal, Read, TaskJournal

REPO = Path(__file__).resolve().parent.parent
TASK = "t-1"
CLOCK = itertools.count(1)  # orders the writes of every MemoryJournal, as a database's sequence does


class MemoryJournal:
    """A task journal kept in memory: what a database-backed one would be, without the database."""

    def __init__(self, holders: dict[str, MemoryJournal] | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.llm: list[dict[str, Any]] = []
        self.holders = holders or {}
        self.replaced = 0
        self.written = 0

    @property
    def label(self) -> str:
        return "memory"

    def transcript(self) -> Read:
        return Read(list(self.messages))

    def append_message(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.written = next(CLOCK)

    def replace_transcript(self, records: list[dict[str, Any]]) -> str | None:
        self.replaced += 1
        self.messages = list(records)
        self.written = next(CLOCK)
        return f"copy {self.replaced}"

    def set_aside_attempt(self, attempt: int) -> str | None:
        self.messages = []
        return f"attempt {attempt}"

    def holder_transcript(self, holder: str) -> Read:
        return self.holders[holder].transcript()

    def newest_transcripts(self, holders: list[str]) -> list[str]:
        kept = [(self.holders[name].written, -rank, name) for rank, name in enumerate(holders)
                if name in self.holders and self.holders[name].messages]
        return [name for *_order, name in sorted(kept, reverse=True)]

    def tool_calls(self) -> list[dict[str, Any]]:
        return [r for r in self.tools if r.get("task") == TASK]

    def append_tool_call(self, record: dict[str, Any]) -> None:
        self.tools.append(record)

    def take_tool_calls(self, holder: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
        have = {tuple(r.get(k) for k in key) for r in self.tools}
        self.tools += [r for r in self.holders[holder].tools if tuple(r.get(k) for k in key) not in have]
        return self.tool_calls()

    def llm_calls(self, holders: Iterable[str] = ()) -> list[dict[str, Any]]:
        return [*self.llm, *(r for name in holders for r in self.holders[name].llm)]

    def append_llm_call(self, record: dict[str, Any]) -> None:
        self.llm.append(record)

    def close(self) -> None:
        pass


def steps_run(tmp_path: Path, task: dict[str, Any], journal: TaskJournal | None, agent: str = "w2") -> StepRun:
    workdir = tmp_path / "runs" / agent
    (workdir / "scratch").mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(scratch=workdir / "scratch", stop=threading.Event(),
                      memory=MemoryFile(workdir / "memory" / "MEMORY.md"), agent=agent, task=task)
    return StepRun(task=task, workdir=workdir, ctx=ctx, toolbox=Toolbox(grants=("fs.read", "fs.write", "memory")),
                   agent=agent, journal=journal)


def done(call_id: str, result: str) -> dict[str, Any]:
    return {"task": TASK, "turn": "steps", "call_id": call_id, "status": "done", "outcome": "ok", "result": result,
            "at": "2026-01-01T00:00:00.000000Z"}


def test_a_task_reclaimed_elsewhere_resumes_from_a_journal_that_is_not_files(tmp_path):
    # w1 completed step 1 on another host; its journal is known only through the interface.
    other_host = MemoryJournal()
    other_host.append_tool_call(done("step-1", "written on the other host"))
    journal = MemoryJournal({"w1": other_host})
    task = {"id": TASK, "steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "one"}},
                                  {"tool": "read_file", "args": {"path": "b.txt"}}],
            "history": [{"to": "doing", "by": "w1"}, {"to": "doing", "by": "w2"}]}
    (tmp_path / "runs" / "w2" / "scratch").mkdir(parents=True)
    (tmp_path / "runs" / "w2" / "scratch" / "b.txt").write_text("bee")
    outcome = steps_run(tmp_path, task, journal).run()
    assert outcome.kind == "done"
    assert outcome.results[0] == "written on the other host", "the step done elsewhere was not run again"
    assert not (tmp_path / "runs" / "w2" / "scratch" / "a.txt").exists()
    assert [r["call_id"] for r in journal.tools if r["status"] == "done"] == ["step-1", "step-2"]
    assert not (tmp_path / "runs" / "w2" / "tool_calls.jsonl").exists(), "nothing went around the interface"


def test_the_file_journal_keeps_the_on_disk_format(tmp_path):
    workdir = tmp_path / "runs" / "w1"
    journal = FileTaskJournal(workdir, TASK)
    assert isinstance(journal, FileTaskJournal)
    interface: TaskJournal = journal  # the protocol is satisfied (checked statically and below)
    for name in ("label", "transcript", "append_message", "replace_transcript", "holder_transcript", "tool_calls",
                 "append_tool_call", "take_tool_calls", "llm_calls", "append_llm_call", "close"):
        assert hasattr(interface, name)
    interface.append_message({"role": "user", "content": "hi"})
    interface.append_tool_call(done("c1", "ok"))
    interface.append_llm_call({"task": TASK, "tokens_in": 1})
    kept = interface.replace_transcript([{"role": "user", "content": "summary"}])
    interface.close()
    assert kept == f"{TASK}.jsonl.1"
    lines = {path.relative_to(workdir).as_posix(): [json.loads(x) for x in path.read_text().splitlines()]
             for path in workdir.rglob("*") if path.is_file()}
    assert lines == {
        f"transcripts/{TASK}.jsonl": [{"role": "user", "content": "summary"}],
        f"transcripts/{TASK}.jsonl.1": [{"role": "user", "content": "hi"}],
        "tool_calls.jsonl": [done("c1", "ok")],
        "llm_calls.jsonl": [{"task": TASK, "tokens_in": 1}],
    }


def test_the_loop_and_the_steps_open_no_journal_file_themselves():
    for name in ("loop.py", "steps.py"):
        tree = ast.parse((REPO / "agents" / name).read_text())
        built = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Name) and node.func.id == "Journal"]
        assert built == [], f"agents/{name} builds a Journal at lines {built}"


def test_steps_resume_past_a_holder_that_died_before_copying_any_record(tmp_path):
    # w1 completed step 1; w0 then claimed the task and was judged gone before copying w1's records.
    first = MemoryJournal()
    first.append_tool_call(done("step-1", "written by w1"))
    journal = MemoryJournal({"w1": first, "w0": MemoryJournal()})
    task = {"id": TASK, "steps": [{"tool": "write_file", "args": {"path": "a.txt", "content": "one"}}],
            "history": [{"to": "doing", "by": "w1"}, {"to": "doing", "by": "w0"}, {"to": "doing", "by": "w2"}]}
    outcome = steps_run(tmp_path, task, journal).run()
    assert (outcome.kind, outcome.results) == ("done", ["written by w1"])
    assert not (tmp_path / "runs" / "w2" / "scratch" / "a.txt").exists(), "the completed step ran again"


def test_the_file_journal_lists_the_holders_transcripts_written_last_first_a_tie_to_the_later_claim(tmp_path):
    runs = tmp_path / "runs"
    for name, mtime in (("w1", 3), ("w2", 3), ("w3", 5), ("w4", 9)):
        path = runs / name / "transcripts" / f"{TASK}.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text('{"role": "user", "content": "hi"}\n' if name != "w4" else "")  # w4's is empty
        os.utime(path, ns=(mtime * 10**9, mtime * 10**9))
    journal = FileTaskJournal(runs / "me", TASK)
    assert journal.newest_transcripts(["w2", "w1", "w3", "w4", "w5", "../w1"]) == ["w3", "w2", "w1"]
    assert journal.newest_transcripts(["w1", "w2"]) == ["w1", "w2"], "a tie goes to the one named first"
