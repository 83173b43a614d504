"""Why a task is not moving, computed from the task, the board's other tasks and the team (pure).

The reasons are tried from the most structural to the most passing, so that a task no agent could
ever claim says so, rather than repeating a provider's trouble that would not help it anyway:
a question for a person; an assignee that is no agent of the team, or lacks the task's role; a role
no agent has; a dependency that is missing, then one not done; a budget reached (`budget`, given by
the caller); no agent that could take it running; and last, what the agents that could take
it report (no LLM provider, a provider cooling down), or that they are all busy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The agents' own words for "no provider at all": agents/worker.py says it with this one (kanban
# never imports agents).
NO_PROVIDER = "no LLM provider available"
# Supervisor states of an agent that is (or is about to be) taking tasks.
LIVE_STATES = frozenset({"running", "starting"})
# Statuses after which a dependency will never be done without a person.
DEAD_STATUSES = frozenset({"failed", "cancelled"})
# Kinds that mean no agent of the team could ever claim the task as it is: `task add` and ingest warn.
NEVER_CLAIMABLE = ("no_agent", "assignee_missing", "assignee_lacks_role", "no_role", "dependency_missing")


@dataclass(frozen=True)
class Member:
    """One agent of the team as far as it is known: from hermes.yaml (name, roles, tier), from the
    supervisor's state (`state`, `task`; None when no supervisor runs), and what the agent itself
    reports (`waiting`: why it leaves LLM tasks in todo; "" when it says it does not, None when it
    is not known)."""

    name: str
    roles: tuple[str, ...] = ()
    tier: str = "auto"
    state: str | None = None
    task: str | None = None
    waiting: str | None = None


@dataclass(frozen=True)
class Team:
    members: tuple[Member, ...]
    # Whether a supervisor runs this team now: True, False, or None when it cannot be told.
    running: bool | None = None


@dataclass(frozen=True)
class Waiting:
    kind: str  # a stable word for scripts: see NEVER_CLAIMABLE and why_waiting
    text: str  # the reason in words, naming the role, agent or tasks concerned

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


def _names(items: Iterable[str]) -> str:
    return ", ".join(items) or "none"


def _delegated(doc: Mapping[str, Any]) -> bool:
    """A subtask an agent delegated: assigned to a child agent its parent starts, not to a member."""
    meta = doc.get("meta")
    return isinstance(meta, Mapping) and isinstance(meta.get("parent"), Mapping)


def structural(doc: Mapping[str, Any], statuses: Mapping[str, str], team: Team | None) -> Waiting | None:
    """The reason no agent of `team` could ever claim `doc` as it stands, or None. Without a team
    (hermes.yaml unreadable) only its dependencies are judged."""
    assignee, role = doc.get("assignee"), doc.get("role")
    if team is not None:
        members = {member.name: member for member in team.members}
        if not members:
            return Waiting("no_agent", "the team has no agents (hermes.yaml lists none)")
        if assignee and assignee not in members and not _delegated(doc):
            return Waiting("assignee_missing", f"its assignee {assignee} is no agent of the team "
                                               f"(agents: {_names(members)})")
        if assignee in members and role and role not in members[assignee].roles:
            return Waiting("assignee_lacks_role", f"its assignee {assignee} does not have its role {role} "
                                                  f"(roles of {assignee}: {_names(members[assignee].roles)})")
        if role and not assignee and not any(role in member.roles for member in team.members):
            roles = sorted({r for member in team.members for r in member.roles})
            return Waiting("no_role", f"no agent has the role {role} (roles of the team: {_names(roles)})")
    missing = [dep for dep in doc.get("depends_on") or () if dep not in statuses]
    if missing:
        return Waiting("dependency_missing", f"it depends on {_names(missing)}, not on the board")
    return None


def _dependencies(doc: Mapping[str, Any], statuses: Mapping[str, str]) -> Waiting | None:
    pending = [(dep, statuses[dep]) for dep in doc.get("depends_on") or () if statuses.get(dep) != "done"]
    if not pending:
        return None
    dead = [dep for dep, status in pending if status in DEAD_STATUSES]
    text = f"waiting for {_names(f'{dep} ({status})' for dep, status in pending)} to be done"
    if dead:
        text += f"; {_names(dead)} will not be done unless retried (`hermes-sup task retry ID`)"
    return Waiting("dependency_not_done", text)


def _eligible(doc: Mapping[str, Any], team: Team) -> list[Member]:
    assignee, role = doc.get("assignee"), doc.get("role")
    return [member for member in team.members
            if (not assignee or member.name == assignee) and (not role or role in member.roles)]


def _person(doc: Mapping[str, Any]) -> Waiting:
    question = doc.get("question")
    task_id = doc.get("id")
    if isinstance(question, str) and question:
        return Waiting("question", f"waiting for a person to answer: {question} "
                                   f"(`hermes-sup task answer {task_id} TEXT`)")
    why = doc.get("error") or "no reason given"
    return Waiting("person", f"blocked ({why}); waiting for a person (`hermes-sup task retry {task_id}`)")


def why_waiting(doc: Mapping[str, Any], statuses: Mapping[str, str], team: Team | None, *,
                budget: str | None = None) -> Waiting | None:
    """Why `doc` (a todo or blocked task) is not being worked, or None when it is not waiting (any
    other status, or an agent free to take it now). `statuses` maps every task id on the board to its
    status; `budget`, when a budget the task falls under is reached, says which. The agents' own
    budget waits (a team or agent cap) come through their `waiting` reason, kind `budget` too."""
    status = doc.get("status")
    if status == "blocked":
        return _person(doc)
    if status != "todo":
        return None
    found = structural(doc, statuses, team) or _dependencies(doc, statuses)
    if found is not None:
        return found
    if budget:
        return Waiting("budget", f"budget reached: {budget}")
    if team is None:
        return _noted(doc)
    if _delegated(doc) and doc.get("assignee") not in {member.name for member in team.members}:
        return None  # its parent agent starts the child that takes it
    eligible = _eligible(doc, team)
    if team.running is False:
        return Waiting("not_running", "the team is not running (start it with `hermes-sup up`)")
    if team.running:
        live = [member for member in eligible if member.state in LIVE_STATES]
        if not live:
            states = _names(f"{member.name} ({member.state or 'not started'})" for member in eligible)
            return Waiting("no_agent_running", f"no agent that could take it is running: {states}")
        eligible = live
    return _providers(doc, eligible)


def _providers(doc: Mapping[str, Any], eligible: Sequence[Member]) -> Waiting | None:
    """What the agents that could take the task say: an LLM task waits while every one of them
    leaves LLM tasks in todo; a task with steps needs no provider. When none of them has said
    anything readable, the note an agent that could claim the task left on it stands in."""
    if not doc.get("steps"):
        reported = [member.waiting for member in eligible if member.waiting is not None]
        if not reported:
            noted = _noted(doc)
            if noted is not None:
                return noted
        elif len(reported) == len(eligible) and all(reported):
            return _provider_reason(str(reported[0]))
    if eligible and all(member.task for member in eligible):
        return Waiting("busy", f"every agent that could take it is busy: "
                               f"{_names(f'{member.name} on {member.task}' for member in eligible)}")
    return None


def _noted(doc: Mapping[str, Any]) -> Waiting | None:
    note = doc.get("waiting")
    return _provider_reason(note) if isinstance(note, str) and note and not doc.get("steps") else None


# How an agent's waiting reason starts when a team or agent budget cap holds its LLM tasks
# (agents/budget.py Refusal.text; kanban never imports agents, a test holds the two equal).
BUDGET_REACHED = "budget reached: "


def _provider_reason(text: str) -> Waiting:
    if text.startswith(BUDGET_REACHED):
        return Waiting("budget", text)
    return Waiting("no_provider" if text == NO_PROVIDER else "provider_cooldown", text)


def claim_warnings(doc: Mapping[str, Any], statuses: Mapping[str, str], team: Team | None) -> list[str]:
    """What `task add` and ingest say about a new task no agent of the team could ever claim (pure)."""
    found = structural(doc, statuses, team)
    return [f"{doc.get('id')}: no agent can ever claim it: {found.text}"] if found is not None else []
