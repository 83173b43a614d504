"""The per-task index of an append-only log answers as a whole read filtered by task, whatever was appended or torn."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hermes_sup.kanban import logindex
from hermes_sup.kanban.journal import FileTaskJournal, Journal


def whole_read(path: Path, task: str) -> list[dict]:
    return [r for r in Journal(path).read().records if r.get("task") == task]


def test_appends_are_read_once_and_answers_match_a_whole_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logindex, "CHUNK", 64)  # lines longer than a chunk, and chunks ending mid-line
    path = tmp_path / "tool_calls.jsonl"
    index = logindex.TaskLineIndex(path)
    assert index.records("t1") == []  # no log yet
    rng = random.Random(7)
    journal = Journal(path)
    for round_ in range(40):
        for _ in range(rng.randint(0, 6)):
            task = f"t{rng.randint(1, 5)}"
            journal.append({"task": task, "n": round_, "pad": "x" * rng.choice([0, 10, 200])})
        if round_ % 7 == 3:  # a damaged line, then a torn one that the next append completes into garbage
            with open(path, "ab") as handle:
                handle.write(b'{"task": "t1", broken\n{"task": "t2", "torn')
        if round_ % 11 == 5:
            with open(path, "ab") as handle:
                handle.write(b'["t1"]\n"t1"\n{"task": 5}\n{"task": ["t1"]}\n\n')
        for task in ("t1", "t2", "t3", "t4", "t5", "t9"):
            assert index.records(task) == whole_read(path, task), (round_, task)
    journal.close()


def test_a_log_that_shrank_or_was_replaced_is_indexed_again(tmp_path: Path) -> None:
    path = tmp_path / "llm_calls.jsonl"
    path.write_text("".join(json.dumps({"task": "a", "n": n}) + "\n" for n in range(5)))
    index = logindex.TaskLineIndex(path)
    assert [r["n"] for r in index.records("a")] == [0, 1, 2, 3, 4]
    path.write_text(json.dumps({"task": "a", "n": 99}) + "\n")  # shorter, same inode
    assert [r["n"] for r in index.records("a")] == [99]
    other = tmp_path / "new.jsonl"
    other.write_text("".join(json.dumps({"task": "a", "n": n}) + "\n" for n in range(10, 13)))
    os.replace(other, path)  # longer and another file: the old spans must not be read in it
    assert [r["n"] for r in index.records("a")] == [10, 11, 12]
    path.unlink()
    assert index.records("a") == []


def test_a_task_journal_sees_its_own_and_taken_records(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "runs" / "me", tmp_path / "runs" / "them"
    other = Journal(theirs / "tool_calls.jsonl")
    other.append({"task": "t", "call": "c1", "phase": "started"})
    other.append({"task": "u", "call": "c9", "phase": "started"})
    other.close()
    journal = FileTaskJournal(mine, "t")
    journal.append_tool_call({"task": "t", "call": "c0", "phase": "done"})
    assert [r["call"] for r in journal.tool_calls()] == ["c0"]
    taken = journal.take_tool_calls("them", ("call", "phase"))
    assert [r["call"] for r in taken] == ["c0", "c1"]
    assert [r["call"] for r in journal.tool_calls()] == ["c0", "c1"]  # appended here, seen by the index
    assert journal.take_tool_calls("them", ("call", "phase")) == journal.tool_calls()  # nothing twice
    journal.close()
