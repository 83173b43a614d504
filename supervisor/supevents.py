"""The supervisor's events (an agent started, exited, restarting, fatal, hung, stopped or started by
hand, a reload applied or refused) appended to the board's events.jsonl, beside the board's
transitions.

Each event is made as a record where it happens (exits.py decides an exit and its events, runner.py
the others) and its log line is rendered from it; nothing is read back from a line. What the
supervisor says without an event of its own is recorded too, as a `note` (whose agent is the one
the line is about: it starts with the agent's name), so nothing it said is missing from the stream.
The operator's commands are recorded from their answers (some of which are never said).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable
from typing import Any

from ..kanban.task import now_iso

NOTE_CHARS = 2000  # a line is the supervisor's own, but it may quote a task or a path at length
COMMANDS = ("stop", "start", "restart", "reload")
Handler = Callable[[dict[str, Any]], dict[str, Any]]


def note(line: str, agents: Collection[str], at: str) -> dict[str, Any]:
    """A line said with no event of its own, as a `note` event (pure)."""
    agent, sep, _ = line.partition(": ")
    return {"at": at, "kind": "supervisor", "event": "note", "agent": agent if sep and agent in agents else None,
            "note": line[:NOTE_CHARS]}


def command_event(request: dict[str, Any], answer: dict[str, Any], at: str) -> dict[str, Any] | None:
    """The event of an operator's command (stop, start, restart, reload) from its answer; None for
    the others (status, down: down is said, status changes nothing) (pure)."""
    cmd = request.get("cmd")
    if cmd not in COMMANDS:
        return None
    name = "reload" if cmd == "reload" else f"operator_{cmd}"
    agent = request.get("agent")
    return {"at": at, "kind": "supervisor", "event": name if answer.get("ok") is True else f"{name}_refused",
            "agent": agent if isinstance(agent, str) else None, "note": str(answer.get("message") or "")[:NOTE_CHARS]}


class SupervisorEvents:
    """Appends the supervisor's events to the log; a write that fails (a full disk) costs the event,
    never the supervision, and is counted."""

    def __init__(self, append: Callable[[dict[str, Any]], None], agents: Callable[[], Collection[str]]) -> None:
        self.append = append  # the board's append_event
        self.agents = agents  # the team's names now (they change on reload)
        self.lost = 0

    def record(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            try:
                self.append({"at": now_iso(), **record, "note": str(record.get("note") or "")[:NOTE_CHARS]})
            except (OSError, ValueError):
                self.lost += 1

    def telling(self, say: Callable[[str], None]) -> Callable[[str, Iterable[dict[str, Any]]], None]:
        """Say a line and record the events it was rendered from."""

        def tell(line: str, records: Iterable[dict[str, Any]]) -> None:
            say(line)
            # As with the line itself (statefile.quiet): an event is never worth the supervision.
            with contextlib.suppress(Exception):
                self.record(records)

        return tell

    def recording(self, say: Callable[[str], None]) -> Callable[[str], None]:
        """`say` that also records the line as a note."""

        def said(line: str) -> None:
            say(line)
            with contextlib.suppress(Exception):
                self.record([note(line, self.agents(), now_iso())])

        return said

    def commands(self, handle: Handler) -> Handler:
        """The control socket's handler, recording the operator's commands with their answers."""

        def handled(request: dict[str, Any]) -> dict[str, Any]:
            answer = handle(request)
            record = command_event(request, answer, now_iso())
            if record is not None:
                self.record([record])
            return answer

        return handled
