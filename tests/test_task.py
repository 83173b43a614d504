"""The pure core of the board: validation, claim eligibility and order, cycles."""

from __future__ import annotations

import datetime

import pytest
from hermes_sup.kanban.rules import can_claim
from hermes_sup.kanban.rules import claim_order as sort_key
from hermes_sup.kanban.task import (
    TaskError,
    find_cycle,
    is_valid_id,
    normalize,
    slugify,
    transition,
)

NOW = "2026-01-01T00:00:00.000000Z"


def norm(raw, **kw):
    return normalize(raw, default_id="t-1", now=NOW, by="test", note="n", **kw)


def test_defaults_fill_a_minimal_task():
    doc = norm({"title": "  Hello  "})
    assert doc["id"] == "t-1"
    assert doc["title"] == "Hello"
    assert doc["status"] == "todo"
    assert (doc["priority"], doc["max_attempts"], doc["attempts"], doc["tier"]) == (0, 3, 0, "auto")
    assert doc["depends_on"] == [] and doc["claim"] is None and doc["steps"] is None
    assert doc["history"] == [{"at": NOW, "by": "test", "from": None, "to": "todo", "note": "n"}]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "missing title"),
        ({"title": "   "}, "missing title"),
        ({"title": 5}, "field 'title' must be a non-empty string, got integer 5"),
        ({"title": "x", "priority": "high"}, "field 'priority' must be an integer, got string 'high'"),
        ({"title": "x", "priority": True}, "field 'priority' must be an integer, got boolean true"),
        ({"title": "x", "status": "wip"}, "unknown status 'wip'"),
        ({"title": "x", "status": "doing"}, "status 'doing' cannot be set here"),
        ({"title": "x", "id": "../etc/passwd"}, "is not a safe file name"),
        ({"title": "x", "id": "Upper"}, "is not a safe file name"),
        ({"title": "x", "id": "a" * 65}, "is not a safe file name"),
        ({"title": "x", "depends_on": ["ok", "Not OK"]}, "depends_on[1] is not a task id"),
        ({"title": "x", "depends_on": {"a": 1}}, "field 'depends_on' must be a list of task ids"),
        ({"title": "x", "id": "me", "depends_on": ["me"]}, "depends_on creates a cycle: me -> me"),
        ({"title": "x", "tier": "gold"}, "unknown tier 'gold'"),
        ({"title": "x", "max_attempts": 0}, "must be at least 1"),
        ({"title": "x", "steps": [{"args": {}}]}, "steps[0].tool must be a non-empty string"),
        ({"title": "x", "steps": [{"tool": "t", "args": []}]}, "steps[0].args must be an object"),
        ({"title": "x", "steps": [{"tool": "t", "when": 1}]}, "steps[0] has unknown field(s) ['when']"),
        ({"title": "x", "prority": 1}, "unknown field 'prority' (did you mean 'priority'?)"),
        ({"title": "x", "assignee": ["a"]}, "field 'assignee' must be a string or null"),
    ],
)
def test_bad_fields_are_named_exactly(raw, message):
    with pytest.raises(TaskError) as info:
        norm(raw)
    assert message in str(info.value)


def test_system_fields_in_input_are_reset():
    doc = norm({"title": "x", "attempts": 7, "claim": {"agent": "a"}, "result": 1, "history": ["junk"]})
    assert doc["attempts"] == 0 and doc["claim"] is None and doc["result"] is None
    assert len(doc["history"]) == 1


def test_single_dependency_string_and_duplicates_are_normalized():
    assert norm({"title": "x", "depends_on": "a-1"})["depends_on"] == ["a-1"]
    assert norm({"title": "x", "depends_on": ["a", "b", "a"]})["depends_on"] == ["a", "b"]


def test_ids_and_slugs():
    assert is_valid_id("a") and is_valid_id("task-12") and is_valid_id("0" * 64)
    assert not is_valid_id("-a") and not is_valid_id("") and not is_valid_id("a_b") and not is_valid_id(3)
    assert slugify("Fix the LOGIN bug!!") == "fix-the-login-bug"
    assert slugify("***") == "task"
    assert is_valid_id(slugify("x" * 200) + "-abcdef")


def test_claim_order_is_priority_then_age_then_id():
    docs = [
        {"id": "c", "priority": 0, "created_at": "2026-01-01"},
        {"id": "b", "priority": 5, "created_at": "2026-01-03"},
        {"id": "a", "priority": 5, "created_at": "2026-01-02"},
        {"id": "d", "priority": 0, "created_at": "2026-01-01"},
    ]
    assert [d["id"] for d in sorted(docs, key=sort_key)] == ["a", "b", "c", "d"]


def test_eligibility_respects_assignee_role_and_dependencies():
    done = {"dep-1"}.__contains__
    base = {"status": "todo", "assignee": None, "role": None, "depends_on": []}
    assert can_claim(base, "w1", (), done)
    assert not can_claim({**base, "status": "doing"}, "w1", (), done)
    assert can_claim({**base, "assignee": "w1"}, "w1", (), done)
    assert not can_claim({**base, "assignee": "w2"}, "w1", (), done)
    assert can_claim({**base, "role": "review"}, "w1", ("review",), done)
    assert not can_claim({**base, "role": "review"}, "w1", ("work",), done)
    assert can_claim({**base, "depends_on": ["dep-1"]}, "w1", (), done)
    assert not can_claim({**base, "depends_on": ["dep-1", "dep-2"]}, "w1", (), done)


def test_cycles_are_found_through_existing_tasks():
    graph = {"b": ["c"], "c": ["a"], "d": []}

    def deps_of(task_id):
        return graph.get(task_id, [])

    assert find_cycle("a", ["b"], deps_of) == ["a", "b", "c", "a"]
    assert find_cycle("a", ["d", "x"], deps_of) is None
    assert find_cycle("z", [], deps_of) is None


def test_transition_appends_history_and_keeps_the_old_document():
    doc = norm({"title": "x"})
    new = transition(doc, "doing", by="w1", now="later", note="claimed", attempts=1)
    assert new["status"] == "doing" and new["attempts"] == 1 and new["updated_at"] == "later"
    assert new["history"][-1] == {"at": "later", "by": "w1", "from": "todo", "to": "doing", "note": "claimed"}
    assert doc["status"] == "todo" and len(doc["history"]) == 1


def _nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"due": datetime.date(2024, 1, 1)}, "the value at meta.due is a date"),
        ({"tags": {"a", "b"}}, "the value at meta.tags is a set"),
        ({"blob": b"\x00"}, "the value at meta.blob is a bytes"),
        ({"n": float("nan")}, "the number at meta.n (nan) is not a finite number"),
        ({"n": 10**200}, "the integer at meta.n has more than 100 digits"),
        ({"text": "caf\udce9"}, "the text at meta.text holds an unpaired surrogate \\udce9"),
        ({1: "one"}, "keys must be text, but meta has the key 1"),
        (_nested(100_000), "nested more than 64 levels deep"),  # built by a caller, not parsed: no recursion
    ],
)
def test_only_plain_bounded_data_becomes_a_task(meta, message):
    with pytest.raises(TaskError) as info:
        norm({"title": "x", "meta": meta})
    assert message in str(info.value)


def test_steps_args_are_checked_the_same_way():
    with pytest.raises(TaskError, match=r"the value at steps\[0\].args.when is a datetime"):
        norm({"title": "x", "steps": [{"tool": "wait", "args": {"when": datetime.datetime(2024, 1, 1)}}]})
