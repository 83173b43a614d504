"""Tool calls logged as started, then done with their result, so that a resumed task runs none twice.

The model's loop (agents/loop.py) and a task's steps (agents/steps.py) log their calls alike in the
agent's tool-call log; a call whose result is logged is not run again after a restart.
"""

from __future__ import annotations

from typing import Any

from ..kanban.journal import TaskJournal
from ..kanban.task import now_iso

ASK_HUMAN = "ask_human"
ASKS = (ASK_HUMAN, "kanban_block")  # the calls that block the task; a person's answer is their result
MAX_RESULT_CHARS = 20_000


def answer_since(task: dict[str, Any], moment: str) -> str | None:
    """The answer a person gave (`task answer`) to the task's question after `moment`, as the one
    who asked sees it, or None (pure). The latest answer wins."""
    answers = [c for c in task.get("comments") or [] if isinstance(c, dict) and c.get("answers")
               and isinstance(c.get("text"), str) and str(c.get("at") or "") > moment]
    if not answers:
        return None
    last = answers[-1]
    return f"{last.get('by', 'a person')} answered: {last['text']}"


def call_started(task_id: str, turn: str, call_id: str, tool: str, args: Any) -> dict[str, Any]:
    """The tool-call log's record of a call about to run (pure)."""
    return {"at": now_iso(), "task": task_id, "turn": turn, "call_id": call_id, "tool": tool, "args": args,
            "status": "started"}


def call_done(task_id: str, turn: str, call_id: str, tool: str, outcome: str, text: str, duration: float,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tool-call log's record of a call that ran, or was answered without running (pure); its
    result is cut to MAX_RESULT_CHARS."""
    return {"at": now_iso(), "task": task_id, "turn": turn, "call_id": call_id, "tool": tool, "status": "done",
            "outcome": outcome, "result": text[:MAX_RESULT_CHARS], **(extra or {}), "is_error": outcome != "ok",
            "duration_s": round(duration, 3)}


def logged_calls(journal: TaskJournal, turn: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The calls of a turn logged as done (their records) and as started (when)."""
    done, started = {}, {}
    for record in journal.tool_calls():
        if str(record.get("turn")) != turn:
            continue
        if record.get("status") == "done":
            done[record["call_id"]] = record
        elif record.get("status") == "started":
            started[record["call_id"]] = str(record.get("at") or "")
    return done, started
