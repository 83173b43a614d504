"""skill_manage on instruction skills (a folder with a SKILL.md), with Hermes Agent's actions and
arguments: create (with a category), edit, patch (SKILL.md or a file beside it), delete, write_file
and remove_file, each checked as Hermes checks it, and rollback, ours.

Only the workspace's skills/ is written (a bundled skill is the repository's, never changed). Every
change first keeps the skill's whole folder as it was, as version N under
`skills/.history/instructions/<name>/N/`, with `log.jsonl` beside the versions saying who, when and
why, so a rollback (itself kept) brings any version back and a delete is undone by one. Paths are
the skill's own: no `..`, nothing outside references/, templates/, scripts/ or assets/ but SKILL.md,
never through a link.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from ..kanban.fsio import write_atomic
from ..kanban.parse import PlainYamlError, load_plain
from ..kanban.task import now_iso
from .tools import ToolError

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # Hermes' VALID_NAME_RE, with its 64-character bound
MAX_CONTENT = 100_000        # characters of a SKILL.md, as Hermes allows an agent to write
MAX_FILE = 1 << 20           # bytes of a file beside it
MAX_DESCRIPTION = 1024
SUPPORT = ("references", "templates", "scripts", "assets")
HISTORY = Path(".history") / "instructions"


def frontmatter_problem(content: str) -> str:
    """Why `content` is no SKILL.md Hermes would take, or "" (pure)."""
    if not content.strip():
        return "content cannot be empty"
    if len(content) > MAX_CONTENT:
        return f"SKILL.md is {len(content):,} characters, over {MAX_CONTENT:,}"
    text = content.lstrip("\ufeff")
    if not text.startswith("---"):
        return "SKILL.md must start with YAML front matter (---), with name and description"
    end = re.search(r"\n---\s*\n", text[3:])
    if end is None:
        return "SKILL.md's front matter is not closed: end it with a line of ---"
    try:
        meta = load_plain(text[3:end.start() + 3], "SKILL.md")
    except PlainYamlError as exc:
        return f"SKILL.md's front matter is not valid YAML: {exc.problem}"
    if not isinstance(meta, dict):
        return "SKILL.md's front matter must be a mapping (name: ..., description: ...)"
    for key in ("name", "description"):
        if key not in meta:
            return f"SKILL.md's front matter must include '{key}'"
    if len(str(meta["description"])) > MAX_DESCRIPTION:
        return f"the description is over {MAX_DESCRIPTION} characters"
    if not text[end.end() + 3:].strip():
        return "SKILL.md needs instructions after its front matter"
    return ""


def path_problem(file_path: Any) -> str:
    """Why `file_path` names no file a skill may have written or removed, or "" (pure): SKILL.md (or
    NAME/SKILL.md), or a file under references/, templates/, scripts/ or assets/."""
    if not isinstance(file_path, str) or not file_path.strip() or "\0" in file_path:
        return "file_path must name a file in the skill's folder"
    parts = Path(file_path).parts
    if os.path.isabs(file_path) or ".." in parts or any(part.startswith("~") for part in parts[:1]):
        return f"file_path {file_path!r} must stay in the skill's folder (no absolute path, no ..)"
    if parts[-1] == "SKILL.md" and len(parts) <= 2:
        return ""
    if parts[0] not in SUPPORT or len(parts) < 2:
        return f"file_path must be SKILL.md or under one of {', '.join(SUPPORT)}, got {file_path!r}"
    return ""


class InstructionSkills:
    """The workspace's instruction skills, as skill_manage changes them (`catalog`: the Skills that
    finds them; `root`: the workspace's skills/)."""

    def __init__(self, root: Path, find: Any) -> None:
        self.root, self.find = root, find

    # -- where ------------------------------------------------------------------------------------

    def folder_of(self, name: str) -> Path | None:
        """The folder of the workspace's instruction skill `name`, or None (a bundled one is refused)."""
        kind, path, source = self.find(name) or (None, None, None)
        if kind != "instructions":
            return None
        if source != "workspace":
            raise ToolError(f"skill {name} is bundled with hermes-sup and is not changed here: create one of "
                            "another name (skill_view shows its text)")
        return Path(path).parent

    def _existing(self, name: str) -> Path:
        folder = self.folder_of(_checked(name))
        if folder is None:
            raise ToolError(f"no instruction skill named {name!r} in this workspace's skills/")
        return folder

    def _target(self, folder: Path, file_path: str) -> Path:
        """The file `file_path` names in the skill's folder, every folder on the way a real folder
        (never a link), made when missing."""
        problem = path_problem(file_path)
        if problem:
            raise ToolError(problem)
        parts = Path(file_path).parts
        parts = parts[1:] if len(parts) == 2 and parts[-1] == "SKILL.md" else parts
        here = folder
        for part in parts[:-1]:
            here = here / part
            if here.is_symlink() or (here.exists() and not here.is_dir()):
                raise ToolError(f"{file_path}: {part} is not a folder of the skill's own")
            here.mkdir(exist_ok=True)
        target = here / parts[-1]
        if target.is_symlink() or (target.exists() and not stat.S_ISREG(target.lstat().st_mode)):
            raise ToolError(f"{file_path} is not a regular file of the skill's own")
        return target

    # -- the actions ------------------------------------------------------------------------------

    def create(self, name: str, content: str, category: str | None, *, by: str) -> str:
        _checked(name)
        if self.find(name) is not None:
            raise ToolError(f"a skill named {name} exists; edit or patch it instead")
        problem = frontmatter_problem(content)
        if problem:
            raise ToolError(f"skill {name} was not created: {problem}")
        parent = self.root
        if category is not None and category.strip():
            parent = self.root / _checked(category.strip(), "category")
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                raise ToolError(f"category {category} is not a folder of skills/")
        folder = parent / name
        folder.mkdir(parents=True)
        write_atomic(folder / "SKILL.md", content.encode("utf-8"))
        self._log(name, None, by, "created")
        return f"created instruction skill {name}" + (f" in {category}" if parent != self.root else "")

    def edit(self, name: str, content: str, *, by: str) -> str:
        folder = self._existing(name)
        problem = frontmatter_problem(content)
        if problem:
            raise ToolError(f"skill {name} was not changed: {problem}")
        version = self._keep(name, folder, by, "edited")
        write_atomic(folder / "SKILL.md", content.encode("utf-8"))
        return f"edited skill {name} (the previous text is version {version})"

    def patch(self, name: str, old: str, new: str, file_path: str | None, replace_all: bool, *, by: str) -> str:
        folder = self._existing(name)
        target = self._target(folder, file_path or "SKILL.md")
        text = target.read_text(encoding="utf-8")
        count = text.count(old) if old else 0
        if count == 0 or (count > 1 and not replace_all):
            raise ToolError(f"old_string must occur exactly once in {file_path or 'SKILL.md'} (it occurs {count} "
                            "times; replace_all: true replaces every one)")
        changed = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        if target.name == "SKILL.md" and target.parent == folder:
            problem = frontmatter_problem(changed)
            if problem:
                raise ToolError(f"skill {name} was not changed: the patched SKILL.md: {problem}")
        elif len(changed.encode("utf-8")) > MAX_FILE:
            raise ToolError(f"the patched file would be over {MAX_FILE:,} bytes")
        version = self._keep(name, folder, by, f"patched {file_path or 'SKILL.md'}")
        write_atomic(target, changed.encode("utf-8"))
        return f"patched {file_path or 'SKILL.md'} of skill {name} ({count if replace_all else 1} place(s); " \
               f"the previous version is {version})"

    def write_file(self, name: str, file_path: str, content: str, *, by: str) -> str:
        folder = self._existing(name)
        target = self._target(folder, file_path)
        if target.name == "SKILL.md" and target.parent == folder:
            return self.edit(name, content, by=by)
        if len(content.encode("utf-8")) > MAX_FILE:
            raise ToolError(f"{file_path} would be over {MAX_FILE:,} bytes")
        version = self._keep(name, folder, by, f"wrote {file_path}")
        write_atomic(target, content.encode("utf-8"))
        return f"wrote {file_path} in skill {name} (the previous version is {version})"

    def remove_file(self, name: str, file_path: str, *, by: str) -> str:
        folder = self._existing(name)
        target = self._target(folder, file_path)
        if target.name == "SKILL.md" and target.parent == folder:
            raise ToolError("SKILL.md is the skill itself: delete the skill instead")
        if not target.exists():
            raise ToolError(f"skill {name} has no file {file_path}")
        version = self._keep(name, folder, by, f"removed {file_path}")
        target.unlink()
        return f"removed {file_path} from skill {name} (version {version} keeps it)"

    def delete(self, name: str, absorbed_into: str | None, *, by: str) -> str:
        folder = self._existing(name)
        if absorbed_into and self.find(absorbed_into) is None:
            raise ToolError(f"absorbed_into names no skill: {absorbed_into}")
        note = "deleted" + (f" (absorbed into {absorbed_into})" if absorbed_into else "")
        version = self._keep(name, folder, by, note)
        shutil.rmtree(folder)
        return f"deleted skill {name} (version {version} keeps it: rollback brings it back)"

    def rollback(self, name: str, version: int | None, *, by: str) -> str:
        history = self._history(_checked(name))
        kept = sorted(int(p.name) for p in history.iterdir() if p.name.isdigit()) if history.is_dir() else []
        if not kept:
            raise ToolError(f"skill {name} has no earlier version to roll back to")
        chosen = kept[-1] if version is None else version
        if chosen not in kept:
            raise ToolError(f"skill {name} has no version {chosen}; kept: {', '.join(map(str, kept))}")
        record = next((r for r in reversed(self.log(name)) if r.get("version") == chosen), {})
        relative = record.get("folder")
        parts = Path(relative).parts if isinstance(relative, str) else ()
        if not (1 <= len(parts) <= 2 and parts[-1] == name and all(NAME.fullmatch(p) for p in parts)):
            parts = (name,)  # where it was, as the log says; a log that says otherwise is not followed
        folder = self.folder_of(name) or self.root.joinpath(*parts)
        if folder.parent.is_symlink():
            raise ToolError(f"{folder.parent.name} is not a folder of skills/ of its own")
        if folder.exists():
            self._keep(name, folder, by, f"rolled back to version {chosen}")
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(history / str(chosen), folder, symlinks=True)
        return f"rolled skill {name} back to version {chosen}"

    # -- versions ---------------------------------------------------------------------------------

    def _history(self, name: str) -> Path:
        return self.root / HISTORY / name

    def log(self, name: str) -> list[dict[str, Any]]:
        try:
            lines = (self._history(name) / "log.jsonl").read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def _keep(self, name: str, folder: Path, by: str, note: str) -> int:
        history = self._history(name)
        history.mkdir(parents=True, exist_ok=True)
        version = max((int(p.name) for p in history.iterdir() if p.name.isdigit()), default=0) + 1
        shutil.copytree(folder, history / str(version), symlinks=True)
        self._log(name, version, by, note, folder.relative_to(self.root).as_posix())
        return version

    def _log(self, name: str, version: int | None, by: str, note: str, folder: str | None = None) -> None:
        history = self._history(name)
        history.mkdir(parents=True, exist_ok=True)
        with open(history / "log.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"version": version, "at": now_iso(), "by": by, "note": note,
                                     **({"folder": folder} if folder else {})}) + "\n")


def _checked(name: Any, what: str = "skill name") -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ToolError(f"{what} {name!r} must be lowercase letters, digits, '-', '_' or '.', starting with a "
                        "letter or digit, at most 64 characters")
    return name
