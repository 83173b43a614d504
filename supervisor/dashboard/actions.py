"""The page's actions, each done by the same board verb or supervisor command the CLI uses, so each
is recorded in events as the CLI's is (`by` says "dashboard"). Bodies are hostile until checked."""

from __future__ import annotations

from typing import Any

from ...kanban import BoardStore
from ...kanban.prefix import resolve_task_id
from ..cliargs import MAX_PRIORITY
from ..config.workspace import Workspace
from ..runner import request

BY = "dashboard"
AGENT_COMMANDS = frozenset({"restart", "stop", "start"})
TASK_COMMANDS = frozenset({"cancel", "retry", "comment", "answer"})
MAX_COMMENT = 1 << 20  # as `task comment`: the board refuses more


class ActionError(Exception):
    """A request the user can fix: its status code and message go back as JSON."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _text(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise ActionError(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise ActionError(f"{name} must be text")
    return value


def task_fields(body: Any) -> dict[str, Any]:
    """The fields of `task add` from a JSON body (pure); the board checks them further."""
    if not isinstance(body, dict):
        raise ActionError("the body must be a JSON object")
    title = _text(body, "title", required=True)
    assert title is not None
    if not title.strip():
        raise ActionError("title must not be blank")
    fields: dict[str, Any] = {"title": title, "body": _text(body, "body") or ""}
    for name in ("assignee", "role", "tier", "id"):
        value = _text(body, name)
        if value is not None:
            fields[name] = value
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        raise ActionError(f"priority must be a whole number from -{MAX_PRIORITY} to {MAX_PRIORITY}")
    fields["priority"] = priority
    depends = body.get("depends_on", [])
    if not isinstance(depends, list) or not all(isinstance(dep, str) for dep in depends):
        raise ActionError("depends_on must be a list of task ids")
    fields["depends_on"] = depends
    if "steps" in body and body["steps"] is not None:
        if not isinstance(body["steps"], list):
            raise ActionError("steps must be a list of {tool, args}")
        fields["steps"] = body["steps"]
    return fields


def add_task(board: BoardStore, body: Any) -> dict[str, Any]:
    fields = task_fields(body)
    board.ingest()
    return board.add(fields, by=BY)


def change_task(board: BoardStore, task_id: str, command: str, body: Any) -> dict[str, Any]:
    """cancel, retry, comment or answer one task, as `task cancel|retry|comment|answer`."""
    if command not in TASK_COMMANDS:
        raise ActionError(f"no task action {command!r}", 404)
    board.ingest()
    found = resolve_task_id(board, task_id)
    if command == "cancel":
        return board.cancel(found, by=BY)
    if command == "retry":
        return board.retry(found, by=BY)
    text = _text(body if isinstance(body, dict) else {}, "text", required=True)
    assert text is not None
    if not text.strip():
        raise ActionError("text must not be blank")
    if command == "comment":
        if len(text.encode()) > MAX_COMMENT:
            raise ActionError("the comment is over 1 MiB", 413)
        return board.comment(found, text, by=BY)
    return board.answer(found, text, by=BY)


def agent_command(ws: Workspace, agent: str, command: str) -> dict[str, Any]:
    """restart, stop or start one agent through the supervisor's control socket, as the CLI does."""
    if command not in AGENT_COMMANDS:
        raise ActionError(f"no agent action {command!r}", 404)
    from .views import supervisor_state

    _state, alive = supervisor_state(ws)
    if not alive:
        raise ActionError(f"hermes-sup is not running in {ws.root}; start it with `hermes-sup up`", 409)
    try:
        reply = request(ws.runs_path, {"cmd": command, "agent": agent}, timeout=10)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ActionError("the supervisor did not answer on its control socket", 502)
    message = str(reply.get("message", "ok" if reply.get("ok") else "refused"))
    if not reply.get("ok"):
        raise ActionError(message, 404 if message.startswith("no agent named") else 409)
    return {"ok": True, "message": message}

