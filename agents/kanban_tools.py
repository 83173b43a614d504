"""Hermes Agent's worker-side kanban tools (kanban_show, kanban_list, kanban_complete, kanban_block,
kanban_heartbeat), with Hermes' names and arguments, so a Hermes worker prompt works unchanged.

The model here: a task is worked by the agent that claimed it, and ends when its loop ends. So
`kanban_complete` and `kanban_block` act on the task in hand only (ending the loop: done with the
summary, or blocked with the reason as the question for a person); another agent's task is never
completed or blocked from here, and Hermes' orchestrator tools that move others' tasks
(kanban_unblock, kanban_link) are left out: a task blocked for a person waits for one. Hermes'
arguments with no counterpart here (`board`: one board per workspace) are accepted and said to be
ignored.
"""

from __future__ import annotations

import json
from typing import Any

from ..kanban.redact import scrub
from .tools import Finished, NeedsPerson, Tool, ToolContext, ToolError, register

# Hermes' statuses and this board's: a Hermes prompt filtering on `running` means `doing` here.
STATUS_FROM_HERMES = {"triage": "todo", "todo": "todo", "ready": "todo", "running": "doing", "blocked": "blocked",
                      "done": "done", "archived": "cancelled", "doing": "doing", "failed": "failed",
                      "cancelled": "cancelled"}
SHOWN_FIELDS = ("id", "title", "body", "status", "priority", "assignee", "role", "depends_on", "result", "error",
                "question", "created_at", "updated_at")
MAX_LIST = 200
BOARD_ARG = {"type": "string", "description": "accepted for Hermes Agent; ignored (one board per workspace)"}
TASK_ID = {"type": "string", "description": "the task's id (default: the task you are working on)"}


def board_of(ctx: ToolContext) -> Any:
    """The agent's board, or a ToolError for the model: an agent without one has no kanban tools."""
    if ctx.board is None:
        raise ToolError("this agent has no board")
    return ctx.board


def ignored(args: dict[str, Any], why: dict[str, str]) -> str:
    """A line naming the arguments given that have no effect here, and why (pure); empty if none."""
    said = [f"{name} ({reason})" for name, reason in why.items() if args.get(name) not in (None, "", [], {}, False)]
    return f"\n(ignored here: {'; '.join(said)})" if said else ""


def own_task(ctx: ToolContext, args: dict[str, Any], tool: str) -> str:
    """The task in hand, which the call must be about (its id given or left out)."""
    mine = (ctx.task or {}).get("id")
    asked = args.get("task_id") or mine
    if not mine:
        raise ToolError(f"{tool} works on the task you are working on, and there is none")
    if asked != mine:
        raise ToolError(f"{tool} works only on the task you are working on ({mine}), not on {asked}; "
                        "comment on other tasks with kanban_comment")
    return mine


def task_view(doc: dict[str, Any]) -> dict[str, Any]:
    """What kanban_show shows of a task (pure): its fields, and its comments by whom and when."""
    view = {key: doc.get(key) for key in SHOWN_FIELDS if doc.get(key) not in (None, "", [])}
    view["comments"] = [{"by": c.get("by"), "at": c.get("at"), "body": c.get("text")}
                        for c in doc.get("comments") or [] if isinstance(c, dict)]
    return view


def kanban_show(ctx: ToolContext, args: dict[str, Any]) -> str:
    from ..kanban import BoardError, TaskNotFound

    task_id = args.get("task_id") or (ctx.task or {}).get("id")
    if not task_id:
        raise ToolError("task_id is required: you are not working on a task")
    try:
        doc = board_of(ctx).get(task_id)
    except (BoardError, TaskNotFound) as exc:
        raise ToolError(str(exc)) from None
    return json.dumps(task_view(doc), ensure_ascii=False) + ignored(args, {"board": "one board per workspace"})


def kanban_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    from ..kanban import BoardError

    status = STATUS_FROM_HERMES[args["status"]] if args.get("status") else None
    try:
        listing = board_of(ctx).list(status)
    except BoardError as exc:
        raise ToolError(str(exc)) from None
    tasks = [doc for doc in listing.tasks if not args.get("assignee") or doc.get("assignee") == args["assignee"]]
    if not args.get("include_archived") and status != "cancelled":
        tasks = [doc for doc in tasks if doc.get("status") != "cancelled"]
    limit = min(int(args.get("limit") or 50), MAX_LIST)
    rows = [{key: doc.get(key) for key in ("id", "title", "status", "assignee", "priority", "depends_on")}
            for doc in tasks[:limit]]
    more = f"\n({len(tasks) - limit} more; raise limit, up to {MAX_LIST})" if len(tasks) > limit else ""
    return json.dumps(rows, ensure_ascii=False) + more + ignored(args, {
        "tenant": "no tenants in hermes-sup", "board": "one board per workspace"})


def kanban_complete(ctx: ToolContext, args: dict[str, Any]) -> str:
    """Ends the task in hand as done, with the summary as its result."""
    from ..kanban import BoardError, TaskNotFound

    mine = own_task(ctx, args, "kanban_complete")
    phantom = []
    for card in args.get("created_cards") or []:
        try:
            made_by = ((board_of(ctx).get(card).get("meta") or {}).get("created_by_task"))
        except (BoardError, TaskNotFound):
            made_by = None
        if made_by != mine:
            phantom.append(card)
    if phantom:
        raise ToolError(f"not completed: created_cards lists tasks this task did not create: {', '.join(phantom)} "
                        "(list only ids kanban_create gave you)")
    summary = str(args.get("summary") or args.get("result") or "").strip()
    parts = [summary or "done"]
    if args.get("metadata"):
        parts.append("metadata: " + json.dumps(args["metadata"], ensure_ascii=False, sort_keys=True))
    for key in ("artifacts", "created_cards"):
        if args.get(key):
            parts.append(f"{key.replace('_', ' ')}: {', '.join(args[key])}")
    raise Finished(scrub("\n".join(parts)))


def kanban_block(ctx: ToolContext, args: dict[str, Any]) -> str:
    """Blocks the task in hand until a person answers, with the reason as the question."""
    own_task(ctx, args, "kanban_block")
    reason = str(args["reason"]).strip()
    if not reason:
        raise ToolError("reason must say what you need or what stopped you")
    kind = args.get("kind")
    raise NeedsPerson(f"{reason} ({kind.replace('_', ' ')})" if kind else reason)


def kanban_heartbeat(ctx: ToolContext, args: dict[str, Any]) -> str:
    own_task(ctx, args, "kanban_heartbeat")
    # The agent's process sends its heartbeats itself while a tool runs; a note is kept as a comment.
    if args.get("note"):
        from ..kanban import BoardError, TaskError

        try:
            board_of(ctx).comment(ctx.task["id"], f"progress: {args['note']}", by=ctx.agent or "agent")  # type: ignore[index]
        except (BoardError, TaskError) as exc:
            raise ToolError(str(exc)) from None
        return "progress noted on the task (heartbeats are sent by the agent itself)"
    return "alive (heartbeats are sent by the agent itself; nothing to do)"


register(Tool("kanban_show", "Show a task: its fields, result and comments (default: the task you work on).",
              kanban_show, {"type": "object", "properties": {"task_id": TASK_ID},
                            "additionalProperties": False},
              capabilities=("kanban",), idempotent=True, toolset="kanban", opt_in=True, hidden={"board": BOARD_ARG}))
register(Tool("kanban_list", "List the board's tasks (id, title, status, assignee), filtered by assignee or status.",
              kanban_list, {"type": "object", "properties": {
                  "assignee": {"type": "string"},
                  "status": {"type": "string", "enum": list(STATUS_FROM_HERMES),
                             "description": "Hermes' names (ready, running, archived) are this board's todo, doing, "
                                            "cancelled"},
                  "include_archived": {"type": "boolean"},
                  "limit": {"type": "integer", "minimum": 1, "description": f"default 50, at most {MAX_LIST}"},
                  }, "additionalProperties": False},
              capabilities=("kanban",), idempotent=True, toolset="kanban", opt_in=True,
              hidden={"board": BOARD_ARG, "tenant": {"type": "string"}}))
register(Tool("kanban_complete", "Finish the task you are working on: it is done, with summary as its result "
              "(your turn ends here).", kanban_complete, {"type": "object", "properties": {
                  "task_id": TASK_ID, "summary": {"type": "string", "description": "the handoff, 1-3 sentences"},
                  "result": {"type": "string", "description": "older name of summary"},
                  "metadata": {"type": "object", "description": "structured facts, kept with the result"},
                  "created_cards": {"type": "array", "items": {"type": "string"},
                                    "description": "ids of the tasks you created with kanban_create"},
                  "artifacts": {"type": "array", "items": {"type": "string"},
                                "description": "files you produced, named in the result"},
                  }, "additionalProperties": False},
              capabilities=("kanban",), toolset="kanban", opt_in=True, hidden={"board": BOARD_ARG}))
register(Tool("kanban_block", "Block the task you are working on until a person answers: reason is the question.",
              kanban_block, {"type": "object", "properties": {
                  "task_id": TASK_ID, "reason": {"type": "string", "minLength": 1},
                  "kind": {"type": "string", "enum": ["dependency", "needs_input", "capability", "transient"]},
                  }, "required": ["reason"], "additionalProperties": False},
              capabilities=("kanban",), toolset="kanban", opt_in=True, hidden={"board": BOARD_ARG}))
register(Tool("kanban_heartbeat", "Say you are still working on your task; a note is kept as a comment.",
              kanban_heartbeat, {"type": "object", "properties": {
                  "task_id": TASK_ID, "note": {"type": "string"}},
                  "additionalProperties": False},
              capabilities=("kanban",), toolset="kanban", opt_in=True, hidden={"board": BOARD_ARG}))
