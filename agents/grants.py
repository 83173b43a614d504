"""Granted folders: which folder a file tool's path names, and whether the call may write there.

An agent's file tools work in its task's folder and in the folders of the user's machine hermes.yaml
grants it (`folders:`, CONTRACT.md section 12). A path names a granted folder by its absolute path
(as Hermes' and Claude Code's file tools take them) or by `NAME/...`; any other relative path is in
the task's folder. Refused: `..` anywhere, `~`, an absolute path outside every grant, a path that
resolves (symlinks followed, at the moment of use) outside the folder it names, a grant whose folder
was swapped for a symlink, and a write into a read-only grant (the innermost grant holding the file,
however it was named). `./NAME/...` is the task folder's own NAME. The supervisor checked each grant's
folder when it read hermes.yaml; the agent gets it resolved, with its mode.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("ro", "rw")


class GrantRefused(ValueError):
    """Why a path may not be used, in words for the model."""


@dataclass(frozen=True)
class Grant:
    name: str
    path: Path  # absolute, resolved by the supervisor
    mode: str   # ro or rw
    tree: Path | None = None  # with `worktree: true`: the task's own worktree, where the path leads

    @property
    def writable(self) -> bool:
        return self.mode == "rw"

    @property
    def root(self) -> Path:
        """Where the grant's files are for this task: its worktree, else the folder itself."""
        return self.tree or self.path


@dataclass(frozen=True)
class Place:
    """Where a path leads: `target`, resolved, inside `root` (the task's folder or a grant's)."""
    root: Path
    target: Path
    grant: Grant | None = None


def grants_of(settings: Mapping[str, Any]) -> tuple[Grant, ...]:
    """The grants in an agent's settings (`folders: {name: {path, mode}}`), longest path first so
    that a grant nested in another is found first; what is not a well-formed grant is left out."""
    found = []
    for name, spec in (settings.get("folders") or {}).items():
        if isinstance(name, str) and isinstance(spec, Mapping) and isinstance(spec.get("path"), str) \
                and os.path.isabs(spec["path"]) and spec.get("mode", "ro") in MODES:
            tree = spec.get("tree")
            found.append(Grant(name, Path(os.path.normpath(spec["path"])), str(spec.get("mode", "ro")),
                               Path(os.path.normpath(tree)) if isinstance(tree, str) and os.path.isabs(tree) else None))
    return tuple(sorted(found, key=lambda grant: (-len(grant.path.parts), grant.name)))


def describe(grants: Sequence[Grant]) -> str:
    """The grants as the model is told of them (pure); empty without any."""
    if not grants:
        return ""
    lines = [f"- {g.name}: {g.path} ({'read-write' if g.writable else 'read-only'})" if g.tree is None else
             f"- {g.name}: {g.path} (read-write): this task works in its own git worktree of it, {g.tree} (the "
             "same files; the terminal finds them there); what you change is committed to its branch when the "
             "task is done" for g in sorted(grants, key=lambda g: g.name)]
    return ("Folders of the user's machine granted to you, reached by their absolute paths or as NAME/... "
            "(other relative paths are in your task's folder):\n" + "\n".join(lines))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _owner(path: str, task_root: Path, grants: Sequence[Grant]) -> tuple[Path, Grant | None, str]:
    """(root, grant, path within it) for a path, before any symlink is followed."""
    if os.path.isabs(path):
        normal = Path(os.path.normpath(path))
        for grant in grants:
            for named in (grant.path, grant.tree):
                if named is not None and _inside(normal, named):
                    return grant.root, grant, str(normal.relative_to(named))
        if not grants:
            raise GrantRefused(f"absolute paths are refused: {path} (paths are relative to your folder)")
        raise GrantRefused(f"refused: {path} is outside your task's folder and every folder granted to you "
                           f"({', '.join(f'{g.name}: {g.path}' for g in sorted(grants, key=lambda g: g.name))})")
    first, _, rest = path.partition("/")
    for grant in grants:
        if grant.name == first:
            return grant.root, grant, rest or "."
    return task_root, None, path


def place(path: object, task_root: Path, grants: Sequence[Grant], *, write: bool = False,
          allow_root: bool = False) -> Place:
    """Where `path` leads, checked (see the module's docstring); GrantRefused says why not.
    `task_root` is the task's folder, resolved; `allow_root`: the folder itself may be named (a
    search's base, a command's workdir)."""
    if not isinstance(path, str) or not path:
        raise GrantRefused("path must be a non-empty string")
    if path.startswith("~"):
        raise GrantRefused(f"'~' is refused in paths: {path} (give the absolute path)")
    if ".." in Path(path).parts:
        raise GrantRefused(f"'..' is refused in paths: {path}")
    root, grant, inner = _owner(path, task_root, grants)
    if grant is not None:
        if root.is_symlink() or root.resolve() != root:
            raise GrantRefused(f"refused: the granted folder {grant.name} ({root}) is now a symlink or under "
                               "one; it is not used")
        if write and not grant.writable:
            raise GrantRefused(f"refused: {path} is in {grant.name}, which is granted read-only")
    try:
        target = (root / inner).resolve()
    except OSError as exc:  # a link swapped while resolved, or a loop: nothing is read through it
        raise GrantRefused(f"refused: {path} could not be resolved ({exc.strerror})") from None
    if target == root and not allow_root:
        raise GrantRefused(f"{path} is {'the granted folder ' + grant.name if grant else 'your folder'} itself, "
                           "not a file in it")
    if not _inside(target, root):
        where = f"the granted folder {grant.name}" if grant else "your folder"
        raise GrantRefused(f"refused: {path} leads outside {where} (a symlink to {target})")
    # The mode is that of the innermost grant holding the file, however it was named: an ro grant
    # inside an rw one is not written by way of the outer one's name or a symlink into it.
    innermost = next((g for g in grants if _inside(target, g.root)), None)
    if write and innermost is not None and not innermost.writable:
        raise GrantRefused(f"refused: {path} is in {innermost.name}, which is granted read-only")
    return Place(root, target, grant)
