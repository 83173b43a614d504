"""The board's pure rules (kanban/rules.py), without files or processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hermes_sup.kanban import rules
from hermes_sup.kanban.errors import InvalidTransition
from hermes_sup.kanban.task import normalize

NOW = "2026-01-01T00:00:00.000000Z"
LATER = "2026-01-01T00:00:05.000000Z"
KANBAN = Path(rules.__file__).resolve().parent


def task(**fields) -> dict:
    now = fields.pop("now", NOW)
    return normalize({"title": "t", **fields}, default_id=fields.get("id", "t-1"), now=now, by="test", note="added")


def held(doc: dict, agent: str = "w1") -> dict:
    return rules.claimed(doc, {"agent": agent, "pid": 1, "lease_until_ts": 100.0}, now=NOW)


def test_claim_order_priority_then_age_then_id():
    docs = [task(id="b", priority=1), task(id="a", priority=1), task(id="c", priority=5),
            task(id="d", priority=1, now="2025-01-01T00:00:00.000000Z")]
    assert [d["id"] for d in sorted(docs, key=rules.claim_order)] == ["c", "d", "a", "b"]


def test_eligibility_role_assignee_dependencies_steps():
    done = {"dep"}.__contains__
    base = task()
    assert rules.eligible(base, "w1", (), done)
    assert not rules.eligible({**base, "status": "doing"}, "w1", (), done)
    assert not rules.eligible({**base, "role": "review"}, "w1", ("work",), done)
    assert rules.eligible({**base, "role": "review"}, "w1", ("review",), done)
    assert not rules.eligible({**base, "assignee": "w2"}, "w1", (), done)
    assert rules.eligible({**base, "depends_on": ["dep"]}, "w1", (), done)
    assert not rules.eligible({**base, "depends_on": ["dep", "other"]}, "w1", (), done)
    assert not rules.eligible(base, "w1", (), done, steps_only=True)
    assert rules.eligible(base, "w1", (), done, steps_only=True, has_steps=True)
    assert not rules.eligible(base, "w1", (), done, assigned_only=True)
    assert rules.eligible({**base, "assignee": "w1"}, "w1", (), done, assigned_only=True)


def test_claim_counts_token_and_attempt():
    doc = held(task(max_attempts=2))
    assert doc["status"] == "doing" and doc["attempts"] == 1 and doc["claim"]["token"] == 1
    assert doc["history"][-1]["note"] == "claimed by w1 (attempt 1 of 2)"
    again = held(rules.ended(doc, "todo", "released", now=LATER, give_back_attempt=True))
    assert again["claim"]["token"] == 2 and again["attempts"] == 1  # a new token even for the same attempt


def test_max_attempts_failed_attempts_and_recovery_agree():
    doc = held(task(max_attempts=2))
    first = rules.failed_attempt(doc, "boom", now=LATER)
    assert first["status"] == "todo" and first["claim"] is None and first["error"] == "boom"
    second = rules.failed_attempt(held(first), "boom", now=LATER)
    assert second["status"] == "failed"
    assert second["history"][-1]["note"] == "attempt 2 of 2 failed: boom"
    assert rules.recovered(held(first), "lease of w1 expired", now=LATER)["status"] == "failed"
    assert rules.recovered(doc, "lease of w1 expired", now=LATER)["status"] == "todo"


def test_max_attempts_rule_is_written_once():
    # The comparison of attempts with max_attempts lives in rules.exhausted alone.
    pattern = re.compile(r"attempts\W{0,3}\s*(>=|<|>|<=)\s*[\w\[\]\"'.()]*max_attempts")
    for path in KANBAN.rglob("*.py"):
        if path.name == "rules.py":
            continue
        assert not pattern.search(path.read_text()), f"{path.name} compares attempts itself"


def test_lease_expiry_and_fence():
    doc = held(task())
    assert not rules.lease_expired(doc["claim"], 99.0)
    assert rules.lease_expired(doc["claim"], 100.5)
    assert not rules.lease_expired(None, 1e12)
    assert rules.held_by(doc, 1) and not rules.held_by(doc, 2)
    assert not rules.held_by(rules.ended(doc, "done", "completed", now=LATER), 1)


def test_hand_moves():
    doc = held(task())
    with pytest.raises(InvalidTransition, match="only when an agent claims"):
        rules.moved(doc, "doing", by="cli", now=LATER)
    with pytest.raises(InvalidTransition, match="unknown status"):
        rules.moved(doc, "todo?", by="cli", now=LATER)
    back = rules.moved(doc, "todo", by="cli", now=LATER)
    assert back["claim"] is None and back["attempts"] == 0 and "claim of w1 revoked" in back["history"][-1]["note"]
    with pytest.raises(InvalidTransition, match="already todo"):
        rules.moved(back, "todo", by="cli", now=LATER)
    rules.check_cancel(doc)
    with pytest.raises(InvalidTransition):
        rules.check_cancel(rules.moved(doc, "done", by="cli", now=LATER))
    with pytest.raises(InvalidTransition, match="retry takes"):
        rules.check_retry(doc)
    rules.check_retry(rules.moved(doc, "failed", by="cli", now=LATER))
    adopted = rules.adopted({**doc, "status": "doing"}, "done", now=LATER)
    assert adopted["status"] == "done" and adopted["claim"] is None


@pytest.mark.parametrize("to", ["todo", "done", "failed", "cancelled"])
def test_a_hand_move_changes_a_task_alike_by_command_or_by_moving_its_file(to):
    # `task move` (moved) and `mv blocked/x.json todo/` (adopted) are one person's one intent.
    asked = rules.ended(held(task()), "blocked", "which one?", now=LATER, question="which one?")
    assert (asked["question"], asked["attempts"]) == ("which one?", 1)
    by_command = rules.moved(asked, to, by="cli", now=LATER)
    by_file = rules.adopted(asked, to, now=LATER)
    fields = ("status", "question", "attempts", "claim")
    assert [by_file[key] for key in fields] == [by_command[key] for key in fields]
    assert by_file["question"] is None
    assert by_file["attempts"] == (0 if to == "todo" else 1)


def test_answers_and_questions():
    blocked = rules.ended(held(task()), "blocked", "which one?", now=LATER, give_back_attempt=True,
                          question="which one?")
    assert blocked["attempts"] == 0
    answered = rules.answered(blocked, "the blue one", by="cli", now=LATER)
    assert answered["status"] == "todo" and answered["question"] is None
    assert answered["comments"][-1] == {"at": LATER, "by": "cli", "text": "the blue one", "answers": "which one?"}
    with pytest.raises(InvalidTransition, match="task retry"):
        rules.answered(rules.ended(held(task()), "blocked", "stuck", now=LATER), "x", by="cli", now=LATER)
