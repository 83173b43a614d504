"""Keeping a conversation within the model's context: its estimated size, and the middle to summarize."""

from __future__ import annotations

import json
from typing import Any

from .providers import Provider
from .translate import Message

COMPRESS_AT = 0.8  # of the model's context window
KEEP_RECENT = 6    # messages kept verbatim at the end when the middle is summarized
SUMMARIZE = ("Summarize the work below for the agent that will continue it: what was found, what was done "
             "(files written, commands run), what failed, and what is left. Be concise and keep names, paths "
             "and numbers exact.")


def estimate_tokens(messages: list[Message]) -> int:
    """A pessimistic token count (3 characters a token) of a conversation, for deciding when to
    compress; the provider's own count only arrives after the call."""
    return sum(len(json.dumps(message, ensure_ascii=False)) for message in messages) // 3


def prompt_estimate(messages: list[Message], tools: list[dict[str, Any]] | None) -> int:
    """The estimated tokens of a call's prompt: the conversation and the tool definitions sent with it."""
    return estimate_tokens(messages) + estimate_tokens(tools or [])


def middle_to_summarize(messages: list[Message], keep_recent: int = KEEP_RECENT) -> tuple[int, int] | None:
    """The slice [start, end) to replace by a summary: after the system prompt and the task, before
    the last `keep_recent` messages, with its end moved back so that a tool result is never kept
    without the call it answers. None when there is too little to gain."""
    start = 2
    end = len(messages) - keep_recent
    while end > start and messages[end]["role"] == "tool":
        end -= 1
    return (start, end) if end - start >= 2 else None


def render_for_summary(messages: list[Message]) -> str:
    lines = []
    for message in messages:
        if message["role"] == "tool":
            lines.append(f"[result of {message.get('tool_call_id')}] {message.get('content')}")
            continue
        if message.get("content"):
            lines.append(f"[{message['role']}] {message['content']}")
        for call in message.get("tool_calls") or []:
            lines.append(f"[call {call['id']}] {call['function']['name']}({call['function'].get('arguments')})")
    return "\n".join(lines)


def window_of(provider: Provider) -> int:
    """A provider's context window, as its server reports it when it can (OpenAIProvider.context_window)."""
    measured = getattr(provider, "context_window", None)
    return measured() if callable(measured) else provider.config.context_window
