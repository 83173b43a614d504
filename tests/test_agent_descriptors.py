"""An agent's open descriptors do not grow with the tasks it works: each task's journal (its
transcript, tool-call and model-call logs) was opened and never closed, one to three descriptors a
task, until a long-running agent met its open-file limit."""

from __future__ import annotations

import os
from pathlib import Path

from hermes_sup.kanban import Board

from .conftest import init_workspace, supervisor_state, wait_until
from .llm_server import ScriptedLLM, openai_reply


def answer(api: str, body: dict) -> dict:
    """A model that writes a file once, then answers: every log of the task's journal is written."""
    if any(message.get("role") == "tool" for message in body["messages"]):
        return openai_reply("written")
    return openai_reply(None, [("write_file", {"path": "note.txt", "content": "x"})])


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_an_agents_descriptors_stay_as_many_after_forty_tasks(tmp_path: Path, up) -> None:
    ws = tmp_path / "ws"
    init_workspace(ws)
    with ScriptedLLM(responder=answer) as llm:
        (ws / "hermes.yaml").write_text(
            f"providers:\n  lab: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
            "tiers: {cheap: [lab], standard: [lab], premium: [lab]}\n"
            "agents:\n  - {name: w}\n")
        up(ws)
        board = Board(ws / "kanban")
        try:
            def work(first: int, count: int) -> None:
                for n in range(first, first + count):
                    board.add({"id": f"llm{n:02d}", "title": f"Write note {n}"})
                    board.add({"id": f"steps{n:02d}", "title": f"Step {n}",
                               "steps": [{"tool": "write_file", "args": {"path": "out.txt", "content": "x"}}]})
                wait_until(lambda: len(board.list("done").tasks) == 2 * (first + count), timeout=120)

            work(0, 2)  # the first tasks open what an agent keeps for good (the event log, its index)
            pid = supervisor_state(ws)["agents"]["w"]["pid"]
            before = descriptors(pid)
            work(2, 20)
            after = descriptors(pid)
        finally:
            board.close()
    assert {t["status"] for t in board.list().tasks} == {"done"}
    assert all(board.get(f"llm{n:02d}")["result"]["answer"] == "written" for n in range(22))
    # Before the fix: one more for each steps task and up to three for each model task (60 to 80).
    assert after <= before + 3, (before, after)
