"""MEMORY.md in Hermes Agent's format, written under a lock; JSONL journals that survive torn lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hermes_sup.agents.memory import MemoryEntryError, MemoryFile, apply, parse, render
from hermes_sup.kanban import journal as journal_module
from hermes_sup.kanban.journal import Journal, _after_last_newline

real_after = _after_last_newline

HERMES_FILE = """User prefers concise answers.
§
The staging server is staging.example.internal; deploys need a ticket.
§
Project uses Python 3.11 and ruff."""  # as Hermes writes it: no newline at the end


def test_a_hermes_memory_file_reads_as_it_is_and_round_trips():
    entries = parse(HERMES_FILE)
    assert entries == ["User prefers concise answers.",
                       "The staging server is staging.example.internal; deploys need a ticket.",
                       "Project uses Python 3.11 and ruff."]
    assert parse(render(entries)) == entries
    assert render(entries) == HERMES_FILE


def test_add_replace_remove_by_unique_substring():
    entries = parse(HERMES_FILE)
    added = apply(entries, "add", content="Tests run with make test.")
    assert added[-1] == "Tests run with make test."
    assert apply(added, "add", content="Tests run with make test.") == added, "adding a known fact changes nothing"
    replaced = apply(added, "replace", old_text="staging server", content="Staging moved to stg.example.internal.")
    assert replaced[1] == "Staging moved to stg.example.internal."
    assert apply(replaced, "remove", old_text="concise") == replaced[1:]


@pytest.mark.parametrize(
    ("action", "kwargs", "message"),
    [
        ("replace", {"old_text": "nowhere", "content": "x"}, "no memory entry contains 'nowhere'"),
        ("remove", {"old_text": "e"}, "3 memory entries contain 'e'; give a longer piece"),
        ("remove", {}, "old_text is required"),
        ("add", {"content": "  "}, "content is required"),
        ("add", {"content": "a\n§\nb"}, "must not contain a line holding only §"),
        ("forget", {}, "unknown memory action 'forget'"),
    ],
)
def test_memory_errors_say_what_to_do(action, kwargs, message):
    with pytest.raises(MemoryEntryError) as info:
        apply(parse(HERMES_FILE), action, **kwargs)
    assert message in str(info.value)


def test_a_full_memory_refuses_to_grow():
    entries = ["x" * 90]
    with pytest.raises(MemoryEntryError, match=r"memory is full \(90 of 100 characters\)"):
        apply(entries, "add", content="y" * 20, limit=100)
    assert apply(entries, "replace", old_text="x", content="short", limit=100) == ["short"]


def test_the_file_is_changed_in_place_and_shown_in_the_prompt(tmp_path):
    path = tmp_path / "memory" / "MEMORY.md"
    path.parent.mkdir()
    path.write_text(HERMES_FILE)
    memory = MemoryFile(path)
    assert "3 entries" not in memory.change("add", content="New fact.")
    assert parse(path.read_text())[-1] == "New fact."
    assert memory.prompt_block().startswith("## What you remember\n- User prefers concise answers.")
    assert MemoryFile(tmp_path / "empty" / "MEMORY.md").prompt_block() == ""


def test_writers_in_several_processes_lose_nothing(tmp_path):
    path = tmp_path / "MEMORY.md"
    code = ("import sys; from pathlib import Path; from hermes_sup.agents.memory import MemoryFile; "
            "m = MemoryFile(Path(sys.argv[1]), limit=10**6)\n"
            "for i in range(25): m.change('add', content=f'fact {sys.argv[2]}-{i}')")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(n)], env=env) for n in range(4)]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    assert sorted(parse(path.read_text())) == sorted(f"fact {n}-{i}" for n in range(4) for i in range(25))


def test_a_journal_drops_a_torn_last_line_and_sets_it_aside_before_appending(tmp_path):
    journal = Journal(tmp_path / "transcript.jsonl")
    journal.append({"role": "user", "content": "hi"})
    journal.close()
    with open(journal.path, "ab") as handle:
        handle.write(b'{"role": "assistant", "content": "half a li')  # a kill in the middle of a write
    read = journal.read()
    assert read.records == [{"role": "user", "content": "hi"}]
    assert "cut short" in read.notes[0]
    journal.append({"role": "assistant", "content": "whole"})
    assert [r["content"] for r in journal.read().records] == ["hi", "whole"]
    assert journal.read().notes == []
    damaged = (tmp_path / "transcript.jsonl.damaged").read_text()
    assert "half a li" in damaged and "set aside" in damaged


def test_a_journal_skips_a_damaged_middle_line_with_a_note(tmp_path):
    path = tmp_path / "tool_calls.jsonl"
    path.write_bytes(b'{"a": 1}\n\x00\x00garbage\n{"a": 2}\n')
    read = Journal(path).read()
    assert read.records == [{"a": 1}, {"a": 2}]
    assert read.notes == ["tool_calls.jsonl: line 2 is not JSON and is ignored"]
    assert Journal(tmp_path / "missing.jsonl").read().records == []


def test_a_journal_skips_a_line_nested_past_the_recursion_limit(tmp_path):
    """Such a line (a damaged or hand-made log) raised RecursionError out of every reader: the
    agent resuming its task, another agent counting the task's spending, `hermes-sup usage`."""
    path = tmp_path / "llm_calls.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"[" * 100_000 + b"]" * 100_000 + b'\n{"a": 2}\n')
    read = Journal(path).read()
    assert read.records == [{"a": 1}, {"a": 2}]
    assert read.notes == ["llm_calls.jsonl: line 2 is not JSON and is ignored"]


@pytest.mark.parametrize("content, cut", [
    (b"", None), (b"\n", None), (b'{"a":1}\n', None), (b'{"a":1}\n{"b":', 8), (b'{"torn', 0),
    (b'{"a":1}\n' + b"x" * 50, 8), (b"\n" + b"y" * 23, 1), (b"z" * 7 + b"\n", None)])
def test_the_torn_last_line_is_found_from_the_end_in_chunks(tmp_path, content, cut):
    """A chunk of 4 bytes: a torn line longer than several chunks is still found whole."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(content)
    with open(path, "rb") as handle:
        assert _after_last_newline(handle, chunk=4) == cut


def test_a_long_log_s_torn_line_longer_than_a_chunk_is_set_aside_whole(tmp_path, monkeypatch):
    journal = Journal(tmp_path / "tool_calls.jsonl")
    for n in range(50):
        journal.append({"task": f"t{n}"})
    journal.close()
    torn = b'{"task": "t50", "text": "' + b"w" * 300
    with open(journal.path, "ab") as handle:
        handle.write(torn)
    monkeypatch.setattr(journal_module, "_after_last_newline",
                        lambda handle, chunk=64: real_after(handle, chunk))  # several chunks for the torn line
    journal.append({"task": "t51"})
    records = journal.read().records
    assert [r["task"] for r in records] == [*(f"t{n}" for n in range(50)), "t51"]
    assert torn in (tmp_path / "tool_calls.jsonl.damaged").read_bytes()
