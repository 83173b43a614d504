"""Skills: Python files that register tools, and instruction skills (a folder with a SKILL.md).

Where: the workspace's `skills/` first, then the repository's bundled `skills/`; a workspace
skill of the same name wins. A Python skill is validated in a separate process (agents/skillcheck)
before anything loads it; verdicts are kept by content digest in `runs/skills.json`, so each
version is checked once for the whole team. Versions replaced by `skill_manage` or a rollback are
kept in `skills/.history/<name>/<n>.py` with `skills/.history/<name>/log.jsonl` saying who, when
and why. An instruction skill (the format Hermes Agent and Claude use: YAML front matter with
`name` and `description`, then a Markdown body) is listed by name and description in the system
prompt and read on demand with `skill_view`, with the files beside it (`references/`, `templates/`,
`scripts/`) read by `skill_view` with `file_path`, never outside the skill's folder. Instruction
skills are found as Hermes finds them, at any depth (`skills/<category>/<name>/SKILL.md`,
`skills/mlops/inference/llama-cpp/SKILL.md`), and one whose `platforms` leaves out this system is
not offered.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..kanban.fsio import write_atomic, write_json_atomic
from ..kanban.journal import Journal
from ..kanban.parse import load_yaml
from ..kanban.task import now_iso
from . import skillproc
from .files import read_nofollow
from .skillcheck import verdict_problem
from .skillfind import SKILL_NAME, SUPPORT_FOLDERS, Finder, file_signature  # noqa: F401  (SUPPORT_FOLDERS: the importer's)
from .skillproc import check_env, check_in_process_of_its_own  # noqa: F401  (the skill checks' entry points)
from .tools import Tool, ToolContext, ToolError, register

VERDICTS_LOCK = ".skills.lock"  # beside runs/skills.json: one agent checks a skill at a time

BUNDLED = Path(__file__).resolve().parent.parent / "skills"
# What a skill check inherits of its caller's environment; HOME and TMPDIR are its own folder.
PLATFORMS = {"macos": "darwin", "linux": "linux", "windows": "win32"}  # Hermes' names, sys.platform's
MAX_LINKED_BYTES = 1_000_000


@dataclass
class Skill:
    name: str
    kind: str            # python | instructions
    path: Path           # the .py file, or the SKILL.md
    source: str          # workspace | bundled
    description: str = ""
    state: str = "ok"    # ok | rejected
    error: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)
    digest: str = ""
    category: str = ""   # Hermes' skills/<category>/<name>/ layout

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "source": self.source, "path": str(self.path),
                "description": self.description, "state": self.state, "error": self.error or None,
                "tools": [tool["name"] for tool in self.tools], "version": self.digest[:12] or None,
                "category": self.category or None}


def front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(the YAML front matter, the body) of a SKILL.md; ({}, text) when there is none (pure)."""
    if not text.startswith("---"):
        return {}, text
    end = text.find("\n---", 3)
    if end < 0:
        return {}, text
    try:
        meta = load_yaml(text[3:end]) or {}  # bounded: a SKILL.md may come from anyone
    except yaml.YAMLError:
        return {}, text
    return (meta if isinstance(meta, dict) else {}), text[end + 4:].lstrip("\n")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Skills:
    """The skills of one workspace: discovery, validation (cached by digest), loading, versions."""

    def __init__(self, workspace: Path, bundled: Path = BUNDLED, listed: Iterable[str] = ()) -> None:
        self.folder = workspace / "skills"
        self.bundled = bundled
        self.verdicts_path = workspace / "runs" / "skills.json"
        self._finder = Finder(bundled, self.folder)
        # The agent's `skills:`. When it names instruction skills, those are the instruction skills
        # it sees (a Hermes profile's own, as the import sets them); else it sees them all.
        self.listed = frozenset(listed)
        # The catalog as last read, and what its files were then: a task's toolbox read and parsed
        # every skill file and the verdicts (a fifth of an offline agent's work per task).
        self._memo: tuple[object, list[Skill]] | None = None

    # -- discovery --------------------------------------------------------------------------------

    def _found(self) -> dict[str, tuple[str, Path, str]]:
        return {name: (kind, path, source) for name, (kind, path, source, _) in self._found_in_categories().items()}

    def _found_in_categories(self) -> dict[str, tuple[str, Path, str, str]]:
        return self._finder.found()

    def names(self) -> set[str]:
        """The names of the skills present, from their file and folder names alone (nothing is read
        or run): what `hermes.yaml` may name in an agent's `skills`."""
        return set(self._found())

    def _verdicts(self) -> dict[str, Any]:
        try:
            data = json.loads(self.verdicts_path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def verdict(self, path: Path, data: bytes) -> dict[str, Any]:
        key = digest(data)
        known = self._verdicts().get(key)
        if not verdict_problem(known):
            return known
        # None yet, of an older shape, or written by something else. A team's agents start
        # together and each checked every skill in a process of its own (256 agents: minutes of
        # CPU): one checks, the others wait and read its verdict, and no write loses another's.
        self.verdicts_path.parent.mkdir(parents=True, exist_ok=True)
        with skillproc.one_at_a_time(self.verdicts_path.with_name(VERDICTS_LOCK)):
            verdicts = self._verdicts()
            if verdict_problem(verdicts.get(key)):
                verdicts[key] = check_in_process_of_its_own(path, self.verdicts_path.parent, data)
                write_json_atomic(self.verdicts_path, verdicts, fsync=False)
        return verdicts[key]

    def catalog(self) -> list[Skill]:
        found = sorted(self._found_in_categories().items())
        key = (self.listed, [(name, entry, file_signature(entry[1])) for name, entry in found],
               file_signature(self.verdicts_path))
        if self._memo is not None and self._memo[0] == key:
            return list(self._memo[1])
        instructions = {name for name, (kind, *_) in found if kind == "instructions"} & self.listed
        if instructions:
            found = [(name, entry) for name, entry in found if entry[0] != "instructions" or name in instructions]
        skills = []
        for name, (kind, path, source, category) in found:
            try:
                data = path.read_bytes()
            except OSError as exc:
                skills.append(Skill(name, kind, path, source, state="rejected", error=f"cannot be read: {exc}"))
                continue
            if kind == "instructions":
                meta, _ = front_matter(data.decode("utf-8", "replace"))
                if not on_this_platform(meta.get("platforms")):
                    continue  # as Hermes does: a macOS-only skill is not offered on Linux
                skill = Skill(str(meta.get("name") or name), kind, path, source,
                              description=str(meta.get("description") or "").strip(), digest=digest(data),
                              category=category)
                if not meta.get("description"):
                    skill.state, skill.error = "rejected", "SKILL.md needs front matter with a description"
                skills.append(skill)
                continue
            verdict = self.verdict(path, data)
            skills.append(Skill(name, kind, path, source, description=verdict.get("doc", ""),
                                state="ok" if verdict.get("ok") else "rejected", error=verdict.get("error", ""),
                                tools=verdict.get("tools") or [], digest=digest(data)))
        self._memo = (key, skills)
        return list(skills)

    def get(self, name: str) -> Skill:
        for skill in self.catalog():
            if skill.name == name:
                return skill
        raise ToolError(f"no skill named {name!r}")

    # -- loading ----------------------------------------------------------------------------------

    def tools_for(self, enabled: set[str] | None) -> tuple[dict[str, Tool], list[str]]:
        """The tools of the valid Python skills enabled (None: all), as their checks declared them:
        each call runs the skill confined in a process of its own (agents/skillproc.py), never in
        this one; and notes on the skills that could not be used."""
        tools: dict[str, Tool] = {}
        notes = []
        for skill in self.catalog():
            if skill.kind != "python" or (enabled is not None and skill.name not in enabled):
                continue
            if skill.state != "ok":
                notes.append(f"skill {skill.name} is not loaded: {skill.error}")
                continue
            try:
                made = skillproc.proxies(skill.name, skill.path, skill.digest, skill.tools, self.verdicts_path.parent)
            except Exception as exc:  # a verdict file damaged since: this skill is left out, the others stay
                notes.append(f"skill {skill.name} is not loaded: {type(exc).__name__}: {exc}")
                continue
            for tool in made:
                tools[tool.name] = tool
        return tools, notes

    # -- versions ---------------------------------------------------------------------------------

    def history_dir(self, name: str) -> Path:
        if not SKILL_NAME.fullmatch(name):  # "../../x" would read and write outside skills/
            raise ToolError(f"skill name {name!r} must match [a-z][a-z0-9_]{{0,63}}")
        return self.folder / ".history" / name

    def history(self, name: str) -> list[dict[str, Any]]:
        return Journal(self.history_dir(name) / "log.jsonl").read().records

    def _archive(self, name: str, current: Path, by: str, note: str) -> int:
        folder = self.history_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        version = max((int(p.stem) for p in folder.glob("*.py") if p.stem.isdigit()), default=0) + 1
        data = current.read_bytes()
        write_atomic(folder / f"{version}.py", data)
        with open(folder / "log.jsonl", "a") as handle:
            handle.write(json.dumps({"version": version, "at": now_iso(), "by": by, "note": note,
                                     "digest": digest(data)[:12]}) + "\n")
        return version

    def install(self, name: str, content: str, *, by: str, note: str) -> Skill:
        """Validate `content` as skill `name` and, if it passes, make it the current version (the
        one it replaces goes to the history). A failing version changes nothing."""
        if not SKILL_NAME.fullmatch(name):
            raise ToolError(f"skill name {name!r} must match [a-z][a-z0-9_]{{0,63}}")
        self.folder.mkdir(parents=True, exist_ok=True)
        staged = self.folder / f".{name}.{os.getpid()}.candidate.py"
        staged.write_text(content, encoding="utf-8")
        try:
            verdict = self.verdict(staged, content.encode("utf-8"))
            if not verdict.get("ok"):
                raise ToolError(f"skill {name} was not changed: the new version is rejected: {verdict.get('error')}")
            target = self.folder / f"{name}.py"
            if target.exists():
                self._archive(name, target, by, f"replaced: {note}")
            os.replace(staged, target)
        finally:
            staged.unlink(missing_ok=True)
        return self.get(name)

    def rollback(self, name: str, version: int | None = None, *, by: str = "cli") -> tuple[int, Skill]:
        """Make an earlier version current again (default: the latest kept); the current one is
        kept in the history too, so a rollback can itself be rolled back."""
        folder = self.history_dir(name)
        versions = sorted(int(p.stem) for p in folder.glob("*.py") if p.stem.isdigit()) if folder.is_dir() else []
        if not versions:
            raise ToolError(f"skill {name} has no earlier version to roll back to")
        chosen = versions[-1] if version is None else version
        if chosen not in versions:
            raise ToolError(f"skill {name} has no version {chosen}; kept: {', '.join(map(str, versions))}")
        target = self.folder / f"{name}.py"
        if target.exists():
            self._archive(name, target, by, f"rolled back to version {chosen}")
        write_atomic(target, (folder / f"{chosen}.py").read_bytes())
        return chosen, self.get(name)


def on_this_platform(platforms: Any, current: str = sys.platform) -> bool:
    """Whether a skill's `platforms` (Hermes' names: linux, macos, windows) include this system; none
    given: every system (pure)."""
    if not platforms:
        return True
    listed = platforms if isinstance(platforms, list) else [platforms]
    return any(current.startswith(PLATFORMS.get(str(p).lower().strip(), str(p).lower().strip()) or "\0")
               for p in listed)


def linked_file(folder: Path, relative: object) -> Path:
    """The file `relative` names inside a skill's folder, or ToolError: absolute paths, `..` and
    symlinks leading out of the folder are refused; the file is then read without following a link
    (files.read_nofollow), so one swapped in since is refused too."""
    if not isinstance(relative, str) or not relative.strip():
        raise ToolError("file_path must be a non-empty path inside the skill's folder")
    if os.path.isabs(relative) or relative.startswith("~"):
        raise ToolError(f"absolute paths are refused: {relative} (file_path is relative to the skill's folder)")
    if ".." in Path(relative).parts:
        raise ToolError(f"'..' is refused in file_path: {relative}")
    root = folder.resolve()
    target = (root / relative).resolve()
    if root not in target.parents:
        raise ToolError(f"refused: {relative} leads outside the skill's folder")
    if not target.is_file():
        raise ToolError(f"no file {relative} in this skill")
    return target


def linked_files(folder: Path) -> list[str]:
    """The files beside a SKILL.md (references, templates, scripts), relative to its folder, that
    stay inside it; at most 200."""
    root = folder.resolve()
    found = []
    for path in sorted(folder.rglob("*")):
        if len(found) >= 200:
            break
        relative = path.relative_to(folder)
        if relative.as_posix() == "SKILL.md" or any(
                part.startswith(".") for part in relative.parts):
            continue
        with contextlib.suppress(OSError):
            if path.is_file() and root in path.resolve().parents:
                found.append(relative.as_posix())
    return found


def prompt_block(skills: list[Skill]) -> str:
    """The instruction skills, one line each, for the system prompt."""
    usable = [s for s in skills if s.kind == "instructions" and s.state == "ok"]
    if not usable:
        return ""
    lines = [f"- {s.name}: {s.description}" for s in usable[:50]]
    return "Skills you can read with skill_view before you start (instructions for specific jobs):\n" + "\n".join(lines)


# -- the tools ------------------------------------------------------------------------------------

def _skills(ctx: ToolContext) -> Skills:
    skills = ctx.services.get("skills")
    if skills is None:
        raise ToolError("skills are not available to this agent")
    return skills


def skills_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    rows = [skill.as_dict() for skill in _skills(ctx).catalog()
            if not args.get("category") or skill.category == args["category"]]
    return json.dumps([{k: row[k] for k in ("name", "kind", "category", "description", "state", "error", "tools")}
                       for row in rows], ensure_ascii=False)


def skill_view(ctx: ToolContext, args: dict[str, Any]) -> str:
    skill = _skills(ctx).get(args["name"])
    if args.get("file_path") is not None:
        if skill.kind != "instructions":
            raise ToolError(f"skill {skill.name} is a Python file: it has no linked files")
        target = linked_file(skill.path.parent, args["file_path"])
        data = read_nofollow(target, args["file_path"], MAX_LINKED_BYTES)
        if len(data) > MAX_LINKED_BYTES:
            raise ToolError(f"{args['file_path']} is larger than {MAX_LINKED_BYTES:,} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{args['file_path']} is not UTF-8 text") from None
    text = skill.path.read_text(encoding="utf-8", errors="replace")
    if skill.kind == "instructions":
        body = front_matter(text)[1]
        linked = linked_files(skill.path.parent)
        if linked:
            body += ("\n\n[linked files: read one with skill_view(name, file_path): " + ", ".join(linked) + "]")
        return body
    return text


def skill_manage(ctx: ToolContext, args: dict[str, Any]) -> str:
    skills, name, action = _skills(ctx), args["name"], args["action"]
    by = ctx.agent or "agent"
    found = skills._found().get(name)
    if _instructions(action, args, found):  # Hermes' actions, on SKILL.md skills (agents/skillfiles.py)
        return _manage_instructions(skills, action, name, args, by)
    if action == "create":
        if (skills.folder / f"{name}.py").exists():
            raise ToolError(f"skill {name} exists; patch it instead")
        if "content" not in args:
            raise ToolError("create needs content: the skill's Python source")
        skill = skills.install(name, args["content"], by=by, note=args.get("note") or "created")
        return f"created skill {name}: tools {', '.join(t['name'] for t in skill.tools)}"
    if action == "patch":
        current = skills.folder / f"{name}.py"
        if not current.exists():
            raise ToolError(f"no skill {name} in this workspace's skills/ to patch")
        text = current.read_text(encoding="utf-8")
        if "content" in args:
            new = args["content"]
        elif "old_string" in args and "new_string" in args:
            if text.count(args["old_string"]) != 1:
                raise ToolError(f"old_string must occur exactly once in {name}.py "
                                f"(it occurs {text.count(args['old_string'])} times)")
            new = text.replace(args["old_string"], args["new_string"])
        else:
            raise ToolError("patch needs content, or old_string and new_string")
        skill = skills.install(name, new, by=by, note=args.get("note") or "patched")
        return f"patched skill {name}: tools {', '.join(t['name'] for t in skill.tools)}"
    version, skill = skills.rollback(name, args.get("version"), by=by)
    return f"rolled skill {name} back to version {version} ({skill.state})"


def _instructions(action: str, args: dict[str, Any], found: tuple[str, Path, str] | None) -> bool:
    """Whether a skill_manage call is about an instruction skill (pure): Hermes' own actions, a
    SKILL.md given as content, a category, a name only an instruction skill may have, or one that is."""
    content = args.get("content")
    return (action in ("edit", "delete", "write_file", "remove_file") or "category" in args
            or (isinstance(content, str) and content.lstrip("\ufeff").startswith("---"))
            or not SKILL_NAME.fullmatch(str(args.get("name"))) or (found is not None and found[0] == "instructions"))


def _manage_instructions(skills: Skills, action: str, name: str, args: dict[str, Any], by: str) -> str:
    from .skillfiles import InstructionSkills

    managed = InstructionSkills(skills.folder, lambda wanted: skills._found().get(wanted))
    skills.folder.mkdir(parents=True, exist_ok=True)

    def need(*keys: str) -> list[Any]:
        missing = [key for key in keys if not isinstance(args.get(key), str)]
        if missing:
            raise ToolError(f"{action} needs {' and '.join(missing)}")
        return [args[key] for key in keys]

    if action == "create":
        return managed.create(name, *need("content"), args.get("category"), by=by)
    if action == "edit":
        return managed.edit(name, *need("content"), by=by)
    if action == "patch":
        old, new = need("old_string", "new_string")
        return managed.patch(name, old, new, args.get("file_path"), bool(args.get("replace_all")), by=by)
    if action == "write_file":
        return managed.write_file(name, *need("file_path", "file_content"), by=by)
    if action == "remove_file":
        return managed.remove_file(name, *need("file_path"), by=by)
    if action == "delete":
        absorbed = args.get("absorbed_into")
        return managed.delete(name, absorbed if isinstance(absorbed, str) and absorbed else None, by=by)
    return managed.rollback(name, args.get("version"), by=by)


register(Tool("skills_list", "List the skills: name, kind, category, description, whether valid, and their tools.",
              skills_list, {"type": "object", "properties": {
                  "category": {"type": "string", "description": "only the skills of this category"}},
                  "additionalProperties": False},
              capabilities=("skills",), idempotent=True, toolset="skills"))
register(Tool("skill_view", "Read a skill: the instructions of an instruction skill (with the files it links), "
              "one of those files (file_path, e.g. references/api.md), or a Python skill's source.",
              skill_view, {"type": "object", "properties": {
                  "name": {"type": "string", "minLength": 1},
                  "file_path": {"type": "string", "description": "a file inside the skill's folder"}},
                  "required": ["name"], "additionalProperties": False},
              capabilities=("skills",), idempotent=True, toolset="skills"))
# A skill is code the agents run in their own processes, so writing one takes the trust of `shell`.
register(Tool("skill_manage", "Create, change or roll back a skill: a Python skill (a file that registers tools) "
              "or an instruction skill (a SKILL.md: front matter with name and description, then instructions; "
              "files beside it under references/, templates/, scripts/, assets/). Every change is checked first and "
              "the previous version kept.", skill_manage,
              {"type": "object", "properties": {
                  "action": {"type": "string", "enum": ["create", "patch", "edit", "delete", "write_file",
                                                        "remove_file", "rollback"]},
                  "name": {"type": "string", "minLength": 1}, "content": {"type": "string"},
                  "old_string": {"type": "string"}, "new_string": {"type": "string"},
                  "version": {"type": "integer", "minimum": 1}, "note": {"type": "string"},
                  "category": {"type": "string"}, "file_path": {"type": "string"},
                  "file_content": {"type": "string"}},
                  "required": ["action", "name"], "additionalProperties": False},
              hidden={"replace_all": {"type": "boolean"}, "absorbed_into": {"type": "string"}},
              capabilities=("skills", "shell"), toolset="skills"))
