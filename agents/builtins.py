"""The built-in tools, named and shaped as Hermes Agent names them where it has one: the small ones
are here; the file tools, `terminal`, the skill tools and `delegate_task` live in their own modules,
imported here so that importing this module registers every built-in."""

from __future__ import annotations

import contextlib
from typing import Any

from . import delegation, files, kanban_tools, skills, terminal  # noqa: F401 - they register their tools
from .grants import grants_of
from .offer import ASKING, COMMENTING, PLANNING, WAITING
from .telemetry import trace_meta
from .tools import NeedsPerson, Tool, ToolContext, ToolError, register


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def wait(ctx: ToolContext, args: dict[str, Any]) -> str:
    seconds = float(args["seconds"])
    if ctx.stop.wait(timeout=max(0.0, seconds)):
        raise InterruptedError
    return f"waited {seconds:g} s"


def memory(ctx: ToolContext, args: dict[str, Any]) -> str:
    from .memory import MemoryEntryError

    if ctx.memory is None:
        raise ToolError("this agent has no memory file")
    try:
        return ctx.memory.change(args.get("action"), content=args.get("content"), old_text=args.get("old_text"),
                                 target=args.get("target") or "memory", operations=args.get("operations"))
    except MemoryEntryError as exc:
        raise ToolError(str(exc)) from None


def ask_human(ctx: ToolContext, args: dict[str, Any]) -> str:
    raise NeedsPerson(args["question"].strip())


def created_by(ctx: ToolContext) -> dict[str, Any]:
    """What a task an agent makes records of its maker (pure): the task it worked on, its name, and
    the capabilities of the call and the folders it may use, so the new task's steps never run with
    more (agents/steps.py). Taken from the context, never from the arguments, which the model writes."""
    meta: dict[str, Any] = {"created_by": ctx.agent or "agent", "capabilities": list(ctx.grants or ()),
                            "folders": {g.name: {"path": str(g.path), "mode": g.mode} for g in grants_of(ctx.settings)}}
    if ctx.task:
        meta["created_by_task"] = ctx.task["id"]
    return meta


KANBAN_CREATE_FIELDS = ("id", "title", "body", "priority", "depends_on", "role", "assignee", "tier", "steps")
# Hermes Agent's kanban_create arguments that have no counterpart here, and why.
HERMES_CREATE_IGNORED = {
    "tenant": "no tenants in hermes-sup", "workspace_kind": "each agent works in its own folder",
    "workspace_path": "each agent works in its own folder", "project": "no projects in hermes-sup",
    "triage": "tasks go straight to todo", "max_runtime_seconds": "bounded by the agent's limits instead",
    "initial_status": "a new task starts in todo", "goal_mode": "no goal loop in hermes-sup",
    "goal_max_turns": "no goal loop in hermes-sup", "board": "one board per workspace"}


def hermes_fields(args: dict[str, Any]) -> dict[str, Any]:
    """The task fields of a kanban_create call, Hermes' arguments mapped to this board's (pure):
    `parents` are depends_on, `skills` are named in the body for the worker to read first, and an
    `idempotency_key` is kept in meta so the same key finds the same task."""
    fields = {key: args[key] for key in KANBAN_CREATE_FIELDS if key in args}
    parents = [*args.get("depends_on", []), *args.get("parents", [])]
    if parents:
        fields["depends_on"] = list(dict.fromkeys(parents))
    if args.get("skills"):
        fields["body"] = (str(fields.get("body") or "") + "\n\nSkills to read first (skill_view): "
                          + ", ".join(args["skills"])).strip()
    return fields


def _same_key(board: Any, key: str) -> dict[str, Any] | None:
    for doc in board.list().tasks:
        if (doc.get("meta") or {}).get("idempotency_key") == key and doc.get("status") != "cancelled":
            return doc
    return None


def kanban_create(ctx: ToolContext, args: dict[str, Any]) -> str:
    from ..kanban import BoardError, TaskError, TaskNotFound

    fields = hermes_fields(args)
    fields["meta"] = {**created_by(ctx), **trace_meta()}  # trace_meta: the new task joins this attempt's trace
    board = kanban_tools.board_of(ctx)
    note = kanban_tools.ignored(args, HERMES_CREATE_IGNORED)
    if args.get("idempotency_key"):
        fields["meta"]["idempotency_key"] = args["idempotency_key"]
        existing = _same_key(board, args["idempotency_key"])
        if existing is not None:
            return f"created task {existing['id']}: {existing['title']} (it was already on the board){note}"
    try:
        doc = board.add(fields, by=ctx.agent or "agent")
    except (BoardError, TaskError) as exc:
        # With its own id, creating a task is safe to repeat: the same task made by the same parent
        # (a step or a call run again after a crash) is the one asked for.
        if "id" in args:
            with contextlib.suppress(TaskNotFound):
                existing = board.get(args["id"])
                if (existing.get("meta") or {}).get("created_by_task") == fields.get("meta", {}).get(
                        "created_by_task") and existing["title"] == args["title"]:
                    return f"created task {existing['id']}: {existing['title']} (it was already on the board)"
        raise ToolError(f"the board refused the task: {exc}") from None
    return f"created task {doc['id']}: {doc['title']}{note}"


def kanban_comment(ctx: ToolContext, args: dict[str, Any]) -> str:
    from ..kanban import BoardError, TaskError

    try:
        text = args.get("body", args.get("text"))  # body: Hermes' name; text: this board's
        if not isinstance(text, str) or not text.strip():
            raise ToolError("the comment is empty: give body (or text)")
        kanban_tools.board_of(ctx).comment(args["task_id"], text, by=ctx.agent or "agent")
    except (BoardError, TaskError) as exc:
        raise ToolError(str(exc)) from None
    return f"commented on {args['task_id']}"


register(Tool("wait", "Wait a number of seconds.", wait,
              {"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0}}, "required": ["seconds"]},
              capabilities=("fs.read",), idempotent=True, toolset="board", cues=WAITING))
MEMORY_OPERATION = {"type": "object", "properties": {
    "action": {"type": "string", "enum": ["add", "replace", "remove"]},
    "content": _string("the fact"),
    "old_text": _string("part of the entry to change")},
    "required": ["action"], "additionalProperties": False}
register(Tool("memory", "Keep a fact across tasks (add), or replace or remove the entry holding old_text.",
              memory, {"type": "object", "properties": MEMORY_OPERATION["properties"],
                       "additionalProperties": False},
              capabilities=("memory",), toolset="memory",
              hidden={"operations": {"type": "array", "items": MEMORY_OPERATION},
                      "target": {"type": "string", "enum": ["memory", "user"]}}))
register(Tool("ask_human", "Ask a person, only when you cannot go on without their answer.", ask_human,
              {"type": "object", "properties": {"question": _string("what you need to know", minLength=1)},
               "required": ["question"], "additionalProperties": False},
              capabilities=("kanban",), toolset="board", cues=ASKING))
register(Tool("kanban_create", "Add a task to the team's board (a follow-up or a sub-task); returns its id.",
              kanban_create,
              {"type": "object", "properties": {
                  "title": _string("one line", minLength=1), "body": _string("the instruction"),
                  "priority": {"type": "integer"}, "depends_on": {"type": "array", "items": {"type": "string"}},
                  "role": _string("only agents with this role take it"),
                  "assignee": _string("only this agent takes it"),
                  "id": _string("your own id (a-z, 0-9, -), for depends_on")},
                  "required": ["title"], "additionalProperties": False},
              capabilities=("kanban",), toolset="board", cues=PLANNING, hidden={
                  # Seldom what a model needs; accepted all the same (a planner's prompt may name them).
                  "tier": {"type": "string", "enum": ["auto", "cheap", "standard", "premium"]},
                  "steps": {"type": "array", "items": {"type": "object"}},
                  "parents": {"type": "array", "items": {"type": "string"}},
                  "skills": {"type": "array", "items": {"type": "string"}}, "idempotency_key": {"type": "string"},
                  **{name: {"type": ["string", "integer", "boolean"]} for name in HERMES_CREATE_IGNORED}}))
register(Tool("kanban_comment", "Add a comment to a task on the board.", kanban_comment,
              {"type": "object", "properties": {"task_id": _string("the task's id", minLength=1),
                                                "text": _string("the comment", minLength=1)},
               "required": ["task_id"], "additionalProperties": False},
              capabilities=("kanban",), idempotent=False, toolset="board", cues=COMMENTING,
              hidden={"body": {"type": "string", "minLength": 1}, "board": {"type": "string"}}))
