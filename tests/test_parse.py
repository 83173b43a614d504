"""Dropped files to task fields: every supported format and every way a file can be wrong."""

from __future__ import annotations

import time

import pytest
from hermes_sup.kanban.parse import MAX_BYTES, parse_task_file
from hermes_sup.kanban.task import TaskError, normalize


def test_json_yaml_markdown_and_text():
    assert parse_task_file("a.json", b'{"title": "J", "priority": 2}') == {"title": "J", "priority": 2}
    assert parse_task_file("a.yaml", b"title: Y\nrole: review\n") == {"title": "Y", "role": "review"}
    assert parse_task_file("a.yml", b"title: Y\n") == {"title": "Y"}
    assert parse_task_file("a.txt", b"\n  Title line \nbody 1\nbody 2\n") == {
        "title": "Title line", "body": "body 1\nbody 2"}
    assert parse_task_file("a.md", b"# Heading title\n\nSome *body*.\n") == {
        "title": "Heading title", "body": "Some *body*."}


def test_markdown_front_matter_sets_fields():
    fields = parse_task_file("a.md", b"---\npriority: 4\nrole: review\n---\n# The title\nThe body\n")
    assert fields == {"priority": 4, "role": "review", "title": "The title", "body": "The body"}
    fields = parse_task_file("a.md", b"---\ntitle: From front matter\n---\nAll of this is body.\n")
    assert fields == {"title": "From front matter", "body": "All of this is body."}


def test_byte_order_mark_is_ignored():
    assert parse_task_file("a.json", b'\xef\xbb\xbf{"title": "x"}') == {"title": "x"}


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("a.json", b'{"title": "x",}', "invalid JSON at line 1, column 15"),
        ("a.json", b'{\n"title": "x"\n"body": 1}', "invalid JSON at line 3, column 1: Expecting ',' delimiter"),
        ("a.json", b"", "file is empty"),
        ("a.json", b"[1, 2]", "must hold one object (a mapping of fields), not a list"),
        ("a.yaml", b"title: [unclosed\n", "invalid YAML at line 2"),
        ("a.yaml", b"- a\n- b\n", "not a list"),
        ("a.md", b"---\ntitle: x\nno end\n", "never closed"),
        ("a.md", b"---\n: : :\n---\nx\n", "invalid YAML front matter at line"),
        ("a.json", b'{"title": "\x00x"}', "file is binary, not text (a NUL byte at offset 11)"),
        ("a.txt", b"\xff\xfe garbage \x80", "not UTF-8 text (invalid byte 0xff at offset 0)"),
        ("a.exe", b"MZ", "unsupported file type 'a.exe'"),
    ],
)
def test_bad_files_say_what_is_wrong(name, data, message):
    with pytest.raises(TaskError) as info:
        parse_task_file(name, data)
    assert message in str(info.value)


def test_size_limit():
    with pytest.raises(TaskError, match="limit for a task file is 1048576 bytes"):
        parse_task_file("a.txt", b"x" * (MAX_BYTES + 1))
    assert parse_task_file("a.txt", b"t\n" + b"x" * (MAX_BYTES - 2))["title"] == "t"


def test_brackets_and_escaped_quotes_inside_json_strings_are_not_nesting():
    text = '{"title": "' + '[{' * 100 + '\\" \\\\' + ']}' * 3 + '", "body": "\\\\\\"[[["}'
    fields = parse_task_file("a.json", text.encode())
    assert fields["title"].startswith("[{[{") and fields["body"] == '\\"[[['


def test_unterminated_json_strings_cost_one_pass_not_one_per_quote():
    # Each of half a million quotes starts a string that never ends: a scan that retried from each
    # would take hours; this one takes well under a second even on a loaded machine.
    data = b'{"title": "' + b'\\"' * 500_000
    started = time.monotonic()
    with pytest.raises(TaskError, match="invalid JSON"):
        parse_task_file("a.json", data)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("a.json", b'{"title": "x", "n": Infinity}', "Infinity is not a finite number"),
        ("a.json", b'{"title": "x", "n": 1e999}', "1e999 is not a finite number"),
        ("a.json", b'{"title": "x", "n": -' + b"1" * 101 + b"}", "an integer of 101 digits"),
        ("a.yaml", b"title: x\nn: .nan\n", ".nan is not a finite number"),
        ("a.yaml", b"title: x\nn: !!omap [a: 1]\n", "a YAML !!omap is not plain data"),
        ("a.yaml", b"base: &b {x: 1}\nuse:\n  <<: *b\n", "line 3, column 7: aliases (*b) are not allowed"),
        ("a.yaml", b"title: !!python/object:os.system x\n", "could not determine a constructor"),
        ("a.yaml", b"title: x\nmeta: " + b"{a: " * 65 + b"1" + b"}" * 65 + b"\n", "nested more than 64 levels deep"),
        ("a.yaml", b"title: x\nrole: a\nrole: b\n", "line 3, column 1: duplicate key 'role' (first on line 2)"),
        ("a.md", b"---\ntitle: x\nwhen: 12:30:00\n---\n", None),
    ],
)
def test_only_plain_json_data_comes_out_of_a_file(name, data, message):
    if message is None:
        assert parse_task_file(name, data)["when"] == 45000, "YAML 1.1 sexagesimal is a plain integer"
        return
    with pytest.raises(TaskError) as info:
        parse_task_file(name, data)
    assert message in str(info.value)


def test_sixty_four_levels_are_still_fine_and_the_three_checks_agree():
    nested = b"[" * 62 + b"1" + b"]" * 62  # with the document and meta: 64 levels
    assert parse_task_file("a.json", b'{"title": "x", "meta": {"a": ' + nested + b"}}")["title"] == "x"
    assert parse_task_file("a.yaml", b"title: x\nmeta: {a: " + nested + b"}\n")["title"] == "x"
    fields = parse_task_file("a.json", b'{"title": "x", "meta": {"a": ' + nested + b"}}")
    assert normalize(fields, default_id="t", now="now", by="test", note="n")["meta"] == fields["meta"]
    deeper = b"[" + nested + b"]"
    for name, data in (("a.json", b'{"title": "x", "meta": {"a": ' + deeper + b"}}"),
                       ("a.yaml", b"title: x\nmeta: {a: " + deeper + b"}\n")):
        with pytest.raises(TaskError, match="nested more than 64 levels deep"):
            parse_task_file(name, data)


@pytest.mark.parametrize("name", ["a.txt", "a.md"])
def test_a_file_of_blank_lines_is_parsed_in_one_pass(name):
    # Dropping the blank lines one list.pop(0) at a time took a minute for 1 MiB of newlines.
    data = b"\n" * (MAX_BYTES - 20) + b"title\nbody"
    started = time.monotonic()
    assert parse_task_file(name, data) == {"title": "title", "body": "body"}
    assert time.monotonic() - started < 10
