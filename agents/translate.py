"""Message translation between the OpenAI chat format (the runtime's own, and the transcript's) and
Anthropic's Messages API, as pure functions over plain dicts. The SDKs' response objects are turned
into dicts (`model_dump()`) before they get here, so everything is tested without a network.

Canonical messages:
  {"role": "system" | "user", "content": str}
  {"role": "assistant", "content": str | None, "tool_calls": [{"id", "type": "function",
   "function": {"name", "arguments": <JSON string>}}]}
  {"role": "tool", "tool_call_id": str, "content": str, "is_error"?: bool}
`is_error` is ours: Anthropic has a field for it, OpenAI does not (it is dropped there).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..kanban.parse import load_json
from .textcalls import text_tool_calls as text_tool_calls  # re-exported: callers knew it from here

Message = dict[str, Any]
CACHE = {"type": "ephemeral"}


@dataclass(frozen=True)
class Usage:
    input: int = 0        # every prompt token, cached or not
    output: int = 0
    cached: int = 0       # prompt tokens read from the provider's cache
    cache_write: int = 0  # prompt tokens written to it (Anthropic)
    estimated: bool = False  # the server reported none: see fallback.estimate_usage


@dataclass(frozen=True)
class Completion:
    message: Message      # a canonical assistant message
    stop: str             # stop, tool_calls, length, content_filter, pause
    usage: Usage = field(default_factory=Usage)
    model: str = ""


# -- OpenAI ------------------------------------------------------------------------------------------

def _text(value: Any) -> str:
    """Message content as the text every server takes: null (an empty answer) becomes "", and
    anything else that is not a string (a hand-edited or damaged transcript) its JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _openai_calls(calls: Any) -> list[Message]:
    """The well-formed tool calls of an assistant message, in the API's shape; a damaged entry is
    left out rather than sent (one bad record must not make every later request fail)."""
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not call.get("id"):
            continue
        out.append({"id": str(call["id"]), "type": "function",
                    "function": {"name": function["name"], "arguments": _text(function.get("arguments")) or "{}"}})
    return out


def to_openai(messages: list[Message]) -> list[Message]:
    """Canonical messages as the OpenAI API takes them: only its own fields (our bookkeeping, such
    as `is_error` and `turn`, stays out), and content always a string. An empty answer saved as
    null content is sent as "" beside its tool calls (llama-cpp-python answers a null with a 500,
    and the spec wants content where there are no tool calls), and left out altogether when it has
    none: it says nothing, and resending it broke every retry. Done here, on the way out, so
    transcripts already on disk heal too. Records that are not messages are skipped, and so is a
    tool result that answers no call of the assistant turn before it (the API refuses those)."""
    out = []
    open_calls: set[str] = set()
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            if call_id in open_calls:
                out.append({"role": "tool", "tool_call_id": call_id, "content": _text(message.get("content"))})
        elif role == "assistant":
            calls = _openai_calls(message.get("tool_calls"))
            open_calls = {call["id"] for call in calls}
            content = _text(message.get("content"))
            if not calls and not content.strip():
                continue
            sent: Message = {"role": "assistant", "content": content}
            if calls:
                sent["tool_calls"] = calls
            out.append(sent)
        elif role in ("system", "user", "developer"):
            sent = {"role": role, "content": _text(message.get("content"))}
            if isinstance(message.get("name"), str):
                sent["name"] = message["name"]
            out.append(sent)
    return out


OPENAI_STOPS = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length",
                "content_filter": "content_filter"}


def from_openai(response: dict[str, Any]) -> Completion:
    choice = (response.get("choices") or [{}])[0]
    raw = choice.get("message") or {}
    message: Message = {"role": "assistant", "content": raw.get("content")}
    calls = [
        {"id": call.get("id") or _new_id(), "type": "function",
         "function": {"name": call["function"]["name"], "arguments": call["function"].get("arguments") or "{}"}}
        for call in raw.get("tool_calls") or [] if call.get("function")
    ]
    if calls:
        message["tool_calls"] = calls
    usage = response.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    stop = OPENAI_STOPS.get(choice.get("finish_reason") or "stop", "stop")
    if calls and stop == "stop":
        stop = "tool_calls"  # some servers say "stop" with tool calls
    return Completion(
        message=message, stop=stop, model=response.get("model", ""),
        usage=Usage(input=usage.get("prompt_tokens") or 0, output=usage.get("completion_tokens") or 0,
                    cached=details.get("cached_tokens") or 0),
    )


# -- Anthropic ---------------------------------------------------------------------------------------

def _arguments(raw: str) -> dict[str, Any]:
    """Tool-call arguments as Anthropic wants them (an object). A model's malformed JSON is kept as
    a string under `_raw` rather than lost, so the transcript still says what was asked."""
    try:
        value = load_json(raw or "{}")  # bounded: what a model wrote
    except ValueError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_value": value}


def to_anthropic(messages: list[Message], tools: list[dict[str, Any]] | None = None,
                 *, cache: bool = True) -> dict[str, Any]:
    """The `system`, `messages` and `tools` arguments of an Anthropic request.

    Consecutive messages of one role are merged (tool results after a tool-use turn must be one
    user message); empty text is left out (Anthropic refuses empty text blocks). With `cache`, the
    system prompt and the tool list end in cache_control breakpoints: both are byte-identical
    across the turns of a task, so every turn after the first reads them from the cache.
    """
    messages = [m for m in messages if isinstance(m, dict) and m.get("role") in ("system", "user", "assistant", "tool")]
    system_parts = [_text(m.get("content")) for m in messages if m["role"] == "system" and m.get("content")]
    turns: list[Message] = []
    for message in messages:
        role = message["role"]
        if role == "system":
            continue
        if role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id") or ""),
                                     "content": _text(message.get("content")) or "(no output)"}
            if message.get("is_error"):
                block["is_error"] = True
            blocks, role = [block], "user"
        elif role == "assistant":
            blocks = [{"type": "text", "text": _text(message["content"])}] if message.get("content") else []
            for call in _openai_calls(message.get("tool_calls")):
                blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                               "input": _arguments(call["function"].get("arguments", "{}"))})
        else:
            content = message.get("content")
            blocks = [{"type": "text", "text": _text(content)}] if content else []
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            # Tool results first within a user turn, as Anthropic requires.
            merged = turns[-1]["content"] + blocks
            merged.sort(key=lambda b: 0 if b["type"] == "tool_result" else 1)
            turns[-1]["content"] = merged
        else:
            turns.append({"role": role, "content": blocks})
    request: dict[str, Any] = {"messages": turns}
    if system_parts:
        system: list[dict[str, Any]] = [{"type": "text", "text": "\n\n".join(system_parts)}]
        if cache:
            system[-1]["cache_control"] = CACHE
        request["system"] = system
    if tools:
        converted = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                      "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}}}
                     for t in tools]
        if cache:
            converted[-1]["cache_control"] = CACHE
        request["tools"] = converted
    return request


ANTHROPIC_STOPS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                   "refusal": "content_filter", "pause_turn": "pause"}


def from_anthropic(response: dict[str, Any]) -> Completion:
    texts, calls = [], []
    for block in response.get("content") or []:
        if block.get("type") == "text" and block.get("text"):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
    message: Message = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    usage = response.get("usage") or {}
    cached = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    return Completion(
        message=message, stop=ANTHROPIC_STOPS.get(response.get("stop_reason") or "end_turn", "stop"),
        model=response.get("model", ""),
        usage=Usage(input=(usage.get("input_tokens") or 0) + cached + written, output=usage.get("output_tokens") or 0,
                    cached=cached, cache_write=written),
    )


# -- tool calls written as text by local models: agents/textcalls.py ----------------------------------


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
