"""A task's `steps`, its deterministic plan of tool calls, run with no LLM and resumed after a crash.

Each step is logged in the agent's tool-call log (turn "steps", call id `step-N`) as started, then
done with its result, exactly like a model's tool call. A resumed task (by this agent or, after a
reclaim, by another one, whose records are copied over) takes the results of the steps completed
before and runs the rest. A step that was running when its agent died is run again if its tool is
idempotent; if not, running it again could double its effect, so the task is blocked for a person,
and runs it again only once a person has moved the task back to todo (`task retry`). An
`ask_human` step blocks the task with its question; once a person answers (`task answer`), the
answer is that step's result. A step refused outright (unknown tool, a capability not granted, bad
arguments) fails the task at once: no attempt would go differently.

Steps run with the rights of whoever wrote them, never more: a person's task (a drop, `task add`,
the dashboard, a schedule of hermes.yaml) with the claiming agent's capabilities, a task an agent
put on the board with the capabilities the board tool recorded from that agent when it made the
task (`meta.capabilities`), intersected with the claimer's. An agent without `shell` cannot have a
teammate with `shell` run `terminal` for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..kanban.faults import fault
from ..kanban.journal import FileTaskJournal, TaskJournal
from .conversation import holders
from .durable import ASKS, answer_since, call_done, call_started
from .logline import call_line, say
from .telemetry import active as telemetry
from .tools import Finished, NeedsPerson, Refused, Toolbox, ToolContext, ToolError, run_step

TURN = "steps"
# Who `history[0].by` names when a person made the task: `task add`, the drop zone's ingest, the
# dashboard's "add a task" (a user of this machine, or one holding its token), and a schedule of
# hermes.yaml, which the operator wrote (`schedule NAME`).
PEOPLE = ("cli", "ingest", "dashboard")
SCHEDULED = "schedule "


def made_by_a_person(by: str) -> bool:
    """Whether a task's first author is a person (pure)."""
    return by in PEOPLE or (by.startswith(SCHEDULED) and len(by) > len(SCHEDULED) and " " not in by[len(SCHEDULED):])


def step_grants(claimer: Iterable[str], task: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """(the capabilities a task's steps run with, who they are, for a refusal) (pure).

    `meta.capabilities` is what the board tool recorded when an agent made the task (a person may
    set it too, to narrow a task of theirs): the steps get at most that. Without it, a task a person
    made gets the claimer's capabilities, and one an agent made (before the record existed, or by a
    way that does not write one) gets none: unknown rights are no rights. A malformed record
    counts as none too."""
    mine = tuple(claimer)
    meta = task.get("meta") if isinstance(task.get("meta"), dict) else {}
    history = task.get("history") if isinstance(task.get("history"), list) else []
    first = history[0] if history and isinstance(history[0], dict) else {}
    creator = str(first.get("by") or "?")
    if "capabilities" in meta:
        recorded = meta["capabilities"]
        if not isinstance(recorded, list) or not all(isinstance(c, str) for c in recorded):
            return (), "this task's steps (their recorded capabilities are malformed)"
        by = str(meta.get("created_by") or creator)
        return tuple(c for c in mine if c in recorded), f"this task's steps (written by {by})"
    if made_by_a_person(creator):
        return mine, "this agent"
    return (), f"this task's steps (written by {creator}, who recorded no capabilities)"


def step_folders(claimer: Mapping[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    """The granted folders a task's steps run with (pure), as step_grants decides capabilities:
    `claimer` is the claiming agent's `folders` ({name: {path, mode}}); `meta.folders` (the same
    shape) is what the board tool recorded of the task's maker. The steps get the folders both have
    (by name and path: a reload that moved a name elsewhere gives them nothing there), read-only
    where either is; none for a task an agent made without a record; the claimer's for a person's.
    Otherwise a teammate without a grant could write into one by a task of steps."""
    meta = task.get("meta") if isinstance(task.get("meta"), dict) else {}
    history = task.get("history") if isinstance(task.get("history"), list) else []
    first = history[0] if history and isinstance(history[0], dict) else {}
    if "folders" not in meta:
        return dict(claimer) if made_by_a_person(str(first.get("by") or "?")) and "capabilities" not in meta else {}
    recorded = meta["folders"]
    if not isinstance(recorded, dict):
        return {}
    kept = {}
    for name, spec in claimer.items():
        theirs = recorded.get(name)
        if isinstance(spec, Mapping) and isinstance(theirs, Mapping) and theirs.get("path") == spec.get("path"):
            kept[name] = {**spec, "mode": "rw" if spec.get("mode") == "rw" and theirs.get("mode") == "rw" else "ro"}
    return kept


def step_id(index: int) -> str:
    return f"step-{index + 1}"


@dataclass
class Progress:
    """What the log says about a task's steps: results of the completed ones, and when the ones that
    never finished started."""

    done: dict[str, Any] = field(default_factory=dict)
    started: dict[str, str] = field(default_factory=dict)


def progress(records: Iterable[dict[str, Any]], task_id: str) -> Progress:
    """Fold the tool-call log into the task's step progress (pure). A step that ended in an error is
    not done: the next attempt runs it again."""
    seen = Progress()
    for record in records:
        if record.get("task") != task_id or record.get("turn") != TURN:
            continue
        call_id = str(record.get("call_id"))
        if record.get("status") == "started":
            seen.started[call_id] = str(record.get("at") or "")
            seen.done.pop(call_id, None)
        elif record.get("status") == "done":
            seen.started.pop(call_id, None)
            if record.get("outcome") == "ok":
                seen.done[call_id] = record.get("value", record.get("result"))
    return seen


def retried_since(task: dict[str, Any], moment: str) -> bool:
    """Whether someone moved the task from blocked or failed back to todo after `moment` (pure)."""
    return any(entry.get("from") in ("blocked", "failed") and entry.get("to") == "todo"
               and str(entry.get("at") or "") > moment for entry in task.get("history") or [])


@dataclass
class StepsOutcome:
    """How running a task's steps ended: the task's next status, and the results of the steps done."""
    kind: str  # done, failed, blocked
    results: list[Any] = field(default_factory=list)
    reason: str = ""
    question: str | None = None  # blocked by an ask_human step: what it asks a person
    permanent: bool = False  # failed in a way no further attempt can change


class StepRun:
    def __init__(self, *, task: dict[str, Any], workdir: Path, ctx: ToolContext, toolbox: Toolbox,
                 agent: str, on_step: Callable[[int], None] = lambda step: None,
                 journal: TaskJournal | None = None) -> None:
        self.task = task
        self.ctx = ctx
        self.toolbox = toolbox
        self.on_step = on_step
        self.agent = agent
        self.log: TaskJournal = journal if journal is not None else FileTaskJournal(workdir, task["id"])
        _earlier, self.others = holders(task, agent)

    def _records(self) -> list[dict[str, Any]]:
        """This agent's records of the task, after copying in those of every agent that held it
        before (not only the last: it may have died before copying any). Records are told apart by
        their time too: a step started again after a retry is a new record."""
        for holder in self.others:
            self.log.take_tool_calls(holder, ("turn", "call_id", "status", "at"))
        return self.log.tool_calls()

    def run(self) -> StepsOutcome:
        """Run the steps not yet done; InterruptedError when the agent is asked to stop."""
        seen = progress(self._records(), self.task["id"])
        results: list[Any] = []
        for index, step in enumerate(self.task.get("steps") or []):
            call_id = step_id(index)
            name = str(step.get("tool", "")) if isinstance(step, dict) else ""
            if call_id in seen.done:
                results.append(seen.done[call_id])
                continue
            if self.ctx.stop.is_set():
                raise InterruptedError
            self.on_step(index + 1)
            tool = self.toolbox.get(name)
            answer = answer_since(self.task, seen.started[call_id]) if (
                name in ASKS and call_id in seen.started) else None
            if answer is not None:  # the step asked, the task blocked, a person answered: its result
                self._done(call_id, name, answer, "ok", time.monotonic())
                results.append(answer)
                continue
            if call_id in seen.started and not (tool and tool.idempotent) and not retried_since(
                    self.task, seen.started[call_id]):
                return StepsOutcome("blocked", results, (
                    f"step {index + 1} ({name}) was running when the agent stopped, and it is not safe to repeat: "
                    f"check whether it took effect, then `hermes-sup task retry {self.task['id']}` runs it again "
                    f"(or cancel the task)"))
            started = time.monotonic()
            self.log.append_tool_call(call_started(self.task["id"], TURN, call_id, name,
                                                   step.get("args") if isinstance(step, dict) else None))
            fault("step-started")
            try:
                value = run_step(self.ctx, step, self.toolbox)
            except NeedsPerson as question:  # stays started: the answer, once given, is its result
                return StepsOutcome("blocked", results, f"step {index + 1} asks: {question}", question=str(question))
            except Finished as end:  # kanban_complete as a step: the plan ends here, done
                self._done(call_id, name, end.summary, "ok", started, step.get("args"))
                return StepsOutcome("done", [*results, end.summary])
            except ToolError as exc:
                if self.ctx.stop.is_set():
                    raise InterruptedError from None
                self._done(call_id, name, f"error: {exc}", "error", started, step.get("args"))
                # A refused step (unknown tool, a capability the agent lacks, bad arguments) is
                # refused again on every attempt: the task fails now, not after max_attempts.
                return StepsOutcome("failed", results, f"step {index + 1} ({name}): {exc}",
                               permanent=isinstance(exc, Refused))
            self._done(call_id, name, value, "ok", started, step.get("args"))
            fault("step-done")
            results.append(value)
        return StepsOutcome("done", results)

    def _done(self, call_id: str, name: str, value: Any, outcome: str, started: float, args: Any = None) -> None:
        text = value if isinstance(value, str) else repr(value)
        duration = time.monotonic() - started
        say(self.agent, call_line(self.task["id"], call_id.replace("-", " "), name, args, outcome, duration, text))
        kept = {"value": value} if not isinstance(value, str) and _plain(value) else None
        self.log.append_tool_call(call_done(self.task["id"], TURN, call_id, name, outcome, text, duration, kept))
        # A tool-call span as the loop's, once the record is written; a step done by an earlier
        # attempt is not run again (run() takes its result) and gives none: that attempt's span has it.
        telemetry().tool_call(name, call_id, outcome, duration, args, text)


def _plain(value: Any) -> bool:
    """Whether a step's result survives a JSON round trip as it is (kept as `value` in the log, so a
    resumed task's result is the same object)."""
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False
