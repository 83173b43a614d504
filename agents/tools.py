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


@dataclass(frozen=True)
class Tool:
    name: str
    capability: str
    idempotent: bool
    handler: Callable[[ToolContext, dict[str, Any]], Any]


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


register(Tool("wait", "fs.read", True, _wait))
register(Tool("write_file", "fs.write", True, _write_file))
register(Tool("read_file", "fs.read", True, _read_file))


def run_step(ctx: ToolContext, step: dict[str, Any], capabilities: tuple[str, ...]) -> Any:
    tool = REGISTRY.get(step.get("tool", ""))
    if tool is None:
        raise ToolError(f"unknown tool {step.get('tool')!r}; known: {', '.join(sorted(REGISTRY))}")
    if tool.capability not in capabilities:
        raise ToolError(f"tool {tool.name} needs the {tool.capability} capability, which this agent lacks")
    return tool.handler(ctx, step.get("args") or {})
