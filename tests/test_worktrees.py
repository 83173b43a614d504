"""A git worktree per task (agents/worktrees.py): made at claim on branch hermes-sup/<task-id>, where
the task's tools see the granted folder, kept across holders, committed at done; the user's checkout
is never touched. Real git, real agents, real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from hermes_sup.agents import (
    builtins,  # noqa: F401 - registers the built-in tools
    worktrees,
)
from hermes_sup.agents.tools import Toolbox, ToolContext
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import CLI, ROOT, init_workspace, wait_until

IDENTITY = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@x"}


def sh_git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **IDENTITY}).stdout


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    sh_git(path, "init", "-q", "-b", "main")
    (path / "shared.txt").write_text("original\n")
    sh_git(path, "add", "shared.txt")
    sh_git(path, "commit", "-q", "-m", "first")
    (path / "untracked-of-the-user.txt").write_text("the user's own work in progress\n")
    return path


def checkout_state(repo: Path) -> tuple[str, str, str, str]:
    return (sh_git(repo, "rev-parse", "HEAD"), sh_git(repo, "symbolic-ref", "HEAD"),
            (repo / "shared.txt").read_text(), sh_git(repo, "status", "--porcelain"))


def test_a_task_gets_its_own_tree_and_branch_kept_and_committed(tmp_path):
    repo = make_repo(tmp_path / "app")
    before = checkout_state(repo)
    runs = tmp_path / "runs"
    tree = worktrees.tree_of(runs, "t-1", "app")
    record = worktrees.ensure(repo, tree, "t-1", None)
    assert record == {"repo": str(repo), "branch": "hermes-sup/t-1", "base": before[0].strip(),
                      "gitdir": str((repo / ".git" / "worktrees" / "app").resolve())}
    (tree / "shared.txt").write_text("changed by the task\n")
    (tree / "new.txt").write_text("new\n")
    assert worktrees.ensure(repo, tree, "t-1", None) == record, "kept: the same tree, its changes in place"
    assert (tree / "shared.txt").read_text() == "changed by the task\n"
    commit = worktrees.commit(tree, record, "Edit the shared file", "coder")
    assert commit and worktrees.commit(tree, record, "again", "coder") is None, "nothing left to commit"
    shown = worktrees.summary(record)
    assert shown["commits"] == [f"{commit[:7]} Edit the shared file"] and "2 files changed" in shown["diffstat"]
    assert sh_git(repo, "log", "-1", "--format=%an %s", "hermes-sup/t-1").strip() == "coder Edit the shared file"
    assert checkout_state(repo) == before, "the user's checkout: same HEAD, branch, files, status"
    # Removed by hand (a prune), the tree comes back on its branch, commits and all.
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    worktrees.ensure(repo, tree, "t-1", None)
    assert (tree / "new.txt").read_text() == "new\n"


def test_a_base_starts_the_branch_there(tmp_path):
    repo = make_repo(tmp_path / "app")
    sh_git(repo, "checkout", "-q", "-b", "dev")
    (repo / "dev.txt").write_text("dev\n")
    sh_git(repo, "add", "dev.txt")
    sh_git(repo, "commit", "-q", "-m", "on dev")
    tree = worktrees.tree_of(tmp_path / "runs", "t-2", "app")
    worktrees.ensure(repo, tree, "t-2", "main")
    assert not (tree / "dev.txt").exists() and (tree / "shared.txt").exists()


def tree_context(tmp_path: Path, repo: Path, mode: str = "auto") -> ToolContext:
    ws = tmp_path / "ws"
    scratch = ws / "runs" / "tasks" / "t-3" / "work"
    scratch.mkdir(parents=True)
    tree = worktrees.tree_of(ws / "runs", "t-3", "app")
    worktrees.ensure(repo, tree, "t-3", None)
    folders = {"app": {"path": str(repo), "mode": "rw", "worktree": True, "tree": str(tree)}}
    return ToolContext(scratch=scratch, stop=threading.Event(), settings={"folders": folders, "sandbox": mode},
                       grants=("fs.read", "fs.write", "shell"), workspace=ws)


def test_the_file_tools_and_the_terminal_see_the_tree_where_the_folder_is_named(tmp_path):
    repo = make_repo(tmp_path / "app")
    before = checkout_state(repo)
    ctx = tree_context(tmp_path, repo)
    tree = Path(ctx.settings["folders"]["app"]["tree"])
    box = Toolbox(grants=ctx.grants)
    box.call(ctx, "write_file", {"path": f"{repo}/shared.txt", "content": "by absolute path\n"})
    box.call(ctx, "write_file", {"path": "app/by-name.txt", "content": "by name\n"})
    assert (tree / "shared.txt").read_text() == "by absolute path\n" and (tree / "by-name.txt").exists()
    out = box.call(ctx, "terminal", {"command": f"cd {tree} && git status --short && echo x >> shared.txt && "
                                                f"git commit -qam sneaky; echo rc=$?; echo y > {repo}/shared.txt"})
    assert " M shared.txt" in out and "?? by-name.txt" in out, "git reads the repository's .git"
    assert "rc=0" not in out, "a command cannot commit: the repository's .git is read-only to it"
    assert (tree / "shared.txt").read_text() == "by absolute path\nx\n"
    assert checkout_state(repo) == before, "neither the file tools nor a command reached the checkout"


def test_folders_with_worktree_are_checked(tmp_path):
    repo = make_repo(tmp_path / "app")
    (tmp_path / "app" / "sub").mkdir()
    (tmp_path / "plain").mkdir()
    cases = {
        f"  app: {{path: {repo}/sub, mode: rw, worktree: true}}\n": "needs the top of the repository's checkout",
        f"  app: {{path: {repo}, mode: rw, worktree: true, base: nowhere}}\n": "has no commit nowhere",
        f"  app: {{path: {repo}, mode: rw, worktree: yes-please}}\n": "'worktree' must be true or false",
        f"  app: {{path: {repo}, mode: rw, worktree: true}}\n  inner: {{path: {repo}/sub}}\n": "one inside the other",
    }
    for folders, message in cases.items():
        path = tmp_path / "hermes.yaml"
        path.write_text(f"folders:\n{folders}agents:\n  - name: a\n    folders: [app]\n")
        with pytest.raises(ConfigError, match=message):
            load_config(path)
    path.write_text(f"folders:\n  app: {{path: {repo}, mode: rw, worktree: true, base: main}}\n"
                    "agents:\n  - name: a\n    folders: [app]\n")
    assert load_config(path)["folders"]["app"]["worktree"] is True


# -- end to end ---------------------------------------------------------------------------------------

def test_two_agents_edit_the_same_file_on_two_branches_and_a_killed_holders_task_ends_in_its_tree(tmp_path, up):
    repo = make_repo(tmp_path / "app")
    gate = tmp_path / "gate"
    gate.mkdir()
    before = checkout_state(repo)
    ws = tmp_path / "ws"
    init_workspace(ws)
    agent = "  - name: {}\n    capabilities: [fs.read, fs.write, shell]\n    folders: [app, gate]\n"
    (ws / "hermes.yaml").write_text(
        f"folders:\n  app: {{path: {repo}, mode: rw, worktree: true}}\n  gate: {{path: {gate}}}\n"
        "defaults:\n  stop_timeout: 5\n  heartbeat_timeout: 30\n"
        f"agents:\n{agent.format('one')}{agent.format('two')}")
    board = Board(ws / "kanban")

    def edit(text: str, go: str) -> list[dict]:  # each holds until the test lets it go
        return [{"tool": "write_file", "args": {"path": "app/shared.txt", "content": text}},
                {"tool": "terminal", "args": {"command": f"until [ -e {gate}/{go} ]; do sleep 0.02; done"}}]

    first = board.add({"title": "Say one", "steps": edit("one\n", "go")})
    second = board.add({"title": "Say two", "steps": edit("two\n", "go")})
    up(ws)
    trees = {t["id"]: worktrees.tree_of(ws / "runs", t["id"], "app") for t in (first, second)}
    wait_until(lambda: all((tree / "shared.txt").exists() and (tree / "shared.txt").read_text() in ("one\n", "two\n")
                           for tree in trees.values()), timeout=60)
    assert {board.get(t)["status"] for t in trees} == {"doing"}, "both in their trees at once"
    (gate / "go").write_text("")
    for task_id in trees:
        done = wait_until(lambda t=task_id: (d := board.get(t))["status"] in ("done", "failed") and d, timeout=60)
        assert done["status"] == "done", done.get("error")
    for task, text in ((first, "one\n"), (second, "two\n")):
        branch = f"hermes-sup/{task['id']}"
        assert sh_git(repo, "show", f"{branch}:shared.txt") == text
        assert sh_git(repo, "log", "-1", "--format=%s", branch).strip() == task["title"]
    assert checkout_state(repo) == before, "the user's checkout is untouched"
    shown = json.loads(subprocess.run([*CLI, "-w", str(ws), "task", "show", first["id"], "--json"], cwd=ROOT,
                                      capture_output=True, text=True, check=True).stdout)["worktrees"]["app"]
    assert shown["branch"] == f"hermes-sup/{first['id']}" and shown["commits"][0].endswith(" Say one")
    assert shown["diffstat"] == "1 file changed, 1 insertion(+), 1 deletion(-)"
    from hermes_sup.supervisor.config.workspace import Workspace
    from hermes_sup.supervisor.dashboard.views import task_document

    assert task_document(board, Workspace(ws), first["id"])["worktrees"]["app"] == shown, "the dashboard's too"
    text = subprocess.run([*CLI, "-w", str(ws), "task", "show", first["id"]], cwd=ROOT, capture_output=True,
                          text=True, check=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert f"branch hermes-sup/{first['id']} from" in text and "1 commit(s)" in text

    # A holder SIGKILLed between its steps: the task is finished in the same tree, step 1 not run again.
    killed = board.add({"title": "Survive a kill", "steps": [
        {"tool": "write_file", "args": {"path": "app/before.txt", "content": "before the kill\n"}},
        {"tool": "wait", "args": {"seconds": 2}},
        {"tool": "write_file", "args": {"path": "app/after.txt", "content": "after the kill\n"}}]})
    tree = worktrees.tree_of(ws / "runs", killed["id"], "app")
    holder = wait_until(lambda: (tree / "before.txt").exists() and board.get(killed["id"])["claim"], timeout=60)
    os.kill(holder["pid"], signal.SIGKILL)
    done = wait_until(lambda: (d := board.get(killed["id"]))["status"] in ("done", "failed", "blocked") and d,
                      timeout=120)
    assert done["status"] == "done", done.get("error")
    branch = f"hermes-sup/{killed['id']}"
    assert sh_git(repo, "show", f"{branch}:before.txt") == "before the kill\n"
    assert sh_git(repo, "show", f"{branch}:after.txt") == "after the kill\n"
    logs = [json.loads(line) for name in ("one", "two") if (ws / "runs" / name / "tool_calls.jsonl").exists()
            for line in (ws / "runs" / name / "tool_calls.jsonl").read_text().splitlines()]
    writes = {r["at"] for r in logs if r["task"] == killed["id"] and r["call_id"] == "step-1" and r["status"] == "done"}
    assert len(writes) == 1, "step 1 ran once; its file was found in the same tree"
    claims = [h for h in done["history"] if h.get("to") == "doing"]
    assert len(claims) == 2 and any(f"pid {holder['pid']}) is gone" in str(h.get("note")) for h in done["history"]), \
        "the killed holder's task was taken again and finished"
    assert checkout_state(repo) == before


def test_a_worktree_that_cannot_be_made_fails_the_task_with_the_reason(tmp_path):
    with pytest.raises(worktrees.WorktreeError, match="rev-parse"):
        worktrees.ensure(tmp_path, tmp_path / "runs" / "tasks" / "t-9" / "trees" / "app", "t-9", None)


def test_prune_removes_a_finished_tasks_tree_and_keeps_its_branch(tmp_path):
    from hermes_sup.supervisor.upkeep.prune import prune

    repo = make_repo(tmp_path / "app")
    runs = tmp_path / "ws" / "runs"
    board = Board(tmp_path / "ws" / "kanban")
    task = board.add({"title": "edit", "steps": []})
    board.cancel(task["id"])
    tree = worktrees.tree_of(runs, task["id"], "app")
    record = worktrees.ensure(repo, tree, task["id"], None)
    (tree / "x.txt").write_text("x\n")
    worktrees.commit(tree, record, "edit", "coder")
    assert str(tree) in sh_git(repo, "worktree", "list")
    result = prune(runs, board, 0)
    assert result.tasks[0]["branches_kept"] == [f"hermes-sup/{task['id']}"]
    assert not tree.exists() and str(tree) not in sh_git(repo, "worktree", "list"), "git forgot the tree"
    assert sh_git(repo, "show", f"hermes-sup/{task['id']}:x.txt") == "x\n", "the branch and its commit stay"


def test_what_a_task_writes_in_its_tree_never_runs_nor_moves_another_branch_at_commit(tmp_path):
    # An attacker's review: the tree is the task's, its .git file included. Led by it, the agent's
    # commit ran a planted fsmonitor command, and a planted commondir moved the user's main.
    repo = make_repo(tmp_path / "app")
    main_before = sh_git(repo, "rev-parse", "main")
    pwned = tmp_path / "PWNED"
    runs = tmp_path / "runs"

    def tree_with(task: str) -> tuple[Path, dict]:
        tree = worktrees.tree_of(runs, task, "app")
        return tree, worktrees.ensure(repo, tree, task, None)

    tree, record = tree_with("t-a")  # .git rewritten to a repository whose config runs a command
    evil = tree / "evil"
    sh_git(tree, "init", "-q", str(evil))
    sh_git(evil, "config", "core.fsmonitor", f"touch {pwned}")
    (tree / ".git").write_text(f"gitdir: {evil}/.git\n")
    (tree / "work.txt").write_text("done\n")
    (evil / ".git").rename(tree / "evil.git")  # not a repository inside the tree any more: committed
    (tree / ".git").write_text(f"gitdir: {tree / 'evil.git'}\n")
    assert worktrees.commit(tree, record, "a", "coder")
    assert sh_git(repo, "show", "hermes-sup/t-a:work.txt") == "done\n"

    tree, record = tree_with("t-b")  # the user's main as the tree's HEAD, by a commondir of its own
    (tree / ".x").mkdir()
    (tree / ".x" / "commondir").write_text(f"{repo / '.git'}\n")
    (tree / ".x" / "HEAD").write_text("ref: refs/heads/main\n")
    (tree / ".git").write_text(f"gitdir: {tree / '.x'}\n")
    (tree / "f").write_text("evil\n")
    worktrees.commit(tree, record, "b", "coder")

    tree, record = tree_with("t-c")  # a repository made inside the tree, its config running a command
    sub = tree / "sub"
    sh_git(tree, "init", "-q", str(sub))
    sh_git(sub, "config", "core.fsmonitor", f"touch {pwned}")
    (sub / "x").write_text("x\n")
    with pytest.raises(worktrees.WorktreeError, match=r"a git repository of its own \(sub/.git\)"):
        worktrees.commit(tree, record, "c", "coder")

    assert not pwned.exists(), "nothing a task wrote ran in the agent"
    assert sh_git(repo, "rev-parse", "main") == main_before, "the user's main did not move"


def test_the_users_hooks_and_fsmonitor_never_run_for_a_tasks_commit_and_its_branch_must_hold(tmp_path):
    repo = make_repo(tmp_path / "app")
    ran = tmp_path / "RAN"
    hook = repo / ".git" / "hooks" / "post-commit"
    hook.write_text(f"#!/bin/sh\ntouch {ran}.hook\n")
    hook.chmod(0o755)
    sh_git(repo, "config", "core.fsmonitor", f"touch {ran}.fsmonitor; true")
    tree = worktrees.tree_of(tmp_path / "runs", "t-h", "app")
    record = worktrees.ensure(repo, tree, "t-h", None)
    (tree / "x.txt").write_text("x\n")
    assert worktrees.commit(tree, record, "x", "coder")
    assert not list(tmp_path.glob("RAN*")), "neither the user's hook nor their fsmonitor ran"
    (tree / "sub").mkdir()
    (tree / "sub" / ".git").write_text("gitdir: /elsewhere\n")
    with pytest.raises(worktrees.WorktreeError, match=r"of its own \(sub/.git\)"):
        worktrees.commit(tree, record, "y", "coder")
    (tree / "sub" / ".git").unlink()
    subprocess.run(["git", "--git-dir", record["gitdir"], "--work-tree", str(tree), "checkout", "-q", "-b", "other"],
                   check=True, cwd=tree)
    (tree / "y.txt").write_text("y\n")
    with pytest.raises(worktrees.WorktreeError, match="HEAD is no longer hermes-sup/t-h"):
        worktrees.commit(tree, record, "y", "coder")


def test_a_trees_own_path_leads_into_it_and_a_worktree_must_be_read_write(tmp_path):
    repo = make_repo(tmp_path / "app")
    ctx = tree_context(tmp_path, repo)
    tree = Path(ctx.settings["folders"]["app"]["tree"])
    Toolbox(grants=ctx.grants).call(ctx, "write_file", {"path": f"{tree}/by-tree-path.txt", "content": "t\n"})
    assert (tree / "by-tree-path.txt").read_text() == "t\n"
    path = tmp_path / "hermes.yaml"
    path.write_text(f"folders:\n  app: {{path: {repo}, worktree: true}}\nagents:\n  - name: a\n    folders: [app]\n")
    with pytest.raises(ConfigError, match="worktree: true needs mode: rw"):
        load_config(path)


def test_an_mcp_server_gets_a_worktree_repository_read_only(tmp_path):
    from hermes_sup.agents.worker import Agent

    repo = make_repo(tmp_path / "app")
    ws = tmp_path / "ws"
    init_workspace(ws)
    folders = {"app": {"path": str(repo), "mode": "rw", "worktree": True, "base": None}}
    agent = Agent({"name": "a", "folders": folders, "capabilities": ["shell"], "sandbox": "bubblewrap"}, ws,
                  ws / "runs" / "a")
    try:
        argv, _ = agent._mcp_command("git", {"command": "true"})
    finally:
        agent.board.close()
    binds = [(argv[i], argv[i + 1]) for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert ("--ro-bind", str(repo)) in binds and ("--bind", str(repo)) not in binds, binds
