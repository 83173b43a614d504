"""hermes.yaml's `folders:` (folders of this machine a team may be granted) and each agent's
`folders: [names]`, checked when the file is read: a path that does not exist, is a file, holds the
workspace, or lies in its `runs/`, `kanban/` or `skills/` is refused with its file:line; the paths the
agents get are absolute and resolved (symlinks followed once, here)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...agents.worktrees import WorktreeError, git

NAME_CHARS = 64
# The workspace's own state: an agent granted it would reach every agent's transcripts and the board,
# or edit every agent's skills. The workspace itself holds .env (the keys) and hermes.yaml (the grants).
OWN = ("runs", "kanban", "skills")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def forbidden(where: Path, workspace: Path) -> str:
    """Why a resolved folder may not be given to an agent to write or read, or "": it holds the
    workspace (its .env, hermes.yaml, runs/, kanban/), or lies in runs/, kanban/ or skills/ (as
    written, and where they lead: runs/ may be a link to another disk)."""
    root = workspace.resolve()
    if _inside(root, where):
        return "holds this workspace (its .env, hermes.yaml, runs/ and kanban/), which no agent may be granted"
    own = {path for name in OWN for path in (root / name, (root / name).resolve())}
    for state in sorted(own):
        if _inside(where, state):
            return f"is in this workspace's {state.name}/, which no agent may be granted"
    return ""


def check_folders(raw: dict[str, Any], workspace: Path, fail: Callable[[Any, str], Exception]) -> None:
    """Check `folders:` and every agent's `folders` (and `defaults.folders`), after their schema
    (config/schema.py: the keys, mode, worktree's and base's types): names, paths and worktrees. Each
    folder's `path` is replaced by its resolved absolute path. Raises what `fail` makes, at the line."""
    folders = raw.get("folders")
    if folders is None:
        folders = {}
    for name, spec in folders.items():
        if name == "__line__":
            continue
        if not isinstance(name, str) or not name or len(name) > NAME_CHARS or not all(
                c.isalnum() or c in "-_" for c in name):
            raise fail(folders, f"folder name {name!r} must be 1 to {NAME_CHARS} letters, digits, '-' or '_'")
        path = spec.get("path")
        if not isinstance(path, str) or not path.strip() or "\0" in path:
            raise fail(spec, f"folder {name}: 'path' must be the path of a folder")
        where = (workspace / os.path.expanduser(path)).resolve()
        if not where.exists():
            raise fail(spec, f"folder {name}: {path} does not exist")
        if not where.is_dir():
            raise fail(spec, f"folder {name}: {path} is not a folder")
        problem = forbidden(where, workspace)
        if problem:
            raise fail(spec, f"folder {name}: {path} {problem}")
        spec["path"] = str(where)
        spec.setdefault("mode", "ro")
        _check_worktree(name, spec, path, where, fail)
    trees = [(name, Path(spec["path"])) for name, spec in folders.items()
             if name != "__line__" and spec.get("worktree")]
    for name, spec in folders.items():
        for tree_name, tree in trees:
            if name not in ("__line__", tree_name) and (_inside(Path(spec["path"]), tree)
                                                        or _inside(tree, Path(spec["path"]))):
                raise fail(spec, f"folder {name}: {spec['path']} and the worktree folder {tree_name} ({tree}) are one "
                                 "inside the other; a task's worktree is a folder of its own, so they cannot be")
    check_granted(raw, "folders", folders, "folder", fail)


def check_granted(raw: dict[str, Any], key: str, defined: dict[str, Any], what: str,
                  fail: Callable[[Any, str], Exception]) -> None:
    """Each agent's (and defaults') `key`, a list of names of what hermes.yaml's `key` defines."""
    for node, where_ in [(raw.get("defaults") or {}, "defaults"),
                         *((agent, f"agent {agent.get('name')}") for agent in raw.get("agents") or []
                           if isinstance(agent, dict))]:
        if not isinstance(node, dict) or key not in node:
            continue
        names = node[key]
        if not isinstance(names, list) or not all(isinstance(item, str) for item in names):
            raise fail(node, f"{where_}: '{key}' must be a list of names of {what}s")
        missing = [item for item in names if item not in defined or item == "__line__"]
        if missing:
            known = ", ".join(sorted(k for k in defined if k != "__line__")) or "none"
            raise fail(node, f"{where_}: no {what} named '{missing[0]}' in '{key}' (defined: {known})")


def _check_worktree(name: str, spec: dict[str, Any], path: str, where: Path,
                    fail: Callable[[Any, str], Exception]) -> None:
    """`worktree: true` needs mode rw and the top of a git repository's checkout; `base`, a commit there."""
    if spec.get("base") is not None and not spec.get("worktree"):
        raise fail(spec, f"folder {name}: 'base' is the branch a task's worktree starts from; it needs worktree: true")
    if not spec.get("worktree"):
        return
    if spec["mode"] != "rw":
        raise fail(spec, f"folder {name}: worktree: true needs mode: rw (a task commits its changes to its branch)")
    base = spec.get("base")
    if base is not None and (not isinstance(base, str) or not base.strip() or base.startswith("-")):
        raise fail(spec, f"folder {name}: 'base' must be the name of a branch, tag or commit, got {base!r}")
    try:
        top = Path(git(["rev-parse", "--show-toplevel"], where).strip()).resolve()
    except WorktreeError as exc:
        raise fail(spec, f"folder {name}: worktree: true, but {path} is not a git repository ({exc})") from None
    try:
        git(["rev-parse", "--verify", "--quiet", f"{base or 'HEAD'}^{{commit}}"], where)
    except WorktreeError:
        raise fail(spec, f"folder {name}: worktree: true, but {path} has no commit "
                         f"{base if base is not None else 'yet (HEAD)'} to start a task's branch from") from None
    if top != where:
        raise fail(spec, f"folder {name}: worktree: true needs the top of the repository's checkout ({top}), not "
                         f"{path}")


def not_granted(config: dict[str, Any], defaults: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """The paths of the team's folders this agent is not granted (pure): its commands, skills' calls
    and CLIs have them hidden, wherever they are (one outside the machine's private folders would
    otherwise be readable as the system is)."""
    mine = {spec["path"] for spec in granted(config, defaults, entry).values()}
    return sorted({spec["path"] for name, spec in (config.get("folders") or {}).items()
                   if name != "__line__" and isinstance(spec, dict) and isinstance(spec.get("path"), str)
                   and spec["path"] not in mine})


def granted(config: dict[str, Any], defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The folders an agent is granted, as its settings carry them: {name: {path, mode[, worktree, base]}}
    (pure)."""
    names = entry.get("folders", defaults.get("folders")) or []
    folders = config.get("folders") or {}
    out = {}
    for name in names:
        if name in folders:
            spec = folders[name]
            out[name] = {"path": spec["path"], "mode": spec.get("mode", "ro"),
                         **({"worktree": True, "base": spec.get("base")} if spec.get("worktree") else {})}
    return out
