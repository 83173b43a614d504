"""Why a task is not moving: the pure reasons (kanban/why.py), each on plain data, no processes."""

from __future__ import annotations

from typing import Any

import pytest
from hermes_sup.agents.worker import NO_PROVIDER as AGENT_NO_PROVIDER
from hermes_sup.kanban.why import NO_PROVIDER, Member, Team, claim_warnings, why_waiting

UNREACHABLE = "provider local down until 2026-11-22T18:00:00Z (unreachable)"


def task(**fields: Any) -> dict[str, Any]:
    return {"id": "t", "title": "t", "status": "todo", "depends_on": [], **fields}


def team(*members: Member, running: bool | None = True) -> Team:
    return Team(members=members, running=running)


WORKER = Member("worker", roles=("code",), state="running", waiting="")
WRITER = Member("writer", roles=("docs",), state="running", waiting="")


def kind(doc: dict[str, Any], statuses: dict[str, str] | None = None, of: Team | None = None, **kw: Any) -> str | None:
    found = why_waiting(doc, statuses or {}, team(WORKER, WRITER) if of is None else of, **kw)
    return found.kind if found else None


def test_the_agents_and_the_board_share_the_words_for_no_provider():
    assert NO_PROVIDER == AGENT_NO_PROVIDER


def test_a_ready_task_with_a_free_agent_is_not_waiting():
    assert why_waiting(task(), {}, team(WORKER)) is None
    assert why_waiting(task(status="doing"), {}, team(WORKER)) is None
    assert why_waiting(task(status="done"), {}, team(WORKER)) is None


def test_no_agent_has_its_role():
    found = why_waiting(task(role="design"), {}, team(WORKER, WRITER))
    assert found and found.kind == "no_role"
    assert found.text == "no agent has the role design (roles of the team: code, docs)"


def test_its_assignee_does_not_exist_or_lacks_the_role():
    found = why_waiting(task(assignee="ghost"), {}, team(WORKER))
    assert found and found.kind == "assignee_missing" and "ghost" in found.text and "worker" in found.text
    assert kind(task(assignee="writer", role="code")) == "assignee_lacks_role"
    assert kind(task(assignee="writer", role="docs")) is None


def test_a_delegated_subtask_assigned_to_a_child_is_not_a_missing_assignee():
    child = task(assignee="worker.child-1", meta={"parent": {"task": "p", "agent": "worker"}})
    assert kind(child) is None


def test_a_missing_dependency_is_named_before_any_provider_reason():
    stuck = Member("worker", roles=("code",), state="running", waiting=UNREACHABLE)
    found = why_waiting(task(depends_on=["nope", "there"]), {"there": "todo"}, team(stuck))
    assert found and found.kind == "dependency_missing" and found.text == "it depends on nope, not on the board"


def test_a_dependency_not_done_is_named_with_its_status():
    found = why_waiting(task(depends_on=["a", "b", "c"]), {"a": "done", "b": "doing", "c": "failed"}, team(WORKER))
    assert found and found.kind == "dependency_not_done"
    assert "b (doing)" in found.text and "c (failed)" in found.text and "a (" not in found.text
    assert "c will not be done unless retried" in found.text


def test_the_role_is_judged_before_the_dependencies():
    assert kind(task(role="design", depends_on=["nope"])) == "no_role"


def test_no_provider_and_provider_cooldown_come_from_what_the_agents_that_could_take_it_say():
    offline = Member("worker", state="running", waiting=NO_PROVIDER)
    cooling = Member("other", state="running", waiting=UNREACHABLE)
    found = why_waiting(task(), {}, team(offline))
    assert found and found.kind == "no_provider" and found.text == NO_PROVIDER
    found = why_waiting(task(), {}, team(cooling))
    assert found and found.kind == "provider_cooldown" and found.text == UNREACHABLE
    # One agent that could take it has a provider: it is not waiting for one.
    assert kind(task(), of=team(offline, Member("fine", state="running", waiting=""))) is None
    # A task with steps needs no provider.
    assert kind(task(steps=[{"tool": "write_file", "args": {}}]), of=team(offline)) is None


def test_an_agent_that_could_not_take_the_task_does_not_lend_it_its_provider_reason():
    offline_writer = Member("writer", roles=("docs",), state="running", waiting=NO_PROVIDER)
    assert kind(task(role="code"), of=team(WORKER, offline_writer)) is None


def test_the_note_an_agent_left_stands_in_when_no_agent_report_can_be_read():
    unknown = Member("worker", state="running", waiting=None)
    found = why_waiting(task(waiting=UNREACHABLE), {}, team(unknown))
    assert found and found.kind == "provider_cooldown"
    # A structural reason wins over any note left on the task.
    assert kind(task(waiting=UNREACHABLE, depends_on=["nope"]), of=team(unknown)) == "dependency_missing"


def test_the_team_not_running_or_every_able_agent_stopped():
    assert kind(task(), of=team(WORKER, running=False)) == "not_running"
    stopped = Member("worker", roles=("code",), state="stopped")
    found = why_waiting(task(role="code"), {}, team(stopped, WRITER))
    assert found and found.kind == "no_agent_running" and found.text.endswith("worker (stopped)")


def test_every_able_agent_busy():
    busy = Member("worker", state="running", task="other", waiting="")
    found = why_waiting(task(), {}, team(busy))
    assert found and found.kind == "busy" and "worker on other" in found.text


def test_a_team_without_agents():
    assert kind(task(), of=team()) == "no_agent"


def test_waiting_for_a_person():
    found = why_waiting(task(status="blocked", question="which colour?"), {}, team(WORKER))
    assert found and found.kind == "question" and "which colour?" in found.text and "task answer t" in found.text
    found = why_waiting(task(status="blocked", error="needs a key"), {}, team(WORKER))
    assert found and found.kind == "person" and "needs a key" in found.text


def test_a_reached_budget_comes_before_the_providers():
    offline = Member("worker", state="running", waiting=NO_PROVIDER)
    found = why_waiting(task(), {}, team(offline), budget="daily cost $5.00")
    assert found and found.kind == "budget" and found.text == "budget reached: daily cost $5.00"


def test_without_a_team_only_dependencies_and_notes_are_judged():
    assert why_waiting(task(role="anything"), {}, None) is None
    found = why_waiting(task(depends_on=["nope"]), {}, None)
    assert found and found.kind == "dependency_missing"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"role": "design"}, "no agent has the role design"),
    ({"assignee": "ghost"}, "its assignee ghost is no agent of the team"),
    ({"depends_on": ["nope"]}, "it depends on nope, not on the board"),
])
def test_claim_warnings_name_what_no_agent_could_ever_claim(fields, expected):
    warnings = claim_warnings(task(**fields), {}, team(WORKER))
    assert len(warnings) == 1 and expected in warnings[0] and warnings[0].startswith("t: no agent can ever claim it")


def test_no_warning_for_a_claimable_task_or_one_waiting_on_a_real_dependency():
    assert claim_warnings(task(role="code", depends_on=["a"]), {"a": "todo"}, team(WORKER)) == []
    assert claim_warnings(task(), {}, team(Member("worker", state="stopped"), running=False)) == []


def test_an_agent_notes_its_provider_reason_only_on_tasks_it_could_claim(board):
    dep = board.add({"title": "a dependency"})
    plain = board.add({"title": "plain"})
    mine = board.add({"title": "my role", "role": "code"})
    other_role = board.add({"title": "their role", "role": "docs"})
    missing_dep = board.add({"title": "needs nope", "depends_on": ["nope"]})
    pending_dep = board.add({"title": "needs the dependency", "depends_on": [dep["id"]]})
    theirs = board.add({"title": "someone else's", "assignee": "writer"})
    board.mark_waiting(UNREACHABLE, agent="worker", roles=("code",))
    noted = {doc["id"] for doc in board.list("todo").tasks if doc.get("waiting")}
    assert noted == {dep["id"], plain["id"], mine["id"]}
    for untouched in (other_role, missing_dep, pending_dep, theirs):
        assert "waiting" not in board.get(untouched["id"])


def test_an_agents_report_is_read_only_from_its_own_regular_state_file(tmp_path):
    import json
    import os

    from hermes_sup.supervisor.team import agent_waiting

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "state.json").write_text(json.dumps({"pid": 42, "waiting": NO_PROVIDER}))
    assert agent_waiting(tmp_path, "a", 42) == NO_PROVIDER
    assert agent_waiting(tmp_path, "a", 43) is None, "another process's report says nothing of this one"
    (tmp_path / "b").mkdir()
    os.mkfifo(tmp_path / "b" / "state.json")  # would hang a plain read
    assert agent_waiting(tmp_path, "b", 42) is None
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "state.json").write_text(json.dumps({"pid": 42, "waiting": ["not", "text"]}))
    assert agent_waiting(tmp_path, "c", 42) is None
    assert agent_waiting(tmp_path, "missing", 42) is None
