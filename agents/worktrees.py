"""A git worktree per task for a granted folder with `worktree: true`: made when the task is first
worked (branch `hermes-sup/<task-id>` from the repository's HEAD, or the folder's `base`), kept in
runs/tasks/<task-id>/trees/<name>/ across holders and retries, committed to its branch when the task
is done. The user's checkout (its files, its HEAD) is never touched; git runs here, in the agent,
never in a sandbox, with the repository's hooks off. Each tree's record (repository, branch, the
commit it started from) is runs/tasks/<task-id>/trees/<name>.json, what `task show` and `prune` read.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .taskdir import task_root

TREES = "trees"
BRANCH_PREFIX = "hermes-sup/"
GIT_TIMEOUT = 60.0
# No hook, signing or pager of the user's configuration runs for a commit we make.
SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "core.pager=cat")


class WorktreeError(RuntimeError):
    """git could not give a task its worktree, or commit it; the words say why."""


def branch_of(task_id: str) -> str:
    return BRANCH_PREFIX + task_id


def tree_of(runs: Path, task_id: str, name: str) -> Path:
    """runs/tasks/<task-id>/trees/<name> (pure)."""
    return task_root(runs, task_id) / TREES / name


def attach(folders: Mapping[str, Any], runs: Path, task_id: str) -> dict[str, Any]:
    """The folders of an agent's settings with each worktree folder given this task's tree (pure);
    one that has a tree already (a delegated helper works in its parent's) keeps it."""
    out = {}
    for name, spec in folders.items():
        if isinstance(spec, Mapping) and spec.get("worktree") and not spec.get("tree"):
            spec = {**spec, "tree": str(tree_of(runs, task_id, name))}
        out[name] = spec
    return out


def git(args: list[str], cwd: Path, env: Mapping[str, str] | None = None) -> str:
    """git's output; WorktreeError with its own words when it fails."""
    try:
        done = subprocess.run(["git", *SAFE, *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT,
                              stdin=subprocess.DEVNULL, env={**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorktreeError(f"git {args[0]} in {cwd}: {exc}") from None
    if done.returncode != 0:
        raise WorktreeError(f"git {args[0]} in {cwd}: {(done.stderr or done.stdout).strip()[:400]}")
    return done.stdout


def ensure(repo: Path, tree: Path, task_id: str, base: str | None) -> dict[str, Any]:
    """The task's worktree of `repo` at `tree`, made when missing (its branch too, from `base` or
    the repository's HEAD; an existing branch, a retry's, is checked out again); its record."""
    record_path = tree.with_suffix(".json")
    if (tree / ".git").is_file() and record_path.is_file():
        return json.loads(record_path.read_text())
    tree.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    branch = branch_of(task_id)
    start = git(["rev-parse", "--verify", f"{base or 'HEAD'}^{{commit}}"], repo).strip()
    git(["worktree", "prune"], repo)  # a tree removed by hand is still registered until then
    exists = bool(git(["branch", "--list", branch], repo).strip())
    if exists:
        git(["worktree", "add", "--quiet", str(tree), branch], repo)
    else:
        git(["worktree", "add", "--quiet", "-b", branch, str(tree), start], repo)
    record = {"repo": str(repo), "branch": branch, "base": start}
    tmp = record_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, record_path)
    return record


def commit(tree: Path, message: str, author: str) -> str | None:
    """Commit everything changed in `tree` to its branch as `author`; the new commit, or None when
    nothing changed."""
    who = {"GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": f"{author}@hermes-sup.invalid",
           "GIT_COMMITTER_NAME": author, "GIT_COMMITTER_EMAIL": f"{author}@hermes-sup.invalid"}
    git(["add", "--all"], tree)
    if not git(["status", "--porcelain", "--untracked-files=no"], tree).strip():
        return None
    git(["commit", "--quiet", "--no-verify", "-m", message or "hermes-sup task"], tree, who)
    return git(["rev-parse", "HEAD"], tree).strip()


def records(runs: Path, task_id: str) -> dict[str, dict[str, Any]]:
    """The task's trees by folder name, as recorded when made."""
    found = {}
    folder = task_root(runs, task_id) / TREES
    with contextlib.suppress(OSError):
        for entry in sorted(folder.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                found[entry.stem] = json.loads(entry.read_text())
    return found


def summary(record: Mapping[str, Any], limit: int = 20) -> dict[str, Any]:
    """A tree's branch as `task show` gives it: its commits since it started and their diff stat."""
    repo, branch, base = Path(record["repo"]), str(record["branch"]), str(record["base"])
    try:
        log = git(["log", "--format=%h %s", f"--max-count={limit}", f"{base}..{branch}"], repo).splitlines()
        stat = git(["diff", "--shortstat", base, branch], repo).strip()
    except WorktreeError as exc:
        return {"branch": branch, "error": str(exc)}
    return {"branch": branch, "base": base[:12], "commits": log, "diffstat": stat}
