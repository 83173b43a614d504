"""What the model is first told: the system prompt, and the task with its inputs and comments."""

from __future__ import annotations

import json
from typing import Any

INPUT_CHARS = 8_000       # of each dependency's result in the task's first message, and of each comment
COMMENT_CHARS = 32_000    # of all the comments in it (the latest are kept)


def system_prompt(identity: str, skills_block: str = "") -> str:
    """The system message: what stays the same across an agent's calls and tasks, and across the
    agents of one entry. A server renders the tool definitions right after it, so a prefix cache
    reuses both; what changes (memory, the task) comes in the first user message, after them."""
    parts = [identity.strip() or "You are an agent on a team. Work the task you are given.",
             "Use the tools when they help. When the task is done, answer with the result as your final "
             "message, without calling a tool. If you cannot go on without a person, call ask_human."]
    parts += [skills_block] if skills_block else []
    return "\n\n".join(parts)


def task_prompt(task: dict[str, Any], inputs: list[dict[str, Any]] | None = None) -> str:
    """The task as the model first sees it: title, body, the results of the tasks it depends on
    (how work planned on the board flows from one agent to the next), and people's comments."""
    body = (task.get("body") or "").strip()
    parts = [f"Task {task['id']}: {task['title']}" + (f"\n\n{body}" if body else "")]
    if inputs:
        parts.append("Results of the tasks this one depends on:")
        for dep in inputs:
            result = dep.get("result")
            if isinstance(result, dict) and set(result) == {"answer"}:
                result = result["answer"]
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
            parts.append(f"## {dep['id']}: {dep.get('title', '')}\n{text[:INPUT_CHARS]}")
    comments = [c for c in task.get("comments") or [] if isinstance(c, dict) and isinstance(c.get("text"), str)
                and c["text"]]
    if comments:
        parts.append("Comments on this task:\n" + comment_block(comments))
    return "\n\n".join(parts)


def comment_block(comments: list[dict[str, Any]]) -> str:
    """The latest comments, each cut to INPUT_CHARS and together to COMMENT_CHARS (pure). Anyone
    with `kanban` may comment on any task, up to tens of MiB: all of it in the first message would
    make every call of the task fail, or cost what a prompt that size costs, at every attempt."""
    shown: list[str] = []
    used = 0
    for comment in reversed(comments):
        text = comment["text"]
        line = f"- {comment.get('by', '?')}: {text[:INPUT_CHARS]}" + (
            f" [... {len(text) - INPUT_CHARS:,} characters cut]" if len(text) > INPUT_CHARS else "")
        if shown and used + len(line) > COMMENT_CHARS:
            break
        shown.append(line)
        used += len(line)
    left_out = len(comments) - len(shown)
    return "\n".join(([f"[{left_out} earlier comment(s) left out]"] if left_out else []) + shown[::-1])
