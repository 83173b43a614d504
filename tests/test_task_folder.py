"""A task's own working folder (runs/tasks/<id>/work/): the file tools and the terminal of whoever
holds the task work there, so an agent that takes over a task finds the files its conversation names."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from hermes_sup.agents.taskdir import ensure_work_folder, list_files, work_folder
from hermes_sup.kanban import Board

from .conftest import CLI, ROOT, gone, init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .test_supervisor import agent


def test_an_agent_that_takes_over_a_task_finds_the_files_its_conversation_names(tmp_path, up):
    with ScriptedLLM() as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        # Neither agent comes back once killed: the task can only go on with the other one.
        (ws / "hermes.yaml").write_text(
            f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
            "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
            "defaults:\n  restart: {policy: never}\n  stop_timeout: 5\n"
            "agents:\n  - name: first\n  - name: second\n")
        llm.script("openai",
                   openai_reply(tool_calls=[("write_file", {"path": "draft.txt", "content": "first draft"})]),
                   {"delay": 60, **openai_reply("never delivered")},  # its holder is killed meanwhile
                   openai_reply(tool_calls=[("read_file", {"path": "draft.txt"})]),
                   openai_reply("The draft says: first draft."))
        board = Board(ws / "kanban")
        task = board.add({"title": "write a draft, then read it back"})
        up(ws)
        wait_until(lambda: len(llm.requests) >= 2, timeout=60)  # the file is written, the next call waits
        holder = board.get(task["id"])["claim"]["agent"]
        other = "second" if holder == "first" else "first"
        pid = agent(ws, holder)["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: gone(pid), timeout=30)
        done = wait_until(lambda: (d := board.get(task["id"]))["status"] in ("done", "failed") and d, timeout=90)
        board.close()
    assert done["status"] == "done", done
    assert done["result"] == {"answer": "The draft says: first draft."}
    assert [h["by"] for h in done["history"] if h["to"] == "doing"] == [holder, other], "taken over by the other"
    read_back = llm.requests[3]["body"]["messages"][-1]
    assert read_back["role"] == "tool" and "first draft" in read_back["content"], read_back
    folder = ws / "runs" / "tasks" / task["id"] / "work"
    assert (folder / "draft.txt").read_text() == "first draft"
    assert not (ws / "runs" / holder / "scratch" / "draft.txt").exists(), "not in the first holder's own folder"
    shown = subprocess.run([*CLI, "-w", str(ws), "task", "show", task["id"], "--json"], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    doc = json.loads(shown.stdout)
    assert doc["folder"]["path"] == str(folder)
    assert doc["folder"]["files"] == [{"path": "draft.txt", "bytes": 11}]
    assert {"agent": holder, "path": "draft.txt", "tool": "write_file"} in doc["files"], "written, and there"
    text = subprocess.run([*CLI, "-w", str(ws), "task", "show", task["id"]], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "COLUMNS": "400"}).stdout
    assert f"work folder: {folder}: draft.txt (11 B)" in text


def test_the_folder_is_placed_by_the_task_id_alone_and_never_through_a_link(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for hostile in ("../escape", "a/b", "", ".hidden", "x" * 65):
        with pytest.raises(ValueError):
            work_folder(runs, hostile)
    folder = ensure_work_folder(runs, "t-1")
    assert folder == runs / "tasks" / "t-1" / "work" and folder.is_dir()
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    assert ensure_work_folder(runs, "t-1") == folder, "kept as it is on the next take"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (runs / "tasks" / "t-2").symlink_to(elsewhere)
    with pytest.raises(OSError, match="symlink"):
        ensure_work_folder(runs, "t-2")
    assert list(elsewhere.iterdir()) == [], "nothing made through the link"


def test_the_listing_is_bounded_and_never_follows_a_link(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("bb")
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "link").symlink_to("/etc")
    listed = list_files(tmp_path)
    assert listed["files"] == [{"path": "a.txt", "bytes": 1}, {"path": "link", "bytes": None, "link": True},
                               {"path": "sub/b.txt", "bytes": 2}]
    assert listed["more"] == 0 and listed["complete"]
    for index in range(5):
        (tmp_path / f"n{index}").write_text("")
    cut = list_files(tmp_path, limit=2)
    assert len(cut["files"]) == 2 and cut["more"] == 6


def test_no_agent_may_be_named_like_the_folder_of_the_tasks(tmp_path):
    from hermes_sup.supervisor.config.workspace import ConfigError, load_config

    path = tmp_path / "hermes.yaml"
    path.write_text("agents:\n  - name: tasks\n")
    with pytest.raises(ConfigError, match="runs/tasks/ holds the tasks' working folders"):
        load_config(path)
    path.write_text("agents:\n  - name: tasks2\n")
    assert load_config(path)["agents"][0]["name"] == "tasks2"
