"""A new skill as a person starts one (`skills new NAME`): a Python tool that works as written, with a test
that runs with plain `python`, or an instruction skill's SKILL.md (the texts are pure; writing is `create`)."""

from __future__ import annotations

import os
from pathlib import Path

KINDS = ("python", "instructions")

PYTHON = '''"""{name}: upper-cases a text. Say here what the skill does: `hermes-sup skills list` shows this line."""

from __future__ import annotations

from typing import Any

from hermes_sup.agents.tools import Tool, ToolContext, ToolError, register


def {name}(ctx: ToolContext, args: dict[str, Any]) -> str:
    """Every tool is called as handler(ctx, args): `ctx` is the call's context (ctx.scratch is the
    agent's folder for the task), `args` the arguments the model gave, checked against the schema
    below. Return text for the model; raise ToolError to tell it what went wrong."""
    text = args["text"]
    if not text.strip():
        raise ToolError("the text is empty: give the text to upper-case")
    return text.upper()


register(Tool(
    "{name}",
    "Upper-case a text.",  # what the model reads to decide when to call it
    {name},
    {{"type": "object", "properties": {{"text": {{"type": "string", "description": "The text."}}}},
     "required": ["text"]}},
    idempotent=True,  # a call may be repeated after a crash without harm
))
'''

PYTHON_TEST = '''"""The {name} skill's test: `python tests/test_{name}.py` (or pytest). It loads skills/{name}.py as the
agent does and calls its tool the way the agent calls it."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import threading
from pathlib import Path

from hermes_sup.agents.tools import ToolContext, ToolError

SKILL = Path(__file__).resolve().parents[1] / "skills" / "{name}.py"


def call(args: dict) -> str:
    spec = importlib.util.spec_from_file_location("skill_{name}", SKILL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as scratch:
        return module.{name}(ToolContext(scratch=Path(scratch), stop=threading.Event()), args)


def test_{name}_upper_cases_its_text() -> None:
    assert call({{"text": "Hello"}}) == "HELLO"


def test_{name}_says_what_is_wrong_with_an_empty_text() -> None:
    try:
        call({{"text": "  "}})
    except ToolError as exc:
        assert "empty" in str(exc)
    else:
        raise AssertionError("an empty text was accepted")


if __name__ == "__main__":
    for name, test in list(globals().items()):
        if name.startswith("test_"):
            test()
            print(f"ok   {{name}}")
    sys.exit(0)
'''

INSTRUCTIONS = '''---
name: {name}
description: One line on when to use this skill (the agent sees it in its list and reads the rest on demand).
---

# {name}

Write here, as you would for a new colleague, how to do the task this skill is for: the steps, the
tools to use, what good output looks like, and the mistakes to avoid.
'''


def files_for(name: str, kind: str) -> dict[str, str]:
    """The files of a new skill `name` of `kind`, by path relative to the workspace (pure)."""
    if kind == "python":
        return {f"skills/{name}.py": PYTHON.format(name=name), f"tests/test_{name}.py": PYTHON_TEST.format(name=name)}
    return {f"skills/{name}/SKILL.md": INSTRUCTIONS.format(name=name)}


class LinkedFolder(Exception):
    """A folder a new skill's file would be written in is a symbolic link (the relative path is the message)."""


def linked_folder(root: Path, relative: str) -> str | None:
    """The first folder of `relative` under `root` that is a symbolic link, relative, or None: a link
    put there (skills/ or tests/ pointing out of the workspace) would take the file elsewhere."""
    parts = Path(relative).parts[:-1]
    for depth in range(1, len(parts) + 1):
        if os.path.islink(root.joinpath(*parts[:depth])):
            return str(Path(*parts[:depth]))
    return None


def create(root: Path, files: dict[str, str]) -> list[str]:
    """Write `files` under `root`, none over an existing one (O_EXCL: nor through a link put there,
    in place of the file or of a folder on its way: LinkedFolder); FileExistsError names the first
    that exists, before anything is written."""
    for relative in files:
        linked = linked_folder(root, relative)
        if linked is not None:
            raise LinkedFolder(linked)
        if os.path.lexists(root / relative):
            raise FileExistsError(relative)
    written = []
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        written.append(relative)
    return written
