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
# Nothing of the user's configuration, nor of what a task wrote in its tree, runs for a commit we make:
# no hook, fsmonitor, signing or pager; submodules (a repository a task made inside its tree) not
# looked into.
SAFE = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
        "-c", "commit.gpgsign=false", "-c", "core.pager=cat", "-c", "protocol.file.allow=never",
        "-c", "diff.ignoreSubmodules=all", "-c", "status.submoduleSummary=false")
MAX_WALK = 100_000  # entries looked at for a .git planted in a tree


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
    if tree.is_dir() and record_path.is_file():  # kept: its .git file may be the task's by now, never read
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
    # The tree's own admin folder, read now, when git has just written it: later, the tree's .git
    # file is the task's to rewrite, so git is never again led by it (explicit --git-dir).
    gitdir = (tree / ".git").read_text().removeprefix("gitdir:").strip()
    common = Path(git(["rev-parse", "--git-common-dir"], repo).strip())
    common = (repo / common).resolve() if not common.is_absolute() else common.resolve()
    if Path(gitdir).resolve().parent != common / "worktrees":
        raise WorktreeError(f"git put the worktree's admin folder at {gitdir}, not in {common / 'worktrees'}")
    record = {"repo": str(repo), "branch": branch, "base": start, "gitdir": str(Path(gitdir).resolve())}
    tmp = record_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, record_path)
    return record


def planted(tree: Path) -> str | None:
    """A `.git` below the top of a tree (a repository a task made in it, or a link): its path, else None."""
    seen = 0
    for folder, dirs, files in os.walk(tree):
        seen += len(dirs) + len(files)
        if seen > MAX_WALK:
            return f"more than {MAX_WALK:,} entries (not looked through)"
        if Path(folder) != tree and (".git" in dirs or ".git" in files):
            return str(Path(folder, ".git").relative_to(tree))
        dirs[:] = [d for d in dirs if d != ".git"]
    return None


def commit(tree: Path, record: Mapping[str, Any], message: str, author: str) -> str | None:
    """Commit everything changed in `tree` to its branch (`record`'s) as `author`; the new commit, or
    None when nothing changed. git is told the tree's admin folder, never led by the tree's own .git
    file; a `.git` a task made inside the tree is refused (git would look into it)."""
    inner = planted(tree)
    if inner:
        raise WorktreeError(f"the tree holds a git repository of its own ({inner}); nothing was committed: remove it "
                            "and commit the tree by hand")
    gitdir = Path(str(record["gitdir"]))
    where = ["--git-dir", str(gitdir), "--work-tree", str(tree)]
    if git([*where, "symbolic-ref", "HEAD"], tree).strip() != f"refs/heads/{record['branch']}":
        raise WorktreeError(f"the tree's HEAD is no longer {record['branch']}; nothing was committed")
    who = {"GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": f"{author}@hermes-sup.invalid",
           "GIT_COMMITTER_NAME": author, "GIT_COMMITTER_EMAIL": f"{author}@hermes-sup.invalid"}
    git([*where, "add", "--all"], tree)
    if not git([*where, "status", "--porcelain", "--untracked-files=no", "--ignore-submodules=all"], tree).strip():
        return None
    git([*where, "commit", "--quiet", "--no-verify", "-m", message or "hermes-sup task"], tree, who)
    return git([*where, "rev-parse", "HEAD"], tree).strip()


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
