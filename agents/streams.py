"""Streamed answers put back together, as pure functions over the decoded server-sent events.

Each function folds a stream into the body the same API returns without streaming, so one reader
(`translate.from_openai` / `from_anthropic`) serves both and a streamed turn lands in the transcript
exactly as a plain one would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..kanban.parse import load_json


def assemble_openai(chunks: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """`chat.completion.chunk` objects -> one `chat.completion`. Tool-call deltas are joined by
    their `index` (the id and name come once, the arguments in pieces); usage arrives in a last
    chunk with no choices when `stream_options.include_usage` is set."""
    response: dict[str, Any] = {"id": "", "object": "chat.completion", "model": "", "usage": None}
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        response["id"] = chunk.get("id") or response["id"]
        response["model"] = chunk.get("model") or response["model"]
        if chunk.get("usage"):
            response["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            finish = choice.get("finish_reason") or finish
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(int(piece.get("index", len(calls))),
                                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = piece.get("id") or call["id"]
                function = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    response["choices"] = [{"index": 0, "message": message, "finish_reason": finish}]
    return response


def assemble_anthropic(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Messages API stream events -> one `message`. Text blocks grow by `text_delta`, tool_use
    blocks by `input_json_delta` pieces of their JSON input; the stop reason and the output token
    count come in `message_delta`."""
    message: dict[str, Any] = {"type": "message", "role": "assistant", "content": [], "stop_reason": None,
                               "usage": {}}
    partial: dict[int, list[str]] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            start = event.get("message") or {}
            message.update({key: value for key, value in start.items() if key != "content"})
            message["usage"] = dict(start.get("usage") or {})
        elif kind == "content_block_start":
            index = int(event.get("index", len(message["content"])))
            block = dict(event.get("content_block") or {})
            if block.get("type") == "tool_use":
                partial[index] = []
            while len(message["content"]) <= index:
                message["content"].append({})
            message["content"][index] = block
        elif kind == "content_block_delta":
            index, delta = int(event.get("index", 0)), event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block = message["content"][index]
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                partial.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "content_block_stop":
            index = int(event.get("index", 0))
            if index in partial:
                text = "".join(partial.pop(index))
                try:
                    message["content"][index]["input"] = load_json(text) if text.strip() else {}
                except ValueError:
                    # Kept as the text it is: the loop answers the model that its arguments are
                    # not a JSON object, as it does for a plain answer with broken arguments.
                    message["content"][index]["input"] = text
        elif kind == "message_delta":
            message["stop_reason"] = (event.get("delta") or {}).get("stop_reason") or message["stop_reason"]
            message["usage"].update({key: value for key, value in (event.get("usage") or {}).items()
                                     if value is not None})
    return message
