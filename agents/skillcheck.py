"""Validate one skill in a process of its own, its source and path given on stdin (agents/skillproc.check).

The file must parse, import, and register at least one tool with a valid name, description,
argument schema (plain JSON) and capabilities a confined process can have, none clashing with a
built-in. The verdict is one JSON line on stdout: {"ok": true, "v": 2, "tools": [declaration, ...],
"doc": "..."} (what the agent offers without running the skill) or {"ok": false, "error": "..."}. Whatever
the skill prints goes to stderr; a skill that calls sys.exit is rejected for it; one that kills the
process or loops is judged by the caller (exit status, timeout).

Importing a skill runs its code, so this process holds nothing worth taking and can change nothing
that lasts: the caller starts it confined as a call with no capability is (agents/sandbox.py: no
workspace, no home, no network, what it starts dies with it), with no credential in its environment,
in an empty folder of its own; before the skill is imported it also limits itself (CPU time, memory,
file size) and forbids itself every write outside that folder (Landlock). The verdict's line is
written by a process the skill's code ran in: the caller checks what it says (verdict_problem).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

from . import landlock

# The verdict's shape: a verdict of an older shape is checked again.
VERDICT_VERSION = 3  # 3: handlers checked for the (ctx, args) they are called with
# What a skill's tool may need: its call runs in a process of its own, confined as a terminal command
# is (agents/skillproc.py), where the agent's memory, board, children and skills are not.
SKILL_CAPABILITIES = ("fs.read", "fs.write", "network", "shell")
CPU_SECONDS = 15
MEMORY_BYTES = 4 << 30  # address space: generous, as numeric libraries reserve much more than they use
FILE_BYTES = 8 << 20


def confine(writable: Path) -> str:
    """Limit this process before it runs a skill; says how far it got ("landlock", or why not)."""
    for limit, value in ((resource.RLIMIT_CPU, CPU_SECONDS), (resource.RLIMIT_AS, MEMORY_BYTES),
                         (resource.RLIMIT_FSIZE, FILE_BYTES), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))  # the hard limit too: the skill cannot raise it again
    # Its own folder, and /dev/null, which libraries and subprocess.DEVNULL open for writing.
    return landlock.restrict([(str(writable), ~0), (os.devnull, landlock.WRITE_FILE | landlock.TRUNCATE)],
                             reads=False, network=False)


def check(path: Path, source: str) -> dict[str, Any]:
    """The verdict on the skill `source` (the bytes of `path` its caller read and will run)."""
    from . import builtins  # noqa: F401 - the built-in names a skill may not take
    from .tools import CAPABILITIES, REGISTRY, TOOL_NAME, collecting, schema_problem

    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        return {"ok": False, "error": f"syntax error at line {exc.lineno}: {exc.msg}"}
    namespace: dict[str, Any] = {"__name__": f"hermes_skill_{path.stem}", "__file__": str(path)}
    with collecting() as tools:
        try:
            exec(compile(tree, str(path), "exec"), namespace)
        except SystemExit as exc:
            return {"ok": False, "error": f"calls sys.exit({exc.code!r}) while loading"}
        except BaseException as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return {"ok": False, "error": f"{type(exc).__name__} while loading: {exc} (line {where.lineno})"}
    if not tools:
        return {"ok": False, "error": "registers no tool (call hermes_sup.agents.tools.register(Tool(...)))"}
    seen: set[str] = set()
    for tool in tools:
        if not isinstance(tool.name, str) or not TOOL_NAME.fullmatch(tool.name):
            return {"ok": False, "error": f"tool name {tool.name!r} must match [a-z][a-z0-9_]{{0,63}}"}
        if tool.name in REGISTRY:
            return {"ok": False, "error": f"tool {tool.name} clashes with the built-in tool of that name"}
        if tool.name in seen:
            return {"ok": False, "error": f"tool {tool.name} is registered twice"}
        seen.add(tool.name)
        if not callable(tool.handler):
            return {"ok": False, "error": f"tool {tool.name}: its handler is not callable"}
        problem = handler_problem(tool.handler, path)
        if problem:
            return {"ok": False, "error": f"tool {tool.name}: {problem}"}
        if not isinstance(tool.description, str) or not tool.description.strip():
            return {"ok": False, "error": f"tool {tool.name}: needs a description"}
        problem = schema_problem(tool.parameters)
        if problem:
            return {"ok": False, "error": f"tool {tool.name}: bad schema: {problem}"}
        unknown = [c for c in tool.capabilities if c not in CAPABILITIES]
        if unknown:
            return {"ok": False, "error": f"tool {tool.name}: unknown capability {unknown[0]!r}"}
        inside = [c for c in tool.capabilities if c not in SKILL_CAPABILITIES]
        if inside:
            return {"ok": False, "error": f"tool {tool.name}: a skill's tool runs in a sandbox of its own, without the "
                                          f"agent's {inside[0]}; it may declare {', '.join(SKILL_CAPABILITIES)}"}
        problem = _plain_problem(tool)
        if problem:
            return {"ok": False, "error": f"tool {tool.name}: {problem}"}
    return {"ok": True, "v": VERDICT_VERSION, "doc": (ast.get_docstring(tree) or "").strip().split("\n")[0],
            "tools": [declared(t) for t in tools]}


def handler_problem(handler: Any, path: Path) -> str:
    """Why `handler` cannot be called as every tool is, handler(ctx, args), or "": found when the skill
    is checked, not when a task's call fails with a TypeError three times over."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin without a signature: it is called and judged then
        return ""
    try:
        signature.bind(None, {})
    except TypeError as exc:
        name = getattr(handler, "__name__", "handler")
        code = getattr(handler, "__code__", None)
        where = f"{path}:{code.co_firstlineno}: " if code is not None else ""
        return f"{where}its handler {name}{signature} must take (ctx, args), its context and arguments: {exc}"
    return ""


def declared(tool: Any) -> dict[str, Any]:
    """What the agent offers and checks of a tool without running the skill (pure): its call runs
    in a process of its own (agents/skillproc.py)."""
    return {"name": tool.name, "description": tool.description, "capabilities": list(tool.capabilities),
            "parameters": tool.parameters, "idempotent": bool(tool.idempotent), "hidden": dict(tool.hidden),
            "cues": [str(cue) for cue in tool.cues], "opt_in": bool(tool.opt_in)}


def _plain_problem(tool: Any) -> str:
    """Why the tool's declaration cannot be carried as JSON to the agent, or ""."""
    if not isinstance(tool.hidden, dict) or not all(isinstance(cue, str) for cue in tool.cues):
        return "hidden must be a mapping and cues strings"
    if tool.prepare is not None:
        return "prepare is for built-in tools (it runs in the agent's process)"
    try:
        json.dumps([tool.parameters, tool.hidden], allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"its schema is not plain JSON: {exc}"
    return ""


def verdict_problem(verdict: Any) -> str:
    """Why a verdict cannot be taken as a check's, or "" (pure). The skill's code ran in the process
    that wrote it and could have written its own: what a forged one says must still be a skill's
    honest declaration (names, capabilities a confined call can have, schemas that check), so that
    it gains nothing and breaks no agent."""
    from .tools import TOOL_NAME, schema_problem

    if not isinstance(verdict, dict) or not isinstance(verdict.get("ok"), bool):
        return "no verdict"
    if not verdict["ok"]:
        return "" if isinstance(verdict.get("error"), str) else "a rejection without a reason"
    tools = verdict.get("tools")
    if verdict.get("v") != VERDICT_VERSION or not isinstance(verdict.get("doc", ""), str) \
            or not isinstance(tools, list) or not tools:
        return "not a verdict of this version"
    names = set()
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not TOOL_NAME.fullmatch(tool["name"]):
            return "a tool without a valid name"
        if tool["name"] in names:
            return f"tool {tool['name']} twice"
        names.add(tool["name"])
        caps = tool.get("capabilities")
        if not isinstance(caps, list) or any(c not in SKILL_CAPABILITIES for c in caps):
            return f"tool {tool['name']}: capabilities a skill's call cannot have"
        if not isinstance(tool.get("description"), str) or schema_problem(tool.get("parameters")) is not None:
            return f"tool {tool['name']}: no description or a schema that does not check"
        hidden, cues = tool.get("hidden"), tool.get("cues")
        if not isinstance(hidden, dict) or any(schema_problem(v) is not None for v in hidden.values()) \
                or not isinstance(cues, list) or not all(isinstance(c, str) for c in cues) \
                or not isinstance(tool.get("idempotent"), bool) or not isinstance(tool.get("opt_in"), bool):
            return f"tool {tool['name']}: hidden, cues or flags of the wrong kind"
    return ""


def main() -> int:
    """Check the skill whose source and path come as one JSON line on stdin; run by the agent's
    sandbox (agents/skillproc.check), as a call is."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the skill's own prints must not be taken for the verdict
    sys.stdout = sys.stderr
    try:
        request = json.loads(sys.stdin.readline())
        source, path = str(request["source"]), Path(str(request["file"]))
    except (ValueError, KeyError, TypeError):
        out.write(json.dumps({"ok": False, "error": "the check was given no skill"}) + "\n")
        return 0
    how = confine(Path.cwd())
    if how != "landlock":
        print(f"skillcheck: {how}; the check runs with resource limits only", file=sys.stderr)
    verdict = check(path, source)
    out.write(json.dumps(verdict) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
