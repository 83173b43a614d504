"""Section 3 of the contract, verb by verb, in one process: status, holder, fencing, leases, max
attempts, dependencies, order, roles and assignee, ingest, cancel, retry, comments, answers, hand moves."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from hermes_sup.kanban import ClaimLost, InvalidTransition, TaskNotFound, reads

from ..conftest import wait_until
from .backends import HAND_MOVES, all_events, tasks
from .checks import check_invariants


def lease_end(doc: dict) -> float:
    """When the document's claim lapses, from the contract's `lease_until` (ISO 8601 UTC)."""
    return datetime.fromisoformat(doc["claim"]["lease_until"].replace("Z", "+00:00")).timestamp()


def wait_past_lease(doc: dict) -> None:
    end = lease_end(doc)
    wait_until(lambda: time.time() > end + 0.05, timeout=30)


def test_every_task_has_exactly_one_status_through_every_transition(backend, store):
    done = store.add({"title": "to be done"})
    failed = store.add({"title": "to fail", "max_attempts": 1})
    blocked = store.add({"title": "to block"})
    cancelled = store.add({"title": "to cancel"})
    held = store.add({"title": "to hold", "priority": -5})
    store.add({"title": "left in todo", "priority": -9})
    for doc, finish in ((done, "complete"), (failed, "fail"), (blocked, "block")):
        claimed = store.claim("w")
        assert claimed["id"] == doc["id"] and claimed["status"] == "doing"
        token = claimed["claim"]["token"]
        if finish == "complete":
            store.complete(doc["id"], token, "ok")
        elif finish == "fail":
            store.fail(doc["id"], token, "broke")
        else:
            store.block(doc["id"], token, "needs a person")
    store.cancel(cancelled["id"])
    assert store.claim("w")["id"] == held["id"]
    docs = check_invariants(backend, store)
    assert {task_id: doc["status"] for task_id, doc in docs.items()} == {
        done["id"]: "done", failed["id"]: "failed", blocked["id"]: "blocked", cancelled["id"]: "cancelled",
        held["id"]: "doing", **{d["id"]: "todo" for d in tasks(store, "todo")}}
    assert [d["id"] for d in tasks(store, "doing")] == [held["id"]]
    assert store.counts()["todo"] == 1


def test_one_holder_and_a_token_per_claim(backend, store):
    doc = store.add({"title": "only one"})
    first = store.claim("alice")
    assert first["id"] == doc["id"] and first["claim"]["agent"] == "alice"
    assert store.claim("bob") is None, "a held task is claimed by nobody else"
    assert store.get(doc["id"])["claim"]["agent"] == "alice"
    with pytest.raises(ClaimLost):
        store.complete(doc["id"], first["claim"]["token"] + 1, "a token never issued")
    assert store.complete(doc["id"], first["claim"]["token"], "ok")["status"] == "done"
    check_invariants(backend, store)


def test_a_stale_token_is_fenced_off_from_every_write(backend, store):
    doc = store.add({"title": "fenced"})
    old = store.claim("slow", lease=0.3)
    wait_past_lease(old)
    assert [r["task"] for r in store.recover()] == [doc["id"]]
    new = store.claim("fast")
    stale, fresh = old["claim"]["token"], new["claim"]["token"]
    assert fresh > stale, "each claim gets a newer token"
    writes = {
        "complete": lambda: store.complete(doc["id"], stale, "late"),
        "fail": lambda: store.fail(doc["id"], stale, "late"),
        "renew": lambda: store.renew(doc["id"], stale),
        "release": lambda: store.release(doc["id"], stale),
        "block": lambda: store.block(doc["id"], stale, "late"),
    }
    for name, write in writes.items():
        with pytest.raises(ClaimLost):
            write()
        now = store.get(doc["id"])
        assert now["status"] == "doing" and now["claim"]["token"] == fresh, f"a stale {name} changed the task"
    assert store.complete(doc["id"], fresh, "ok")["result"] == "ok"
    check_invariants(backend, store)


def test_an_expired_lease_makes_the_task_claimable_and_renew_extends_it(backend, store):
    lapsing = store.add({"title": "lapsing", "priority": 1})
    renewed = store.add({"title": "renewed"})
    # Long enough that a loaded machine still checks "a live lease stands" before it runs out.
    first = store.claim("w", lease=2.0)
    second = store.claim("w", lease=2.0)
    assert (first["id"], second["id"]) == (lapsing["id"], renewed["id"])
    assert store.recover() == [], "a live lease stands"
    extended = store.renew(renewed["id"], second["claim"]["token"], lease=120)
    assert lease_end(extended) > lease_end(second) + 60
    wait_past_lease(first)
    wait_past_lease(second)
    assert [r["task"] for r in store.recover()] == [lapsing["id"]], "only the lease not renewed ran out"
    back = store.get(lapsing["id"])
    assert back["status"] == "todo" and back["attempts"] == 1, "attempts are kept"
    again = store.claim("other")
    assert again["id"] == lapsing["id"] and again["attempts"] == 2
    assert store.get(renewed["id"])["claim"]["agent"] == "w"
    check_invariants(backend, store)


def test_max_attempts_sends_a_task_to_failed_with_the_reason(backend, store):
    doc = store.add({"title": "flaky", "max_attempts": 2})
    claimed = store.claim("w")
    after = store.fail(doc["id"], claimed["claim"]["token"], "first")
    assert after["status"] == "todo" and after["attempts"] == 1 and after["error"] == "first"
    claimed = store.claim("w")
    after = store.fail(doc["id"], claimed["claim"]["token"], "second")
    assert after["status"] == "failed" and after["attempts"] == 2 and after["error"] == "second"
    assert store.claim("w") is None

    lapsed = store.add({"title": "one go", "max_attempts": 1})
    held = store.claim("w", lease=0.3)
    wait_past_lease(held)
    assert [(r["task"], r["to"]) for r in store.recover()] == [(lapsed["id"], "failed")]
    gone = store.get(lapsed["id"])
    assert gone["status"] == "failed" and "lease" in gone["error"], "failed with the reason"

    given_back = store.add({"title": "released", "max_attempts": 1})
    held = store.claim("w")
    assert store.release(given_back["id"], held["claim"]["token"])["attempts"] == 0, "a release is no attempt"
    assert store.claim("w")["id"] == given_back["id"]
    check_invariants(backend, store)


def test_a_dependency_holds_a_task_until_it_is_done_and_a_failed_one_holds_it_for_good(backend, store):
    first = store.add({"title": "first"})
    second = store.add({"title": "second", "depends_on": [first["id"]], "priority": 9})
    claimed = store.claim("w")
    assert claimed["id"] == first["id"], "a higher priority does not jump its dependency"
    assert store.claim("w") is None, "not claimable while its dependency is doing"
    store.complete(first["id"], claimed["claim"]["token"], "ok")
    assert store.claim("w")["id"] == second["id"]

    base = store.add({"title": "base", "max_attempts": 1})
    top = store.add({"title": "top", "depends_on": [base["id"]]})
    held = store.claim("w")
    assert held["id"] == base["id"]
    assert store.fail(base["id"], held["claim"]["token"], "broke")["status"] == "failed"
    assert store.claim("w") is None, "a task whose dependency failed is not claimable"
    assert store.get(top["id"])["status"] == "todo"
    store.retry(base["id"])
    held = store.claim("w")
    assert held["id"] == base["id"]
    store.complete(base["id"], held["claim"]["token"], "ok")
    assert store.claim("w")["id"] == top["id"]
    check_invariants(backend, store)


def test_priority_first_then_oldest_first(backend, store):
    low = store.add({"title": "low", "priority": 1})
    high_old = store.add({"title": "high, older", "priority": 5})
    middle = store.add({"title": "middle", "priority": 3})
    high_new = store.add({"title": "high, newer", "priority": 5})
    same = [store.add({"title": f"fifo {n}"})["id"] for n in range(5)]
    negative = store.add({"title": "negative", "priority": -1})
    order = [store.claim("w")["id"] for _ in range(10)]
    assert order == [high_old["id"], high_new["id"], middle["id"], low["id"], *same, negative["id"]]
    assert store.claim("w") is None


def test_roles_and_assignee_decide_who_may_claim(backend, store):
    review = store.add({"title": "review", "role": "reviewer", "priority": 2})
    bobs = store.add({"title": "for bob", "assignee": "bob", "priority": 1})
    assert store.claim("alice") is None, "neither the role nor the assignment is alice's"
    assert store.claim("alice", roles=["writer"]) is None
    assert store.claim("alice", roles=["writer", "reviewer"])["id"] == review["id"]
    assert store.claim("carol", roles=["reviewer"]) is None
    got = store.claim("bob")
    assert got["id"] == bobs["id"] and got["assignee"] == "bob"
    check_invariants(backend, store)


def test_a_bad_drop_lands_in_rejected_with_its_reason_and_the_next_drop_is_ingested(backend, store):
    inbox, rejected = backend.inbox(store), backend.rejected(store)
    (inbox / "bad.json").write_text("{not json")
    (inbox / "untitled.json").write_text(json.dumps({"body": "no title"}))
    (inbox / "good.json").write_text(json.dumps({"title": "fine", "id": "good"}))
    report = store.ingest()
    assert report.ingested == ["good"]
    reasons = {item["file"]: item["reason"] for item in report.rejected}
    assert set(reasons) == {"inbox/bad.json", "inbox/untitled.json"}
    for name, reason in (("bad.json", reasons["inbox/bad.json"]), ("untitled.json", reasons["inbox/untitled.json"])):
        assert reason, "a rejection says why"
        assert (rejected / name).exists(), "the rejected file is kept"
        assert reason in (rejected / f"{name}.error.txt").read_text()
    assert "title" in reasons["inbox/untitled.json"]
    assert store.get("good")["title"] == "fine"
    (inbox / "next.txt").write_text("next one\nits body\n")
    again = store.ingest()
    assert again.rejected == [] and len(again.ingested) == 1
    assert store.get(again.ingested[0])["body"].strip() == "its body"
    assert [p.name for p in inbox.iterdir()] == []
    rejections = [e for _c, e in all_events(backend, store) if e["to"] == "rejected"]
    assert sorted(e["task"] for e in rejections) == ["bad.json", "untitled.json"], "each rejection is logged"
    check_invariants(backend, store)


def test_a_cancelled_task_refuses_its_former_holder(backend, store):
    doc = store.add({"title": "called off"})
    held = store.claim("w")
    token = held["claim"]["token"]
    cancelled = store.cancel(doc["id"], by="lead")
    assert cancelled["status"] == "cancelled" and not cancelled["claim"]
    for write in (lambda: store.complete(doc["id"], token, "late"), lambda: store.fail(doc["id"], token, "late"),
                  lambda: store.renew(doc["id"], token), lambda: store.release(doc["id"], token),
                  lambda: store.block(doc["id"], token, "late")):
        with pytest.raises(ClaimLost):
            write()
        assert store.get(doc["id"])["status"] == "cancelled"
    with pytest.raises(InvalidTransition):
        store.cancel(doc["id"])
    assert store.claim("w") is None
    check_invariants(backend, store)


def test_retry_puts_a_failed_blocked_or_cancelled_task_back_with_attempts_reset(backend, store):
    failed = store.add({"title": "failed", "max_attempts": 1, "priority": 3})
    blocked = store.add({"title": "blocked", "priority": 2})
    cancelled = store.add({"title": "cancelled", "priority": 1})
    held = store.claim("w")
    store.fail(failed["id"], held["claim"]["token"], "broke")
    held = store.claim("w")
    store.block(blocked["id"], held["claim"]["token"], "stuck")
    store.cancel(cancelled["id"])
    for doc in (failed, blocked, cancelled):
        back = store.retry(doc["id"])
        assert back["status"] == "todo" and back["attempts"] == 0
    assert sorted(store.claim("w")["id"] for _ in range(3)) == sorted(d["id"] for d in (failed, blocked, cancelled))
    todo = store.add({"title": "fresh"})
    with pytest.raises(InvalidTransition):
        store.retry(todo["id"])
    held = store.claim("w")
    store.complete(todo["id"], held["claim"]["token"], "ok")
    with pytest.raises(InvalidTransition):
        store.retry(todo["id"])
    with pytest.raises(TaskNotFound):
        store.retry("no-such-task")
    check_invariants(backend, store)


def test_a_comment_changes_no_status_and_survives_the_holders_write(backend, store):
    doc = store.add({"title": "discussed"})
    store.comment(doc["id"], "before the claim", by="lead")
    held = store.claim("w")
    before = store.get(doc["id"])
    events_before = len(all_events(backend, store))
    commented = store.comment(doc["id"], "while held", by="reviewer")
    assert commented["status"] == "doing" and commented["updated_at"] == before["updated_at"]
    assert len(all_events(backend, store)) == events_before, "a comment is no transition"
    finished = store.complete(doc["id"], held["claim"]["token"], "ok")
    assert [(c["by"], c["text"]) for c in finished["comments"]] == [("lead", "before the claim"),
                                                                    ("reviewer", "while held")]
    store.comment(doc["id"], "after", by="lead")
    assert store.get(doc["id"])["status"] == "done"
    with pytest.raises(TaskNotFound):
        store.comment("no-such-task", "hello")
    check_invariants(backend, store)


def test_an_answer_sends_a_blocked_question_back_to_todo_with_the_answer(backend, store):
    doc = store.add({"title": "ask"})
    held = store.claim("w")
    asked = store.block(doc["id"], held["claim"]["token"], "which database?", question="which database?")
    assert asked["status"] == "blocked" and asked["question"] == "which database?"
    assert asked["attempts"] == 0, "asking is not a failed attempt"
    with pytest.raises(InvalidTransition):
        store.answer(doc["id"], "   ")
    answered = store.answer(doc["id"], "postgres", by="lead")
    assert answered["status"] == "todo" and not answered.get("question")
    assert answered["comments"][-1] == {**answered["comments"][-1], "text": "postgres", "by": "lead",
                                        "answers": "which database?"}
    with pytest.raises(InvalidTransition):
        store.answer(doc["id"], "again")
    again = store.claim("w")
    assert again["id"] == doc["id"] and again["attempts"] == 1
    check_invariants(backend, store)


def test_an_answer_is_refused_on_a_task_that_is_not_blocked(backend, store):
    """Only a blocked task's question takes an answer: on any other task `answer` changes nothing
    (no comment, no transition), even when its document still carries a question (written by hand
    past the board, or left by a hand move of before)."""
    todo = store.add({"title": "todo", "priority": -1})
    stale = store.add({"title": "todo, with a question left in it", "priority": -1})
    backend.hand_edit(store, stale["id"], {"question": "which one?"})
    ended = {}
    for end in ("done", "failed", "doing"):
        doc = store.add({"title": end, "max_attempts": 1, "priority": 5})
        held = store.claim("w")
        assert held["id"] == doc["id"]
        if end == "done":
            store.complete(doc["id"], held["claim"]["token"], "ok")
        elif end == "failed":
            store.fail(doc["id"], held["claim"]["token"], "broke")
        ended[end] = doc
    cancelled = store.add({"title": "cancelled", "priority": -1})
    store.cancel(cancelled["id"])
    asked = store.add({"title": "asked, then moved on by hand", "priority": 9})
    held = store.claim("w")
    store.block(asked["id"], held["claim"]["token"], "which one?", question="which one?")
    store.move(asked["id"], "todo", by="lead")
    cases = [(todo, "todo"), (stale, "todo"), (ended["done"], "done"), (ended["failed"], "failed"),
             (ended["doing"], "doing"), (cancelled, "cancelled"), (asked, "todo")]
    events = len(all_events(backend, store))
    for doc, status in cases:
        before = store.get(doc["id"])
        assert before["status"] == status, (doc["title"], before["status"])
        with pytest.raises(InvalidTransition) as info:
            store.answer(doc["id"], "the blue one", by="lead")
        assert str(info.value) == f"task {doc['id']} is {status} and waits on no question", doc["title"]
        after = store.get(doc["id"])
        assert (after["status"], after.get("comments"), after["updated_at"]) == (
            before["status"], before.get("comments"), before["updated_at"]), doc["title"]
    assert len(all_events(backend, store)) == events, "no transition"
    check_invariants(backend, store)


def asked_and_blocked(store):
    """A task blocked on a question, its attempt given back."""
    doc = store.add({"title": "ask", "priority": 9})
    held = store.claim("w")
    assert held["id"] == doc["id"]
    store.fail(doc["id"], held["claim"]["token"], "a first try that failed")
    held = store.claim("w")
    return store.block(doc["id"], held["claim"]["token"], "which one?", question="which one?")


def test_a_blocked_question_moved_to_todo_by_hand_is_dropped(backend, store):
    asked = asked_and_blocked(store)
    assert (asked["question"], asked["attempts"]) == ("which one?", 1)
    moved = store.move(asked["id"], "todo", by="lead")
    assert (moved["status"], moved.get("question"), moved["attempts"], moved["claim"]) == ("todo", None, 0, None)
    assert store.get(asked["id"]).get("question") is None
    with pytest.raises(InvalidTransition):
        store.answer(asked["id"], "too late")
    check_invariants(backend, store)


@pytest.mark.requires(HAND_MOVES)
def test_a_blocked_question_moved_into_todo_by_hand_is_dropped_as_by_move(backend, store):
    """`mv blocked/x.json todo/` is the same person's move as `task move x todo`: one rule for both
    (kanban/rules.py), so the task waits on its question no more and has its attempts again."""
    asked = asked_and_blocked(store)
    backend.hand_move(store, asked["id"], "blocked", "todo")
    adopted = store.get(asked["id"])
    assert (adopted["status"], adopted.get("question"), adopted["attempts"], adopted["claim"]) == (
        "todo", None, 0, None)
    assert adopted["history"][-1]["note"] == "moved into todo/ by hand"
    with pytest.raises(InvalidTransition):
        store.answer(asked["id"], "too late")
    assert store.claim("w")["attempts"] == 1
    check_invariants(backend, store)


def test_a_waiting_note_is_no_transition_and_names_only_what_the_agent_could_take(backend, store):
    needs_model = store.add({"title": "needs a model", "priority": 2})
    planned = store.add({"title": "plan", "steps": [{"tool": "wait", "args": {}}]})
    reviews = store.add({"title": "review", "role": "reviewer"})
    bobs = store.add({"title": "bob's", "assignee": "bob"})
    later = store.add({"title": "later", "depends_on": [needs_model["id"]]})
    events_before = len(all_events(backend, store))
    stamp = store.get(needs_model["id"])["updated_at"]
    assert store.mark_waiting("no model", agent="alice") == 1, "only what alice could claim now"
    assert store.get(needs_model["id"])["waiting"] == "no model"
    for other in (planned, reviews, bobs, later):
        assert "waiting" not in store.get(other["id"]), other["title"]
    assert store.mark_waiting("no model", agent="alice") == 0, "an unchanged note is not written again"
    assert store.mark_waiting("no model", agent="carol", roles=["reviewer"]) == 1
    assert store.get(reviews["id"])["waiting"] == "no model"
    assert store.get(needs_model["id"])["updated_at"] == stamp and len(all_events(backend, store)) == events_before
    claimed = store.claim("alice")
    assert claimed["id"] == needs_model["id"] and "waiting" not in claimed, "a claim drops the note"
    store.release(claimed["id"], claimed["claim"]["token"])
    store.mark_waiting("no provider")
    assert "waiting" not in store.get(planned["id"]), "a task with steps needs no model"
    assert store.get(bobs["id"])["waiting"] == "no provider"
    store.mark_waiting(None)
    assert [doc["id"] for doc in tasks(store) if "waiting" in doc] == []
    check_invariants(backend, store)


@pytest.mark.requires(HAND_MOVES)
def test_a_task_moved_by_hand_into_todo_is_adopted_and_claimed(backend, store):
    doc = store.add({"title": "parked", "status": "blocked"})
    assert store.claim("w") is None
    backend.hand_move(store, doc["id"], "blocked", "todo")
    claimed = wait_until(lambda: store.claim("w"), timeout=15, interval=0.1)
    assert claimed["id"] == doc["id"]
    assert [h["to"] for h in claimed["history"]][-2:] == ["todo", "doing"]
    assert "by hand" in claimed["history"][-2]["note"]
    check_invariants(backend, store)


@pytest.mark.requires(HAND_MOVES)
def test_a_task_moved_by_hand_into_done_takes_that_status(backend, store):
    doc = store.add({"title": "done elsewhere"})
    later = store.add({"title": "after it", "depends_on": [doc["id"]]})
    backend.hand_move(store, doc["id"], "todo", "done")
    store.recover()
    assert store.get(doc["id"])["status"] == "done"
    assert [d["id"] for d in tasks(store, "done")] == [doc["id"]]
    assert store.claim("w")["id"] == later["id"]
    check_invariants(backend, store)


@pytest.mark.requires(HAND_MOVES)
@pytest.mark.parametrize("folder", ["blocked", "failed", "cancelled"])
def test_a_task_moved_by_hand_is_adopted_by_a_listing_too(backend, store, folder):
    doc = store.add({"title": "moved"})
    backend.hand_move(store, doc["id"], "todo", folder)
    assert [d["id"] for d in tasks(store, folder)] == [doc["id"]], "list() adopts what it finds moved"
    assert store.get(doc["id"])["status"] == folder
    assert store.get(doc["id"])["history"][-1]["note"].endswith("by hand")
    check_invariants(backend, store)


@pytest.mark.requires(HAND_MOVES)
def test_invariant_check_itself_sees_a_task_in_two_places(backend, store):
    """The shared check must be able to fail: a copy of a task file in a second folder is caught."""
    doc = store.add({"title": "twice"})
    source = store.root / "todo" / f"{doc['id']}.json"
    (store.root / "done" / source.name).write_bytes(source.read_bytes())
    with pytest.raises(AssertionError):
        check_invariants(backend, store)


@pytest.mark.requires(HAND_MOVES)
def test_a_tie_in_priority_and_age_is_broken_by_id(backend, store):
    """Documents written by hand may share created_at to the microsecond; the order stays total."""
    stamp = "2026-01-01T00:00:00.000000Z"
    for task_id in ("tie-c", "tie-a", "tie-b"):
        doc = {"id": task_id, "title": task_id, "status": "todo", "priority": 1, "created_at": stamp,
               "updated_at": stamp, "history": [{"at": stamp, "by": "hand", "from": None, "to": "todo", "note": ""}]}
        (store.root / "todo" / f"{task_id}.json").write_text(json.dumps(doc))
    store.add({"title": "younger, same priority", "priority": 1})
    order = [store.claim("w")["id"] for _ in range(3)]
    assert order == ["tie-a", "tie-b", "tie-c"]


def test_the_listing_fields_are_those_of_the_whole_documents(backend, store):
    plain = store.add({"title": "plain", "body": "b" * 2000, "priority": 2})
    store.add({"title": "after", "depends_on": [plain["id"]], "role": "code", "assignee": "w"})
    claimed = store.claim("w")
    store.block(claimed["id"], claimed["claim"]["token"], "stuck", question="which?")
    store.add({"title": "held", "steps": [{"tool": "terminal", "args": {"command": "true"}}]})
    claim = store.claim("v")["claim"]
    for status in (None, "todo", "doing"):
        whole = store.list(status)
        fields = store.list_fields(status)
        assert fields.tasks == [reads.listed_fields(doc) for doc in whole.tasks]
        assert fields.damaged == whole.damaged
    held = store.list_fields("doing").tasks[0]
    # Who holds it, where and until when (the dashboard's card shows them), never the claim's token.
    assert held["claim"] == {"agent": "v", "host": claim["host"], "lease_until_ts": claim["lease_until_ts"]}
    assert held["steps"] is True and "body" not in held
    assert store.list_fields("blocked").tasks[0]["question"] == "which?"


def test_task_ids_name_every_task_of_every_status_once(backend, store):
    """What a prefix of an id is resolved against (kanban/prefix.py): the board's own ids, whatever
    holds them, of tasks in every status, each once and sorted."""
    for task_id in ("write-report", "write-review", "deploy", "fix-login"):
        store.add({"title": task_id, "id": task_id, "priority": 1 if task_id == "deploy" else 0})
    claimed = store.claim("w")
    assert claimed["id"] == "deploy"
    store.cancel("fix-login")
    assert store.task_ids() == ["deploy", "fix-login", "write-report", "write-review"]
    store.complete("deploy", claimed["claim"]["token"], "ok")
    assert store.task_ids() == ["deploy", "fix-login", "write-report", "write-review"]
    check_invariants(backend, store)


def test_task_ids_of_an_empty_board_are_none(backend, store):
    assert store.task_ids() == []
