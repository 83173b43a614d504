"""The supervisor's events (an agent started, exited, restarting, fatal, stopped or started by hand, a
reload applied or refused) appended to the board's events.jsonl, beside the board's transitions.

The supervisor already says each of these once, as a line of its log; so the hook is on `say`: a
pure function turns each line into structured events (`kind: "supervisor"`, an `event` name, the
agent, a pid, an exit code or signal, a backoff delay, and the line itself as `note`), and every
line it says is recorded (the unrecognised ones as `event: "note"`), so nothing the supervisor said
is missing from the stream. The operator's commands are recorded from their answers (some of which
are never said). Lines about board transitions the board logs itself are not recorded twice.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Collection
from typing import Any

from hermes_sup.kanban.task import now_iso

NOTE_CHARS = 2000  # a line is the supervisor's own, but it may quote a task or a path at length

_HOW = r"(?P<how>exited with status (?P<code>-?\d+)|killed by (?P<signal>SIG\w+|signal \d+)|vanished)"
_WHY = r"(?: \((?P<why>[\w -]+)\))?"
# (pattern, events it means), tried in order on what follows "<agent>: ".
_AGENT_LINES: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (re.compile(pattern), events) for pattern, events in (
        (r"started \(pid (?P<pid>\d+)\)$", ("started",)),
        (r"adopted the running agent \(pid (?P<pid>\d+)\)$", ("adopted",)),
        (rf"FATAL: (?:{_HOW}; )?.*$", ("fatal",)),
        (rf"{_HOW}; restart in (?P<delay>\d+(?:\.\d+)?) s$", ("exited", "restarting")),
        (rf"{_HOW}; restart policy [\w-]+$", ("exited",)),
        (rf"{_HOW}{_WHY}; (?:restarting|starting again)$", ("exited", "restarting")),
        (rf"stopped, {_HOW}{_WHY}$", ("exited",)),
        (r"could not start: .*; retry in (?P<delay>\d+(?:\.\d+)?) s$", ("start_failed",)),
        (r"(?:never reported ready|stopped heart-beating) for .*; killing it$", ("hung",)),
        (r"uses \d+ MB, over max_rss_mb .*$", ("over_memory",)),
        (r"did not stop within .*; SIGKILL$", ("killed",)),
        (r"stopped by hand; not started .*$", ("held",)),
        # Said when a person stops or starts one: recorded from the command's answer instead.
        (r"stopping by hand; .*$", ()),
        (r"started by hand.*$", ()),
    ))
# Told by the board itself (a claim given back, a drop rejected): its own event is in the log already.
_BOARD_TOLD = (re.compile(r"board: \S+ back to \w+ \(.*\)$"), re.compile(r"rejected .*: .*$"))
COMMANDS = ("stop", "start", "restart", "reload")
Handler = Callable[[dict[str, Any]], dict[str, Any]]


def classify(line: str, agents: Collection[str], at: str) -> list[dict[str, Any]]:
    """The events one line of the supervisor's log stands for (pure): [] for a line the board has
    logged already, one `note` event for a line of no known form."""
    if any(pattern.match(line) for pattern in _BOARD_TOLD):
        return []
    note = line[:NOTE_CHARS]
    agent, sep, rest = line.partition(": ")
    if sep and agent in agents:
        for pattern, names in _AGENT_LINES:
            found = pattern.match(rest)
            if found is None:
                continue
            details = _details(found.groupdict())
            # The delay belongs to the restart, the exit status or signal to the exit.
            return [{"at": at, "kind": "supervisor", "event": name, "agent": agent,
                     **{k: v for k, v in details.items() if not (name == "exited" and k == "delay")}, "note": note}
                    for name in names]
        return [{"at": at, "kind": "supervisor", "event": "note", "agent": agent, "note": note}]
    if line.startswith("reload refused"):
        return [{"at": at, "kind": "supervisor", "event": "reload_refused", "agent": None, "note": note}]
    if line.startswith("reload: "):
        return [{"at": at, "kind": "supervisor", "event": "reload", "agent": None, "note": note}]
    if line.startswith("ingest: warning: "):
        return [{"at": at, "kind": "supervisor", "event": "warning", "agent": None, "note": note}]
    return [{"at": at, "kind": "supervisor", "event": "note", "agent": None, "note": note}]


def _details(groups: dict[str, str | None]) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if groups.get("pid"):
        details["pid"] = int(groups["pid"] or 0)
    if groups.get("code"):
        details["code"] = groups["code"]
    if groups.get("signal"):
        details["signal"] = groups["signal"]
    if groups.get("delay"):
        details["delay"] = float(groups["delay"] or 0)
    return details


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

    def record(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            try:
                self.append(record)
            except (OSError, ValueError):
                self.lost += 1

    def recording(self, say: Callable[[str], None]) -> Callable[[str], None]:
        """`say` that also records what each line means."""

        def said(line: str) -> None:
            say(line)
            # As with the line itself (statefile.quiet): an event is never worth the supervision.
            with contextlib.suppress(Exception):
                self.record(classify(line, self.agents(), now_iso()))

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
