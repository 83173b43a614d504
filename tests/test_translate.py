"""OpenAI <-> Anthropic translation as pure functions: ids, parallel calls, empty content, tool
errors, the system prompt, stop reasons, usage with cached tokens, and text-written tool calls."""

from __future__ import annotations

import json

from hermes_sup.agents.translate import (
    CACHE,
    Usage,
    from_anthropic,
    from_openai,
    text_tool_calls,
    to_anthropic,
    to_openai,
)

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "terminal", "description": "Run a command",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
]

CONVERSATION = [
    {"role": "system", "content": "You are a worker."},
    {"role": "user", "content": "Read a and b."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "AAA"},
    {"role": "tool", "tool_call_id": "call_2", "content": "no such file: b", "is_error": True},
    {"role": "assistant", "content": "a says AAA; b is missing."},
]


def test_to_anthropic_parallel_calls_results_errors_system_and_cache():
    request = to_anthropic(CONVERSATION, TOOLS)
    assert request["system"] == [{"type": "text", "text": "You are a worker.", "cache_control": CACHE}]
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "user", "assistant"]
    use = request["messages"][1]["content"]
    assert use == [  # empty assistant text is left out; both calls, ids kept, arguments parsed
        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a"}},
        {"type": "tool_use", "id": "call_2", "name": "read_file", "input": {"path": "b"}},
    ]
    results = request["messages"][2]["content"]
    assert results == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "AAA"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "no such file: b", "is_error": True},
    ]
    assert request["tools"][0] == {"name": "read_file", "description": "Read a file",
                                   "input_schema": TOOLS[0]["function"]["parameters"]}
    assert request["tools"][-1]["cache_control"] == CACHE and "cache_control" not in request["tools"][0]


def test_to_anthropic_keeps_malformed_arguments_and_merges_a_following_user_message():
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "terminal", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "c", "content": ""},
        {"role": "user", "content": "and then?"},
    ]
    request = to_anthropic(messages, None, cache=False)
    assert request["messages"][1]["content"][0]["input"] == {"_raw": "{not json"}
    last = request["messages"][2]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
    assert last["content"][0]["content"] == "(no output)"
    assert "system" not in request and "tools" not in request


def test_to_openai_drops_our_is_error_only():
    out = to_openai(CONVERSATION)
    assert out[4] == {"role": "tool", "tool_call_id": "call_2", "content": "no such file: b"}
    assert out[2]["tool_calls"] == CONVERSATION[2]["tool_calls"]


def test_from_anthropic_text_tool_use_stop_reasons_and_usage():
    completion = from_anthropic({
        "model": "claude-x", "stop_reason": "tool_use",
        "content": [{"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "terminal", "input": {}}],
        "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 900,
                  "cache_creation_input_tokens": 50},
    })
    assert completion.stop == "tool_calls" and completion.model == "claude-x"
    assert completion.message["content"] == "Let me look."
    calls = completion.message["tool_calls"]
    assert [c["id"] for c in calls] == ["toolu_1", "toolu_2"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "a"}
    assert completion.usage == Usage(input=960, output=7, cached=900, cache_write=50)
    for reason, stop in (("end_turn", "stop"), ("max_tokens", "length"), ("refusal", "content_filter"),
                         ("stop_sequence", "stop"), ("pause_turn", "pause")):
        assert from_anthropic({"stop_reason": reason, "content": []}).stop == stop
    empty = from_anthropic({"stop_reason": "end_turn", "content": []})
    assert empty.message == {"role": "assistant", "content": None}


def test_from_openai_calls_stop_reasons_and_cached_usage():
    completion = from_openai({
        "model": "gpt-x",
        "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}},
        ]}}],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 1024}},
    })
    assert completion.stop == "tool_calls", "tool calls with finish_reason stop (some local servers)"
    assert completion.message["tool_calls"][0]["id"] == "call_9"
    assert completion.usage == Usage(input=1200, output=30, cached=1024)
    plain = from_openai({"choices": [{"finish_reason": "length", "message": {"content": "partial"}}]})
    assert plain.stop == "length" and plain.message == {"role": "assistant", "content": "partial"}
    assert plain.usage == Usage()


def test_round_trip_through_anthropic_keeps_the_calls():
    request = to_anthropic(CONVERSATION, TOOLS)
    assistant = request["messages"][1]
    back = from_anthropic({"stop_reason": "tool_use", "content": assistant["content"]})
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in back.message["tool_calls"]] == [
        ("call_1", {"path": "a"}), ("call_2", {"path": "b"})]


KNOWN = {"read_file", "terminal"}


def test_text_tool_calls_in_tags_and_bare_json():
    tagged = text_tool_calls({"role": "assistant", "content": 'Sure.\n<tool_call>{"name": "read_file", '
                              '"arguments": {"path": "x"}}</tool_call>'}, KNOWN)
    assert tagged["content"] == "Sure."
    assert tagged["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "x"}'}
    two = text_tool_calls({"role": "assistant", "content": '<tool_call>{"name": "terminal", "arguments": '
                           '{"command": "ls"}}</tool_call><tool_call>{"name": "read_file", "arguments": '
                           '{"path": "y"}}</tool_call>'}, KNOWN)
    assert [c["function"]["name"] for c in two["tool_calls"]] == ["terminal", "read_file"]
    assert two["content"] is None
    bare = text_tool_calls({"role": "assistant", "content": '```json\n{"name": "terminal", "parameters": '
                            '{"command": "pwd"}}\n```'}, KNOWN)
    assert json.loads(bare["tool_calls"][0]["function"]["arguments"]) == {"command": "pwd"}


def test_text_that_is_not_a_tool_call_is_left_alone():
    for content in ("The answer is {42}.", '<tool_call>{broken</tool_call>', '{"answer": "done"}'):
        message = {"role": "assistant", "content": content}
        assert text_tool_calls(message, KNOWN) is message
    structured = {"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}
    assert text_tool_calls(structured, KNOWN) is structured


def test_to_openai_never_sends_null_content_and_skips_what_is_no_message():
    # An empty answer saved as null (alone, or beside tool calls), as transcripts on disk hold them.
    saved = [
        {"role": "system", "content": "You are a worker."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "turn": "a1"},
        {"role": "user", "content": "Comments on this task: try again"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": None}},
            {"id": "call_bad", "type": "function"}]},
        {"role": "tool", "tool_call_id": "call_0", "content": None, "is_error": True},
        {"role": "tool", "tool_call_id": "call_bad", "content": "the result of a call that is not there"},
        {"content": "a record without a role"},
        {"role": "assistant", "content": {"odd": "shape"}},
    ]
    sent = to_openai(saved)
    assert all(isinstance(m["content"], str) for m in sent)
    assert sent == [
        {"role": "system", "content": "You are a worker."},
        {"role": "user", "content": "go"},
        {"role": "user", "content": "Comments on this task: try again"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": ""},
        {"role": "assistant", "content": '{"odd": "shape"}'},
    ]
    request = to_anthropic(saved)  # the same transcript serves Anthropic too
    assert [m["role"] for m in request["messages"]] == ["user", "assistant", "user", "assistant"]


DEEP = "[" * 100_000 + "]" * 100_000  # json.loads recurses once per level: a RecursionError


def test_arguments_nested_too_deep_are_a_models_mistake_not_a_crash():
    """What a model writes is bounded like any other input: kept as text, never a RecursionError
    (which would fail the task again on every attempt, as the message stays in its transcript)."""
    from hermes_sup.agents.streams import assemble_anthropic

    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "read_file", "arguments": DEEP}}]},
                {"role": "tool", "tool_call_id": "c", "content": "refused"}]
    assert to_anthropic(messages, None, cache=False)["messages"][1]["content"][0]["input"] == {"_raw": DEEP}
    for text in (f"<tool_call>{DEEP}</tool_call>", DEEP.replace("[", "{\"a\":").replace("]", "}")):
        message = {"role": "assistant", "content": text}
        assert text_tool_calls(message, {"read_file"}) == message, "left as the text it is"
    events = [{"type": "message_start", "message": {"id": "m", "model": "x", "usage": {}}},
              {"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "t", "name": "read_file", "input": {}}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": DEEP}},
              {"type": "content_block_stop", "index": 0}]
    assert assemble_anthropic(events)["content"][0]["input"] == DEEP
