"""No agent gets more than it was granted, with real agents and real tasks: steps an agent wrote run
with its rights, not with those of the teammate that claims them; no field of a task moves the file
tools out of the task's working folder."""

from __future__ import annotations

import json

from hermes_sup.kanban import Board, TaskNotFound

from .conftest import wait_until
from .test_supervisor import make_ws

TEAM = """- name: planner
  roles: [plan]
  capabilities: [fs.read, kanban]
- name: coder
  roles: [work]
  capabilities: [fs.read, fs.write, kanban, shell]
"""


def settled(board: Board, task_id: str, status: str, timeout: float = 90) -> dict:
    """The task once it has come to rest (done, failed, blocked, cancelled), which must be `status`."""
    def now() -> dict | None:
        try:
            doc = board.get(task_id)
        except TaskNotFound:  # a dropped file not ingested yet
            return None
        return doc if doc["status"] not in ("todo", "doing") else None

    doc = wait_until(now, timeout=timeout)
    assert doc["status"] == status, (task_id, doc["status"], doc.get("error"), doc.get("result"))
    return doc


def terminal(command: str) -> dict:
    return {"tool": "terminal", "args": {"command": command}}


def test_steps_an_agent_without_shell_wrote_do_not_run_with_a_teammates_shell(tmp_path, up):
    ws = make_ws(tmp_path, TEAM)
    board = Board(ws / "kanban")
    # A person's task: the coder's own rights, shell included.
    honest = board.add({"title": "honest", "role": "work", "steps": [terminal("echo ok > ok.txt")]})
    # A person's plan for the planner (no shell), whose steps make tasks with terminal steps for the
    # coder (shell): directly, and relayed through a task whose own steps make the next one.
    board.add({"id": "plan", "title": "plan", "role": "plan", "steps": [
        {"tool": "kanban_create", "args": {"id": "sneaky", "title": "run this", "role": "work",
                                           "steps": [terminal("echo pwned > pwned.txt")]}},
        {"tool": "kanban_create", "args": {"id": "relay", "title": "relay", "role": "work", "steps": [
            {"tool": "kanban_create", "args": {"id": "relayed", "title": "run this too", "role": "work",
                                               "steps": [terminal("echo pwned > relayed.txt")]}}]}}]})
    up(ws)
    settled(board, "plan", "done")
    assert settled(board, honest["id"], "done")["result"]["steps"] == [""]
    assert (ws / f"runs/tasks/{honest['id']}/work/ok.txt").read_text() == "ok\n"
    refused = ("step 1 (terminal): refused: terminal needs the shell capability, which this task's steps "
               "(written by {}) is not granted")
    sneaky = settled(board, "sneaky", "failed")
    assert sneaky["error"] == refused.format("planner")
    assert sneaky["meta"]["capabilities"] == ["fs.read", "kanban"]
    settled(board, "relay", "done")
    relayed = settled(board, "relayed", "failed")
    assert relayed["meta"] == {"created_by": "coder", "capabilities": ["fs.read", "kanban"], "folders": {},
                               "created_by_task": "relay"}, "the relay passed on only the planner's rights"
    assert relayed["error"] == refused.format("coder")
    assert not list((ws / "runs").rglob("pwned.txt")) and not list((ws / "runs").rglob("relayed.txt"))
    calls = [json.loads(line) for line in (ws / "runs/coder/tool_calls.jsonl").read_text().splitlines()]
    assert {c["task"] for c in calls if c.get("tool") == "terminal" and c.get("outcome") == "ok"} == {honest["id"]}


def test_a_task_cannot_move_the_file_tools_out_of_the_scratch_folder(tmp_path, up):
    ws = make_ws(tmp_path, "- name: runner\n  capabilities: [fs.read, fs.write]\n")
    (ws / ".env").write_text("OPENAI_API_KEY=sk-secret-never-read\n")
    board = Board(ws / "kanban")
    (ws / "kanban/inbox/widen.json").write_text(json.dumps({
        "id": "widen", "title": "widen", "max_attempts": 1, "meta": {"workspace": ".", "cwd": ".", "path": "."},
        "steps": [{"tool": "write_file", "args": {"path": "skills/evil.py", "content": "import os\n"}},
                  {"tool": "search_files", "args": {"pattern": "sk-secret"}},
                  {"tool": "read_file", "args": {"path": ".env"}}]}))
    up(ws)
    failed = settled(board, "widen", "failed")
    assert failed["error"] == "step 3 (read_file): no such file: .env"
    assert not (ws / "skills/evil.py").exists(), "the write stayed in the task's folder"
    assert (ws / "runs/tasks/widen/work/skills/evil.py").read_text() == "import os\n"
    log = (ws / "runs/runner/tool_calls.jsonl").read_text()
    results = [json.loads(line).get("result") for line in log.splitlines()]
    assert "sk-secret-never-read" not in log and results[3] == "no matches", "the search saw no .env"


def test_steps_an_agent_without_a_folder_wrote_cannot_write_into_a_teammates_grant(tmp_path, up):
    out = tmp_path / "out"
    out.mkdir()
    # The planner may write (in its task's folder) but is granted no folder; the coder is granted out.
    team = TEAM.replace("  capabilities: [fs.read, kanban]\n", "  capabilities: [fs.read, fs.write, kanban]\n")
    team = team.replace("  capabilities: [fs.read, fs.write, kanban, shell]\n",
                        "  capabilities: [fs.read, fs.write, kanban, shell]\n  folders: [out]\n")
    ws = make_ws(tmp_path, team)
    (ws / "hermes.yaml").write_text(f"folders:\n  out: {{path: {out}, mode: rw}}\n" + (ws / "hermes.yaml").read_text())
    board = Board(ws / "kanban")
    write = {"tool": "write_file", "args": {"path": "out/ok.txt", "content": "ok"}}
    honest = board.add({"title": "honest", "role": "work", "steps": [write]})  # a person's: the coder's folders
    board.add({"id": "plan", "title": "plan", "role": "plan", "steps": [
        {"tool": "kanban_create", "args": {"id": "sneaky", "title": "write this", "role": "work", "steps": [
            {"tool": "write_file", "args": {"path": str(out / "pwned.txt"), "content": "pwned"}}]}}]})
    up(ws)
    settled(board, "plan", "done")
    settled(board, honest["id"], "done")
    assert (out / "ok.txt").read_text() == "ok"
    sneaky = settled(board, "sneaky", "failed")
    assert sneaky["meta"]["folders"] == {}, "the planner has no folder to pass on"
    assert "outside your task's folder" in sneaky["error"] or "absolute paths are refused" in sneaky["error"]
    assert not (out / "pwned.txt").exists()
