"""The tool registry: each tool registers itself with its name, capability and handler. A plain dict
filled by explicit registration. For now it holds what a task's `steps` need to run without an LLM;
the tools issue adds schemas, capability checks and the full built-in set."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ToolError(Exception):
    """A tool call that failed in a way the caller (a task, or later a model) should be told."""


@dataclass(frozen=True)
class ToolContext:
    scratch: Path
    stop: threading.Event
    memory: Any = None  # agents.memory.MemoryFile, when the agent has one


class NeedsPerson(Exception):
    """Raised by ask_human: the task is blocked until a person answers."""


@dataclass(frozen=True)
class Tool:
    name: str
    capability: str
    idempotent: bool
    handler: Callable[[ToolContext, dict[str, Any]], Any]
    description: str = ""
    parameters: dict[str, Any] | None = None

    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI function definition."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": self.parameters or {"type": "object", "properties": {}}}}


REGISTRY: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    REGISTRY[tool.name] = tool
    return tool


def confined(ctx: ToolContext, relative: object) -> Path:
    """A path inside the scratch folder, checked on the resolved path (no `..`, no absolute path,
    no symlink out)."""
    if not isinstance(relative, str) or not relative:
        raise ToolError("path must be a non-empty string")
    if Path(relative).is_absolute():
        raise ToolError(f"absolute paths are refused: {relative}")
    root = ctx.scratch.resolve()
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"path escapes the scratch folder: {relative}")
    return target


def _wait(ctx: ToolContext, args: dict[str, Any]) -> str:
    seconds = float(args.get("seconds", 0))
    if ctx.stop.wait(timeout=max(0.0, seconds)):
        raise ToolError("interrupted: the agent is stopping")
    return f"waited {seconds:g} s"


def _write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = confined(ctx, args.get("path"))
    content = args.get("content", "")
    if not isinstance(content, str):
        raise ToolError("content must be a string")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{time.monotonic_ns()}.tmp")
    tmp.write_text(content)
    tmp.replace(target)
    return f"wrote {len(content)} characters to {args['path']}"


def _read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = confined(ctx, args.get("path"))
    try:
        return target.read_text()
    except FileNotFoundError:
        raise ToolError(f"no such file: {args.get('path')}") from None


def _memory(ctx: ToolContext, args: dict[str, Any]) -> str:
    from .memory import MemoryEntryError

    if ctx.memory is None:
        raise ToolError("this agent has no memory file")
    try:
        return ctx.memory.change(str(args.get("action", "")), content=args.get("content"),
                                 old_text=args.get("old_text"))
    except MemoryEntryError as exc:
        raise ToolError(str(exc)) from None


def _ask_human(ctx: ToolContext, args: dict[str, Any]) -> str:
    question = str(args.get("question") or "").strip()
    if not question:
        raise ToolError("question is required")
    raise NeedsPerson(question)


def _string(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


register(Tool("wait", "fs.read", True, _wait, "Wait a number of seconds.",
              {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}))
register(Tool("write_file", "fs.write", True, _write_file, "Write a text file in your scratch folder.",
              {"type": "object", "properties": {"path": _string("relative path"), "content": _string("the text")},
               "required": ["path", "content"]}))
register(Tool("read_file", "fs.read", True, _read_file, "Read a text file from your scratch folder.",
              {"type": "object", "properties": {"path": _string("relative path")}, "required": ["path"]}))
register(Tool("memory", "memory", False, _memory,
              "Keep a fact across tasks: add one, or replace or remove the one containing old_text.",
              {"type": "object", "properties": {
                  "action": {"type": "string", "enum": ["add", "replace", "remove"]},
                  "content": _string("the fact, for add and replace"),
                  "old_text": _string("a piece of the entry to change, unique to it")}, "required": ["action"]}))
register(Tool("ask_human", "kanban", False, _ask_human,
              "Stop and ask a person: use only when you cannot go on without their answer.",
              {"type": "object", "properties": {"question": _string("what you need to know")},
               "required": ["question"]}))


def schemas(capabilities: tuple[str, ...]) -> list[dict[str, Any]]:
    """The definitions of every tool the capabilities allow, in a stable order (provider caches
    need byte-identical prompts)."""
    return [REGISTRY[name].schema() for name in sorted(REGISTRY) if REGISTRY[name].capability in capabilities]


def run_step(ctx: ToolContext, step: dict[str, Any], capabilities: tuple[str, ...]) -> Any:
    tool = REGISTRY.get(step.get("tool", ""))
    if tool is None:
        raise ToolError(f"unknown tool {step.get('tool')!r}; known: {', '.join(sorted(REGISTRY))}")
    if tool.capability not in capabilities:
        raise ToolError(f"tool {tool.name} needs the {tool.capability} capability, which this agent lacks")
    return tool.handler(ctx, step.get("args") or {})
