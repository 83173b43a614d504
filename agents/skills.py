"""Skills: Python files that register tools, and instruction skills (a folder with a SKILL.md).

Where: the workspace's `skills/` first, then the repository's bundled `skills/`; a workspace
skill of the same name wins. A Python skill is validated in a separate process (agents/skillcheck)
before anything loads it; verdicts are kept by content digest in `runs/skills.json`, so each
version is checked once for the whole team. Versions replaced by `skill_manage` or a rollback are
kept in `skills/.history/<name>/<n>.py` with `skills/.history/<name>/log.jsonl` saying who, when
and why. An instruction skill (the format Hermes Agent and Claude use: YAML front matter with
`name` and `description`, then a Markdown body) is listed by name and description in the system
prompt and read on demand with `skill_view`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hermes_sup.kanban.fsio import write_atomic, write_json_atomic
from hermes_sup.kanban.task import now_iso

from .journal import Journal
from .tools import Tool, ToolContext, ToolError, collecting, register

BUNDLED = Path(__file__).resolve().parent.parent / "skills"
SKILL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
CHECK_TIMEOUT = 10.0


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

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "source": self.source, "path": str(self.path),
                "description": self.description, "state": self.state, "error": self.error or None,
                "tools": [tool["name"] for tool in self.tools], "version": self.digest[:12] or None}


def front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(the YAML front matter, the body) of a SKILL.md; ({}, text) when there is none (pure)."""
    if not text.startswith("---"):
        return {}, text
    end = text.find("\n---", 3)
    if end < 0:
        return {}, text
    try:
        meta = yaml.safe_load(text[3:end]) or {}
    except yaml.YAMLError:
        return {}, text
    return (meta if isinstance(meta, dict) else {}), text[end + 4:].lstrip("\n")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_in_process_of_its_own(path: Path) -> dict[str, Any]:
    """The verdict of agents.skillcheck on `path`, bounded in time."""
    env = {key: value for key, value in os.environ.items() if not key.endswith(("_API_KEY", "_TOKEN"))}
    try:
        done = subprocess.run([sys.executable, "-P", "-m", "hermes_sup.agents.skillcheck", str(path)],
                              capture_output=True,
                              text=True, timeout=CHECK_TIMEOUT, env=env, stdin=subprocess.DEVNULL,
                              cwd=BUNDLED.parent)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"did not finish loading within {CHECK_TIMEOUT:g} s (a loop at import?)"}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        verdict = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        return {"ok": False, "error": f"the check process ended with status {done.returncode} without a verdict "
                                      f"{tail[0][:200]}".strip()}
    return verdict if isinstance(verdict, dict) else {"ok": False, "error": "no verdict"}


class Skills:
    """The skills of one workspace: discovery, validation (cached by digest), loading, versions."""

    def __init__(self, workspace: Path, bundled: Path = BUNDLED) -> None:
        self.folder = workspace / "skills"
        self.bundled = bundled
        self.verdicts_path = workspace / "runs" / "skills.json"
        self._loaded: dict[str, tuple[str, list[Tool]]] = {}  # name -> (digest, tools)

    # -- discovery --------------------------------------------------------------------------------

    def _found(self) -> dict[str, tuple[str, Path, str]]:
        found: dict[str, tuple[str, Path, str]] = {}
        for source, folder in (("bundled", self.bundled), ("workspace", self.folder)):  # workspace wins
            if not folder.is_dir() or (source == "workspace" and folder.resolve() == self.bundled.resolve()):
                continue  # the repository's own workspace: its skills/ is the bundled one
            for entry in sorted(folder.iterdir()):
                if entry.name.startswith((".", "_")):
                    continue
                if entry.suffix == ".py" and entry.is_file() and SKILL_NAME.fullmatch(entry.stem):
                    found[entry.stem] = ("python", entry, source)
                elif entry.is_dir() and (entry / "SKILL.md").is_file():
                    found[entry.name] = ("instructions", entry / "SKILL.md", source)
        return found

    def _verdicts(self) -> dict[str, Any]:
        try:
            data = json.loads(self.verdicts_path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def verdict(self, path: Path, data: bytes) -> dict[str, Any]:
        key = digest(data)
        verdicts = self._verdicts()
        if key not in verdicts:
            verdicts[key] = check_in_process_of_its_own(path)
            self.verdicts_path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.verdicts_path, verdicts, fsync=False)
        return verdicts[key]

    def catalog(self) -> list[Skill]:
        skills = []
        for name, (kind, path, source) in sorted(self._found().items()):
            try:
                data = path.read_bytes()
            except OSError as exc:
                skills.append(Skill(name, kind, path, source, state="rejected", error=f"cannot be read: {exc}"))
                continue
            if kind == "instructions":
                meta, _ = front_matter(data.decode("utf-8", "replace"))
                skill = Skill(str(meta.get("name") or name), kind, path, source,
                              description=str(meta.get("description") or "").strip(), digest=digest(data))
                if not meta.get("description"):
                    skill.state, skill.error = "rejected", "SKILL.md needs front matter with a description"
                skills.append(skill)
                continue
            verdict = self.verdict(path, data)
            skills.append(Skill(name, kind, path, source, description=verdict.get("doc", ""),
                                state="ok" if verdict.get("ok") else "rejected", error=verdict.get("error", ""),
                                tools=verdict.get("tools") or [], digest=digest(data)))
        return skills

    def get(self, name: str) -> Skill:
        for skill in self.catalog():
            if skill.name == name:
                return skill
        raise ToolError(f"no skill named {name!r}")

    # -- loading ----------------------------------------------------------------------------------

    def tools_for(self, enabled: set[str] | None) -> tuple[dict[str, Tool], list[str]]:
        """The tools of the valid Python skills enabled (None: all), loaded once per version, and
        notes on the skills that could not be used."""
        tools: dict[str, Tool] = {}
        notes = []
        for skill in self.catalog():
            if skill.kind != "python" or (enabled is not None and skill.name not in enabled):
                continue
            if skill.state != "ok":
                notes.append(f"skill {skill.name} is not loaded: {skill.error}")
                continue
            cached = self._loaded.get(skill.name)
            if cached is None or cached[0] != skill.digest:
                try:
                    cached = (skill.digest, load(skill.path))
                except Exception as exc:  # validated, yet failing here: keep the agent going
                    notes.append(f"skill {skill.name} failed to load: {type(exc).__name__}: {exc}")
                    continue
                self._loaded[skill.name] = cached
            for tool in cached[1]:
                tools[tool.name] = dataclasses.replace(tool, capabilities=tuple(tool.capabilities),
                                                       toolset=skill.name)
        return tools, notes

    # -- versions ---------------------------------------------------------------------------------

    def history_dir(self, name: str) -> Path:
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


def load(path: Path) -> list[Tool]:
    """Run a (validated) skill file and return the tools it registers, without touching the shared
    registry."""
    source = path.read_text(encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": f"hermes_skill_{path.stem}", "__file__": str(path)}
    with collecting() as tools:
        exec(compile(source, str(path), "exec"), namespace)
    return tools


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
    rows = [skill.as_dict() for skill in _skills(ctx).catalog()]
    return json.dumps([{k: row[k] for k in ("name", "kind", "description", "state", "error", "tools")}
                       for row in rows], ensure_ascii=False)


def skill_view(ctx: ToolContext, args: dict[str, Any]) -> str:
    skill = _skills(ctx).get(args["name"])
    text = skill.path.read_text(encoding="utf-8", errors="replace")
    if skill.kind == "instructions":
        return front_matter(text)[1]
    return text


def skill_manage(ctx: ToolContext, args: dict[str, Any]) -> str:
    skills, name, action = _skills(ctx), args["name"], args["action"]
    by = ctx.agent or "agent"
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


register(Tool("skills_list", "List the skills: name, kind, description, whether valid, and their tools.", skills_list,
              capabilities=("skills",), idempotent=True, toolset="skills"))
register(Tool("skill_view", "Read a skill: the instructions of an instruction skill, or a Python skill's source.",
              skill_view, {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}},
                           "required": ["name"], "additionalProperties": False},
              capabilities=("skills",), idempotent=True, toolset="skills"))
register(Tool("skill_manage", "Create a Python skill (a file that registers tools), patch it, or roll it back to "
              "an earlier version. A new version is validated first; a failing one changes nothing.", skill_manage,
              {"type": "object", "properties": {
                  "action": {"type": "string", "enum": ["create", "patch", "rollback"]},
                  "name": {"type": "string", "minLength": 1}, "content": {"type": "string"},
                  "old_string": {"type": "string"}, "new_string": {"type": "string"},
                  "version": {"type": "integer", "minimum": 1}, "note": {"type": "string"}},
                  "required": ["action", "name"], "additionalProperties": False},
              capabilities=("skills",), toolset="skills"))
