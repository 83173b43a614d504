"""Where the skills are: the folders walked for Python skills and SKILL.md files, kept until one of them changes."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

SKILL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_DEPTH = 8  # folders below skills/ looked into for a SKILL.md
SUPPORT_FOLDERS = {"references", "templates", "assets", "scripts"}
NOT_SKILLS = {"node_modules", "venv", "site-packages"}
# A folder's times are the kernel's coarse clock: two changes within one of its ticks can leave the
# same times, so a walk is trusted only while the folders it saw last changed this long before it.
SETTLED_NS = 1_000_000_000
wall_ns = time.time_ns  # the clock the kernel stamps folders with (a test moves it on)

Found = dict[str, tuple[str, Path, str, str]]  # name: (kind, path, source, category)


def file_signature(path: Path | str) -> tuple[int, ...] | None:
    """What tells a file or folder changed: its inode, size, mtime and ctime (which no one can set)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def instruction_folders(root: Path, walked: list[str] | None = None) -> list[tuple[str, ...]]:
    """The folders under `root` that hold a SKILL.md, as path parts, at any depth up to MAX_DEPTH:
    never through a symlink, nor into hidden or `_` folders (.git, .hub, .archive, .history,
    __pycache__), nor into a skill's own references/, templates/, assets/ or scripts/ (Hermes'
    support folders may hold archived SKILL.md files that are no skills). Each folder looked into
    is added to `walked`."""
    found: list[tuple[str, ...]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if walked is not None:
            walked.append(dirpath)
        parts = Path(dirpath).relative_to(root).parts
        holds = "SKILL.md" in filenames and bool(parts)
        if holds:
            found.append(parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")) and d not in NOT_SKILLS
                             and not (holds and d in SUPPORT_FOLDERS) and len(parts) < MAX_DEPTH)
    return found


def find(bundled: Path, folder: Path, walked: list[str]) -> Found:
    """The skills of the bundled folder and the workspace's (whose wins a name), by file and folder
    names alone; each folder whose entries decided it is added to `walked`."""
    found: Found = {}
    for source, root in (("bundled", bundled), ("workspace", folder)):  # workspace wins
        walked.append(str(root))
        if root.is_symlink():  # a skills/ that is a link: the folder it names is what changes
            walked.append(os.path.realpath(root))
        if not root.is_dir() or (source == "workspace" and root.resolve() == bundled.resolve()):
            continue  # the repository's own workspace: its skills/ is the bundled one
        for entry in sorted(root.iterdir()):
            if not entry.name.startswith((".", "_")) and entry.suffix == ".py" and entry.is_file() \
                    and SKILL_NAME.fullmatch(entry.stem):
                found[entry.stem] = ("python", entry, source, "")
        # Instruction skills at any depth, as Hermes finds them (mlops/inference/llama-cpp): the
        # shallowest of a name wins, then the first by path.
        for relative in sorted(instruction_folders(root, walked), key=lambda parts: (len(parts), parts)):
            if relative[-1] in found and found[relative[-1]][2] == source:
                continue
            found[relative[-1]] = ("instructions", root.joinpath(*relative) / "SKILL.md", source,
                                   relative[0] if len(relative) > 1 else "")
    return found


class Finder:
    """The skills found in two folders, walked again only when a folder it walked has changed (an
    entry added, removed or renamed changes the folder's times): each task's toolbox listed every
    skills folder and its subfolders, about forty system calls a task."""

    def __init__(self, bundled: Path, folder: Path) -> None:
        self.bundled = bundled
        self.folder = folder
        self._kept: tuple[dict[str, tuple[int, ...] | None], int, Found] | None = None

    def found(self) -> Found:
        if self._kept is not None:
            signatures, walked_at, found = self._kept
            if all(_unchanged(file_signature(path), known, walked_at) for path, known in signatures.items()):
                return dict(found)
        walked: list[str] = []
        walked_at = wall_ns()
        # Each folder's signature is taken after the walk, which a change during it leaves
        # unsettled (its ctime within a second of walked_at): walked again next time.
        found = find(self.bundled, self.folder, walked)
        self._kept = ({path: file_signature(path) for path in walked}, walked_at, found)
        return dict(found)


def _unchanged(now: tuple[int, ...] | None, known: tuple[int, ...] | None, walked_at: int) -> bool:
    """Whether a folder is as it was at a walk (pure): the same signature, set a second before."""
    if now != known:
        return False
    return now is None or walked_at - now[3] >= SETTLED_NS
