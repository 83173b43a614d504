"""Granted folders (agents/grants.py, supervisor/config/folders.py): the file tools reach a folder of the
user's machine hermes.yaml grants an agent, by its absolute path or NAME/..., read-only where it says
so, never outside it (`..`, symlinks, a swapped folder); a task's steps get no folder their maker
lacked; hermes.yaml's `folders:` is checked with file:line; and end to end, an agent process served
by the scripted model reads a read-only folder and writes its answer into a read-write one."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.grants import Grant, GrantRefused, describe, grants_of, place
from hermes_sup.agents.steps import step_folders
from hermes_sup.agents.tools import CAPABILITIES, REGISTRY, Toolbox, ToolContext, ToolError
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import ConfigError, load_config
from hermes_sup.supervisor.spec import build_specs

from .conftest import wait_until
from .llm_server import ScriptedLLM, openai_reply
from .test_supervisor import llm_workspace


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    papers, out, task = tmp_path / "papers", tmp_path / "out", tmp_path / "task"
    for folder in (papers / "2024", out, task):
        folder.mkdir(parents=True)
    (papers / "2024" / "a.txt").write_text("alpha\n")
    (tmp_path / "secret.txt").write_text("secret\n")
    return {"papers": papers, "out": out, "task": task, "base": tmp_path}


def grants(folders: dict[str, Path]) -> tuple[Grant, ...]:
    return grants_of({"folders": {"papers": {"path": str(folders["papers"]), "mode": "ro"},
                                  "out": {"path": str(folders["out"]), "mode": "rw"}}})


def test_a_path_names_a_grant_by_its_absolute_path_or_its_name(folders):
    given = grants(folders)
    by_path = place(str(folders["papers"] / "2024" / "a.txt"), folders["task"], given)
    by_name = place("papers/2024/a.txt", folders["task"], given)
    assert by_path == by_name and by_path.grant.name == "papers"
    assert place("notes.md", folders["task"], given).root == folders["task"], "other relative paths: the task's"
    assert place("out/r.md", folders["task"], given, write=True).target == folders["out"] / "r.md"


@pytest.mark.parametrize("path, write, reason", [
    ("papers/new.txt", True, "granted read-only"),
    ("{papers}/2024/a.txt", True, "granted read-only"),
    ("{base}/secret.txt", False, "outside your task's folder and every folder granted"),
    ("papers/../secret.txt", False, "'..' is refused"),
    ("~/x", False, "'~' is refused"),
    ("papers", False, "the granted folder papers itself"),
])
def test_what_a_grant_does_not_allow_is_refused(folders, path, write, reason):
    path = path.format(**{k: str(v) for k, v in folders.items()})
    with pytest.raises(GrantRefused, match=reason):
        place(path, folders["task"], grants(folders), write=write)


def test_a_symlink_in_a_grant_leads_nowhere_outside_and_a_swapped_grant_is_not_used(folders):
    (folders["out"] / "link").symlink_to(folders["base"] / "secret.txt")
    with pytest.raises(GrantRefused, match="leads outside the granted folder out"):
        place("out/link", folders["task"], grants(folders))
    given = grants(folders)
    folders["papers"].rename(folders["base"] / "moved")
    folders["papers"].symlink_to(folders["base"])
    with pytest.raises(GrantRefused, match="is now a symlink"):
        place("papers/secret.txt", folders["task"], given)


def test_a_read_only_grant_inside_a_read_write_one_is_read_only_however_it_is_named(folders):
    data = folders["out"] / "data"
    data.mkdir()
    (data / "keep.txt").write_text("keep")
    (folders["out"] / "link").symlink_to(data / "keep.txt")
    nested = grants_of({"folders": {"out": {"path": str(folders["out"]), "mode": "rw"},
                                    "data": {"path": str(data), "mode": "ro"}}})
    for path in ("out/data/keep.txt", str(data / "keep.txt"), "out/link", "data/keep.txt"):
        with pytest.raises(GrantRefused, match="in data, which is granted read-only"):
            place(path, folders["task"], nested, write=True)
    assert place("out/other.txt", folders["task"], nested, write=True).grant.name == "out"


def test_dot_slash_names_the_task_folders_own_folder_of_a_grants_name(folders):
    (folders["task"] / "papers").mkdir()
    assert place("./papers/x.txt", folders["task"], grants(folders)).root == folders["task"]
    ctx = context(folders)
    assert call(ctx, "terminal", command="pwd", workdir=str(folders["task"] / "papers")).strip() == \
        str(folders["task"] / "papers")


def test_without_grants_absolute_paths_are_refused_as_before(folders):
    with pytest.raises(GrantRefused, match=r"absolute paths are refused: /etc/passwd \(paths are relative"):
        place("/etc/passwd", folders["task"], ())
    assert describe(()) == ""
    assert "papers: " in describe(grants(folders)) and "(read-only)" in describe(grants(folders))


# -- the file tools -------------------------------------------------------------------------------------

def call(ctx: ToolContext, name: str, **args):
    return Toolbox(grants=CAPABILITIES, toolsets=tuple({t.toolset for t in REGISTRY.values()})).call(ctx, name, args)


def context(folders, **settings) -> ToolContext:
    return ToolContext(scratch=folders["task"], stop=threading.Event(), agent="w1", settings={
        "folders": {"papers": {"path": str(folders["papers"]), "mode": "ro"},
                    "out": {"path": str(folders["out"]), "mode": "rw"}}, **settings})


def test_the_file_tools_read_a_read_only_grant_and_write_only_a_read_write_one(folders):
    ctx = context(folders)
    assert call(ctx, "read_file", path=str(folders["papers"] / "2024" / "a.txt")) == "alpha\n"
    for name, args in (("write_file", {"path": "papers/2024/a.txt", "content": "x"}),
                       ("patch", {"path": "papers/2024/a.txt", "old_string": "alpha", "new_string": "x"}),
                       ("patch", {"mode": "patch", "patch": "*** Begin Patch\n*** Add File: papers/b.txt\n+b\n"
                                                             "*** End Patch"})):
        with pytest.raises(ToolError, match="granted read-only"):
            call(ctx, name, **args)
    assert (folders["papers"] / "2024" / "a.txt").read_text() == "alpha\n"
    assert not (folders["papers"] / "b.txt").exists()
    call(ctx, "write_file", path="out/summary.md", content="alpha is the word")
    call(ctx, "patch", path=str(folders["out"] / "summary.md"), old_string="word", new_string="answer")
    assert (folders["out"] / "summary.md").read_text() == "alpha is the answer"
    found = call(ctx, "search_files", pattern="alpha", path="papers")
    assert "papers/2024/a.txt" in found, found
    with pytest.raises(ToolError, match="outside your task's folder"):
        call(ctx, "read_file", path=str(folders["base"] / "secret.txt"))


def test_the_file_tools_without_grants_still_refuse_every_absolute_path(folders):
    ctx = ToolContext(scratch=folders["task"], stop=threading.Event(), agent="w1")
    with pytest.raises(ToolError, match="absolute paths are refused"):
        call(ctx, "read_file", path=str(folders["papers"] / "2024" / "a.txt"))


def test_a_tasks_steps_get_only_the_folders_their_maker_had():
    claimer = {"papers": {"path": "/p", "mode": "ro"}, "out": {"path": "/o", "mode": "rw"}}
    made = {"history": [{"by": "planner"}], "meta": {"capabilities": ["fs.write"], "folders": {
        "out": {"path": "/o", "mode": "ro"}, "papers": {"path": "/elsewhere", "mode": "ro"}}}}
    assert step_folders(claimer, made) == {"out": {"path": "/o", "mode": "ro"}}, \
        "read-only where either is; a name a reload moved elsewhere gives nothing"
    assert step_folders(claimer, {"history": [{"by": "planner"}], "meta": {"capabilities": []}}) == {}
    assert step_folders(claimer, {"history": [{"by": "cli"}]}) == claimer, "a person's task: the claimer's"
    assert step_folders(claimer, {"history": [{"by": "x"}], "meta": {"folders": ["out"]}}) == {}, "malformed"


def test_kanban_create_records_the_folders_of_its_call(folders, tmp_path):
    with Board(tmp_path / "kanban") as board:
        ctx = context(folders, board=None)
        ctx = ToolContext(**{**ctx.__dict__, "board": board, "grants": ("kanban",)})
        said = call(ctx, "kanban_create", title="copy", steps=[{"tool": "write_file", "args": {"path": "out/x",
                                                                                                "content": "x"}}])
        doc = board.get(said.split()[2].rstrip(":"))
        assert doc["meta"]["folders"] == {"papers": {"path": str(folders["papers"]), "mode": "ro"},
                                          "out": {"path": str(folders["out"]), "mode": "rw"}}


# -- hermes.yaml ----------------------------------------------------------------------------------------

def write_config(ws: Path, folders: str, agent: str = "    folders: [docs]\n") -> Path:
    path = ws / "hermes.yaml"
    path.write_text(f"folders:\n{folders}agents:\n  - name: a\n{agent}")
    return path


@pytest.mark.parametrize("folders, agent, message", [
    ("  docs: {path: nowhere}\n", "", ":2: folder docs: nowhere does not exist"),
    ("  docs: {path: file.txt}\n", "", ":2: folder docs: file.txt is not a folder"),
    ("  docs: {path: .}\n", "", ":2: folder docs: . holds this workspace"),
    ("  docs: {path: ..}\n", "", ":2: folder docs: .. holds this workspace"),
    ("  docs: {path: runs}\n", "", ":2: folder docs: runs is in this workspace's runs/"),
    ("  docs: {path: skills}\n", "", ":2: folder docs: skills is in this workspace's skills/"),
    ("  docs: {path: elsewhere/runs/a}\n", "", ":2: folder docs: elsewhere/runs/a is in this workspace's runs/"),
    ("  docs: {path: kanban/todo}\n", "", ":2: folder docs: kanban/todo is in this workspace's kanban/"),
    ("  docs: {path: data, mode: write}\n", "", ":2: folder docs: 'mode' must be one of ro, rw, got 'write'"),
    ("  docs: {path: data, worktree: true}\n", "", ":2: folder docs: worktree: true needs mode: rw"),
    ("  docs: {path: data, mode: rw, worktree: true}\n", "", ":2: folder docs: worktree: true, but data is not a git "
                                                            "repository"),
    ("  docs: {path: data, base: main}\n", "", ":2: folder docs: 'base' is the branch a task's worktree starts"),
    ("  docs: {path: data}\n", "    folders: [code]\n", ":4: agent a: no folder named 'code'"),
])
def test_bad_folders_are_refused_with_file_and_line(tmp_path, folders, agent, message):
    for folder in ("elsewhere/runs/a", "kanban/todo", "data", "skills"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "runs").symlink_to(tmp_path / "elsewhere" / "runs")  # runs/ on another disk
    (tmp_path / "file.txt").write_text("x")
    path = write_config(tmp_path, folders, agent)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}{message}" in str(info.value)


def test_an_agent_gets_only_its_folders_resolved(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    path = tmp_path / "hermes.yaml"
    path.write_text("folders:\n  docs: {path: link, mode: rw}\n  other: {path: other}\n"
                    "defaults:\n  folders: [other]\nagents:\n  - name: a\n    folders: [docs]\n  - name: b\n")
    specs = {spec.name: spec.agent_config()["folders"] for spec in build_specs(load_config(path), tmp_path)}
    assert specs == {"a": {"docs": {"path": str((tmp_path / "data").resolve()), "mode": "rw"}},
                     "b": {"other": {"path": str((tmp_path / "other").resolve()), "mode": "ro"}}}


# -- end to end ------------------------------------------------------------------------------------------

def test_an_agent_reads_a_read_only_folder_and_writes_into_a_read_write_one(tmp_path, up):
    papers, out = tmp_path / "papers", tmp_path / "out"
    papers.mkdir()
    out.mkdir()
    (papers / "a.txt").write_text("the answer is 42\n")
    before = sorted(os.listdir(papers))
    with ScriptedLLM() as llm:
        ws = llm_workspace(tmp_path, llm, "    folders: [papers, out]\n")
        config = (ws / "hermes.yaml").read_text()
        (ws / "hermes.yaml").write_text(f"folders:\n  papers: {{path: {papers}}}\n  out: {{path: {out}, mode: rw}}\n"
                                        + config)
        llm.script("openai",
                   openai_reply(tool_calls=[("read_file", {"path": str(papers / "a.txt")})]),
                   openai_reply(tool_calls=[("write_file", {"path": "papers/a.txt", "content": "overwritten"}),
                                            ("write_file", {"path": "out/summary.md", "content": "42"})]),
                   openai_reply("wrote out/summary.md"))
        board = Board(ws / "kanban")
        task = board.add({"title": "Summarize the papers"})
        up(ws)
        done = wait_until(lambda: (d := board.get(task["id"]))["status"] == "done" and d, timeout=60)
        assert done["result"] == {"answer": "wrote out/summary.md"}
        assert "papers: " in llm.requests[0]["body"]["messages"][0]["content"], "the model is told its folders"
        results = [m["content"] for m in llm.requests[2]["body"]["messages"] if m["role"] == "tool"]
        assert results[0] == "the answer is 42\n"
        assert "granted read-only" in results[1]
        assert (out / "summary.md").read_text() == "42"
        assert (papers / "a.txt").read_text() == "the answer is 42\n" and sorted(os.listdir(papers)) == before
        calls = [json.loads(line) for line in (ws / "runs/thinker/tool_calls.jsonl").read_text().splitlines()]
        assert [c.get("outcome") for c in calls if c.get("status") == "done"] == ["ok", "error", "ok"]


def test_a_file_swapped_for_a_link_out_while_it_is_searched_is_never_read(tmp_path):
    # A granted folder others may write to (a shared folder): a file that is a link to a secret
    # between the listing and the read must not be read through the link.
    import time

    from hermes_sup.agents.search import search

    grant, secret = tmp_path / "grant", tmp_path / "secret.txt"
    grant.mkdir()
    secret.write_text("TOPSECRET\n")
    for i in range(50):
        (grant / f"f{i}").write_text("benign\n")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            for i in range(50):
                try:
                    os.symlink(secret, grant / f".t{i}")
                    os.rename(grant / f".t{i}", grant / f"f{i}")
                    (grant / f".r{i}").write_text("benign\n")
                    os.rename(grant / f".r{i}", grant / f"f{i}")
                except OSError:
                    pass

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        deadline, searches = time.monotonic() + 3, 0
        while time.monotonic() < deadline:
            assert "TOPSECRET" not in search(grant, grant, "TOPSECRET", "*"), f"read through a link ({searches})"
            searches += 1
    finally:
        stop.set()
        swapper.join()
    assert searches > 5


def test_the_bundled_skills_read_files_as_the_file_tools_do(folders):
    # csv_summary opened the file itself: a FIFO under the name blocked the agent for good, and a
    # file swapped for a link after the check was read through it.
    import runpy

    from hermes_sup.agents.tools import collecting

    with collecting() as skill_tools:
        runpy.run_path(str(Path(__file__).resolve().parent.parent / "skills" / "data_tools.py"))
    tools = {tool.name: tool for tool in skill_tools}
    toolbox = Toolbox(grants=CAPABILITIES, extra=tools)
    os.mkfifo(folders["task"] / "data.csv")
    (folders["out"] / "t.csv").write_text("a,b\n1,2\n")
    ctx = context(folders)
    with pytest.raises(ToolError, match="not a regular file"):
        toolbox.call(ctx, "csv_summary", {"path": "data.csv"})
    assert json.loads(toolbox.call(ctx, "csv_summary", {"path": "out/t.csv"}))["rows"] == 1


def test_doctor_lists_each_folder_with_whom_it_is_granted_to(tmp_path):
    from .test_auto_owner import doctor

    ws = tmp_path / "ws"
    data = tmp_path / "data"
    data.mkdir()
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "init", str(ws)], check=True, capture_output=True)
    (ws / "hermes.yaml").write_text(f"folders:\n  data: {{path: {data}, mode: rw}}\n  idle: {{path: {data}}}\n"
                                    "agents:\n  - name: a\n    folders: [data]\n")
    checks = doctor(ws)
    assert checks["folder data"][0]["level"] == "ok" and "granted to a" in checks["folder data"][0]["detail"]
    assert f"{data.resolve()} (rw)" in checks["folder data"][0]["detail"]
    assert checks["folder idle"][0]["level"] == "info" and "granted to no agent" in checks["folder idle"][0]["detail"]
