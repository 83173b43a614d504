"""The tool registry and the checks around every call.

Each tool registers itself (name, description, JSON schema of its arguments, handler, the
capabilities it needs, whether it is safe to repeat) into `REGISTRY`, a plain dict filled by
explicit `register` calls: the built-ins in agents/builtins.py, skills by their own files. An agent
sees its tools through a `Toolbox`: the registered tools, plus the skills it enables, narrowed to
its toolsets. A call is refused, with a result that says why, when the tool is unknown, when the
agent lacks one of its capabilities, or when its arguments do not match its schema; the handler
runs only after those checks, and anything it raises becomes an error result.

Imports nothing of the supervisor; the handlers' modules import this one, never the reverse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..kanban.redact import scrub

CAPABILITIES = ("fs.read", "fs.write", "shell", "network", "memory", "delegate", "skills", "kanban")
DEFAULT_CAPABILITIES = ("fs.read", "fs.write", "memory", "kanban")
TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
JSON_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
              "boolean": bool, "null": type(None)}


class ToolError(Exception):
    """A tool call that failed in a way the caller (a task's steps, or the model) should be told."""


class Refused(ToolError):
    """A call that was not made: unknown tool, a capability the agent lacks, bad arguments."""


class NeedsPerson(Exception):
    """Raised by ask_human (and kanban_block): the task is blocked until a person answers."""


class Finished(Exception):
    """Raised by kanban_complete: the task in hand is done, with this summary as its result."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


@dataclass(frozen=True)
class ToolContext:
    """What a handler may use. Everything is optional but the scratch folder and the stop event,
    so a tool can be run by a test, a task's steps or the loop alike."""
    scratch: Path
    stop: threading.Event
    memory: Any = None              # agents.memory.MemoryFile
    board: Any = None               # kanban.Board
    agent: str = ""
    task: dict[str, Any] | None = None
    llm: Callable[[str, str], str] | None = None  # (tier, prompt) -> text, for tools that ask a model
    settings: dict[str, Any] = field(default_factory=dict)  # the agent's config (terminal, delegation)
    services: dict[str, Any] = field(default_factory=dict)  # skills, delegation: set by the agent
    # The capabilities the work in hand runs with (a task's steps may get fewer than the agent has).
    # Toolbox.call narrows it to its own grants, so a handler that hands rights on (kanban_create
    # recording them on a new task, delegate_task starting a child) never passes on more than this.
    grants: tuple[str, ...] | None = None
    workspace: Path | None = None  # hidden from commands (agents/sandbox.py): .env, runs/, the board


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    handler: Callable[[ToolContext, dict[str, Any]], Any]
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    capabilities: tuple[str, ...] = ()
    idempotent: bool = False
    toolset: str = ""  # the group an agent's `toolsets` names: files, terminal, memory, board, skills, ...
    # Called for every call of a turn before the calls run one by one (delegate_task starts its
    # child there, so the children of one turn work in parallel).
    prepare: Callable[[ToolContext, dict[str, Any]], None] | None = None
    # Arguments accepted (and checked) but not offered to the model: Hermes Agent's names and
    # options, so its prompts and skills work, without their cost in every call's tool definitions.
    hidden: dict[str, Any] = field(default_factory=dict)
    # Offered only to an agent whose `toolsets` name this tool's toolset (Hermes' worker tools).
    opt_in: bool = False
    # Word beginnings that call for the tool in a task (agents/offer.py); none: always offered.
    cues: tuple[str, ...] = ()

    def accepted(self) -> dict[str, Any]:
        """The schema a call's arguments are checked against: the offered one and the hidden arguments."""
        if not self.hidden:
            return self.parameters
        return {**self.parameters, "properties": {**(self.parameters.get("properties") or {}), **self.hidden}}

    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI function definition, without the keywords only the check before a
        call needs (they cost every call their tokens and tell the model nothing it must know)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": lean(self.parameters)}}


# Enforced by args_problem before every call, so the model need not read them.
CHECK_ONLY = frozenset({"additionalProperties", "minLength", "maxLength", "minimum", "maximum",
                        "minItems", "maxItems", "pattern"})


def lean(schema: Any) -> Any:
    """`schema` without CHECK_ONLY keywords, at every depth (pure)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in CHECK_ONLY:
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: lean(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = lean(value)
        else:
            out[key] = value
    return out


REGISTRY: dict[str, Tool] = {}
_collecting: list[list[Tool]] = []


# Tools Hermes Agent's workers call that have no counterpart here, and what to do instead: a call is
# refused with this, never with a bare "unknown tool".
HERMES_ONLY = {
    "todo": "keep the plan in your answer, or in a file of your task folder (write_file)",
    "process": "run a long command with terminal and background: true (its output goes to a log file in your "
               "task folder); there is no process control beyond that",
    "execute_code": "run the code with terminal (python3 -c ..., or a file you wrote)",
    "kanban_unblock": "a task blocked for a person waits for one (they answer it: hermes-sup task answer)",
    "kanban_link": "a task's dependencies are set when it is made: kanban_create with parents",
    "kanban_attach": "write the file into your task folder (write_file) and name it in your result",
    "kanban_attach_url": "name the URL in your result or a comment (kanban_comment)",
    "kanban_attachments": "the task's files are in your task folder: search_files lists them",
    "session_search": "earlier conversations are not kept across tasks; what lasts is memory (the memory tool)",
    "clarify": "ask a person with ask_human (the task waits for the answer)",
}


def register(tool: Tool) -> Tool:
    """Add a tool. While a skill file is being loaded, its tools are collected for it instead of
    going into the shared registry."""
    if _collecting:
        _collecting[-1].append(tool)
    else:
        REGISTRY[tool.name] = tool
    return tool


@contextlib.contextmanager
def collecting() -> Iterator[list[Tool]]:
    tools: list[Tool] = []
    _collecting.append(tools)
    try:
        yield tools
    finally:
        _collecting.pop()


# -- argument schemas (a JSON Schema subset: what tool definitions use) --------------------------

def schema_problem(schema: Any, where: str = "parameters") -> str | None:
    """Why `schema` is not a usable definition of a tool's arguments, or None (pure)."""
    if not isinstance(schema, dict):
        return f"{where} must be a JSON schema object"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if any(k not in JSON_TYPES for k in kinds):
        return f"{where}: unknown type {kind!r}"
    if where == "parameters" and kind != "object":
        return "parameters must have type 'object'"
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return f"{where}.properties must be a mapping"
    for name, sub in properties.items():
        problem = schema_problem(sub, f"{where}.properties.{name}")
        if problem:
            return problem
    required = schema.get("required", [])
    if not isinstance(required, list) or any(item not in properties for item in required):
        return f"{where}.required must list names defined in properties"
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{where}.enum must be a list"
    if "items" in schema:
        return schema_problem(schema["items"], f"{where}.items")
    return None


def args_problem(schema: dict[str, Any], value: Any, where: str = "") -> str | None:
    """The first way `value` fails `schema`, in words, or None (pure)."""
    label = where or "arguments"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    if kinds and not any(_is(value, k) for k in kinds):
        return f"{label} must be {' or '.join(kinds)}, got {_json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{label} must be one of {', '.join(map(str, schema['enum']))}, got {value!r}"
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                return f"{label + '.' if where else ''}{name} is required"
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(properties))
            if extra:
                return f"unknown argument{'s' if len(extra) > 1 else ''}: {', '.join(extra)}"
        for name, item in value.items():
            if name in properties:
                problem = args_problem(properties[name], item, f"{where}.{name}" if where else name)
                if problem:
                    return problem
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problem = args_problem(schema["items"], item, f"{label}[{index}]")
            if problem:
                return problem
    if _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{label} must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{label} must be <= {schema['maximum']}, got {value}"
    if isinstance(value, str) and "minLength" in schema and len(value) < schema["minLength"]:
        return f"{label} must not be empty" if schema["minLength"] == 1 else f"{label} is too short"
    return None


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, JSON_TYPES[kind])


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _is(value, name):
            return name
    return type(value).__name__


# -- an agent's view ------------------------------------------------------------------------------

@dataclass
class Toolbox:
    """The tools one agent may see and call: the registry plus its skills' tools, narrowed to its
    toolsets; calls checked against its granted capabilities."""
    grants: tuple[str, ...] = DEFAULT_CAPABILITIES
    toolsets: tuple[str, ...] | None = None  # None: every toolset
    extra: dict[str, Tool] = field(default_factory=dict)  # tools of the skills this agent enables
    whose: str = "this agent"  # who lacks a capability, in a refusal ("this task's steps", ...)

    def tools(self) -> dict[str, Tool]:
        # A built-in always wins over a skill's tool of the same name: a skill that registers another
        # tool when it is loaded than when it was checked cannot stand in for read_file, say.
        merged = {**self.extra, **REGISTRY}
        if self.toolsets is None:
            return {name: tool for name, tool in merged.items() if not tool.opt_in}
        return {name: tool for name, tool in merged.items() if tool.toolset in self.toolsets}

    def allowed(self, tool: Tool) -> bool:
        return all(capability in self.grants for capability in tool.capabilities)

    def usable(self) -> tuple[str, ...]:
        """The granted capabilities some tool of this toolbox can use: what a handler may hand on
        (kanban_create records it on a new task, delegate_task gives it to a child). An agent whose
        `toolsets` leave out `terminal` has no use of `shell`, and must not get it used for it by a
        teammate running the steps it wrote."""
        if self.toolsets is None:
            return self.grants
        used = {c for tool in self.tools().values() if self.allowed(tool) for c in tool.capabilities}
        return tuple(c for c in self.grants if c in used)

    def callable(self) -> dict[str, Tool]:
        """The tools this agent may call: its toolsets' tools it has every capability of."""
        return {name: tool for name, tool in self.tools().items() if self.allowed(tool)}

    def schemas(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The definitions of the tools this agent may call (of those `names` only, when given), in
        a stable order (provider caches need byte-identical prompts)."""
        tools = self.callable()
        wanted = set(tools) if names is None else set(names)
        return [tools[name].schema() for name in sorted(tools) if name in wanted]

    def get(self, name: str) -> Tool | None:
        return self.tools().get(name)

    def check(self, name: str, args: Any) -> Tool:
        """The tool to run, or Refused saying why the call may not be made."""
        tool = self.get(name)
        if tool is None:
            known = sorted(n for n, t in self.tools().items() if self.allowed(t))
            if name in HERMES_ONLY:  # a Hermes Agent prompt or skill that names it: say what to use here
                raise Refused(f"{name} is Hermes Agent's tool and has no counterpart here: {HERMES_ONLY[name]}")
            raise Refused(f"unknown tool {name!r}; this agent's tools are: {', '.join(known)}")
        missing = [capability for capability in tool.capabilities if capability not in self.grants]
        if missing:
            raise Refused(f"refused: {name} needs the {', '.join(missing)} capabilit"
                          f"{'ies' if len(missing) > 1 else 'y'}, which {self.whose} is not granted")
        if not isinstance(args, dict):
            raise Refused(f"refused: the arguments of {name} must be a JSON object")
        try:
            problem = args_problem(tool.accepted(), args)
        except Exception as exc:  # a schema from elsewhere (an MCP server's) that cannot check
            raise Refused(f"refused: {name}'s own definition cannot check these arguments "
                          f"({type(exc).__name__}); the call was not made") from None
        if problem:
            raise Refused(f"refused: invalid arguments for {name}: {problem}")
        return scrubbing(tool)  # what it returns or raises goes to the model and the logs: no key in it

    def call(self, ctx: ToolContext, name: str, args: Any) -> Any:
        """Check, then run. ToolError (Refused included) and NeedsPerson go to the caller; any other
        exception of the handler is turned into a ToolError naming it."""
        tool = self.check(name, args)
        grants = tuple(c for c in self.usable() if ctx.grants is None or c in ctx.grants)
        try:
            return tool.handler(dataclasses.replace(ctx, grants=grants), args)
        except (ToolError, NeedsPerson, Finished, InterruptedError):
            raise
        except Exception as exc:
            raise ToolError(f"{name} raised {type(exc).__name__}: {exc}") from exc


def run_step(ctx: ToolContext, step: dict[str, Any], toolbox: Toolbox) -> Any:
    """One step of a task's deterministic plan."""
    if not isinstance(step, dict):
        raise Refused("a step must be a mapping with 'tool' and 'args'")
    return toolbox.call(ctx, str(step.get("tool", "")), step.get("args") or {})


# -- keys out of what tools hand back ---------------------------------------------------------------

def scrubbed(value: Any) -> Any:
    """A tool's result without any key this process knows: a `cat .env` in the terminal, or a file
    read, must not hand the model (and through it a fetched URL) a key."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {key: scrubbed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrubbed(item) for item in value]
    return value


def scrubbing(tool: Tool) -> Tool:
    """`tool` whose results and errors are scrubbed (see scrubbed)."""
    handler = tool.handler

    def run(ctx: ToolContext, args: dict[str, Any]) -> Any:
        try:
            return scrubbed(handler(ctx, args))
        except ToolError as exc:
            text = scrub(str(exc))
            if text != str(exc):
                exc.args = (text,)
            raise
        except (NeedsPerson, Finished, InterruptedError):
            raise
        except Exception as exc:  # named as Toolbox.call names it, without the key its text may hold
            raise ToolError(scrub(f"{tool.name} raised {type(exc).__name__}: {exc}")) from exc

    return dataclasses.replace(tool, handler=run)
