"""Schedules (hermes.yaml `schedules:`): a cron expression, in UTC, that adds its task once per due time.

The decisions are pure functions over plain data: which due time, if any, between a schedule's last
run and now needs a task (after downtime the latest missed one, once, never one per missed tick),
and the task's id for that due time, `sched-<name>-<YYYYmmddHHMM>`, so that two supervisors (or a
supervisor restarted mid-way) adding it both leave one task: the board refuses an id it holds, under
its lock, and that refusal is taken as "already added". The supervisor's thread (Scheduler) is the
edge: it reads the clock, adds the task, and keeps each schedule's last run in runs/schedules.json.

Cron expressions are parsed by cronsim: five fields, names (MON, JAN), L for the last day, and no
@reboot; a small, maintained parser whose errors say which field is wrong.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cronsim import CronSim, CronSimError

from ...kanban import BoardError, BoardStore
from ...kanban.fsio import read_bytes_nofollow, write_json_atomic
from ...kanban.parse import load_json
from ...kanban.task import TaskError, normalize
from ..loopthread import LoopThread

STATE_FILE = "schedules.json"  # in runs/
# A clock for tests: a file holding epoch seconds, read at every tick instead of the system clock.
CLOCK_ENV = "HERMES_SUP_SCHEDULE_CLOCK"
TICK = 1.0  # seconds between looks at the clock
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,44}")  # sched-<name>-<12 digits> must be a task id (64 chars)
STAMP = "%Y%m%d%H%M"
CRON_FIELDS = 5  # minute hour day-of-month month day-of-week
MAX_STATE_BYTES = 1 << 20


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    task: Mapping[str, Any]


def cron_error(expression: str) -> str | None:
    """What is wrong with a cron expression, said after it ("cron '...' <this>"), or None when it is
    five fields cronsim can run (pure). cronsim also takes a sixth field, seconds: a schedule would
    then fire every second, and due times, which name the tasks, would no longer be whole minutes."""
    count = len(expression.split())
    if count != CRON_FIELDS:
        return (f"has {count} field{'' if count == 1 else 's'}; cron is five, in UTC: minute hour day-of-month "
                "month day-of-week (no seconds, no @names)")
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        return f"is not valid: {exc} (five fields, in UTC: minute hour day-of-month month day-of-week)"
    except (ValueError, TypeError, IndexError) as exc:  # cronsim's own parsing of odd text
        return f"is not valid: {type(exc).__name__}: {exc}"
    return None


def check_schedules(raw: Mapping[str, Any], fail: Callable[[Any, str], Exception]) -> None:
    """`schedules:` of hermes.yaml, after its schema (config/schema.py: a list of mappings with known
    keys): names, cron expressions, and the task, checked as the board checks a dropped one.
    `fail(node, message)` makes the file:line error."""
    seen: set[str] = set()
    for entry in raw.get("schedules") or []:
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise fail(entry, f"schedule name {name!r} must be 1 to 45 lower-case letters, digits or '-', starting "
                              "with a letter or digit (it is part of its tasks' ids)")
        if name in seen:
            raise fail(entry, f"schedule name '{name}' is used twice")
        seen.add(name)
        cron = entry.get("cron")
        if not isinstance(cron, str):
            raise fail(entry, f"schedule {name}: 'cron' must be a cron expression in quotes, like \"0 9 * * 1\"")
        wrong = cron_error(cron)
        if wrong is not None:
            raise fail(entry, f"schedule {name}: cron {cron!r} {wrong}")
        task = entry.get("task")
        if not isinstance(task, dict):
            raise fail(entry, f"schedule {name}: 'task' must be a mapping with at least a title")
        for key in ("id", "status"):
            if key in task:
                raise fail(task, f"schedule {name}: the task's '{key}' is set by the schedule, not here")
        try:
            normalize(_plain(task), default_id=task_id(name, datetime(2000, 1, 1, tzinfo=UTC)),
                      now="2000-01-01T00:00:00Z", by="schedule", note="checked")
        except TaskError as exc:
            raise fail(task, f"schedule {name}: task: {exc}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items() if key != "__line__"}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def schedules_of(config: Mapping[str, Any]) -> list[Schedule]:
    """The schedules of a checked hermes.yaml (pure)."""
    return [Schedule(str(e["name"]), str(e["cron"]), dict(e["task"])) for e in config.get("schedules") or []]


def task_id(name: str, due: datetime) -> str:
    """The one id of a schedule's task for one due time (pure)."""
    return f"sched-{name}-{due.astimezone(UTC).strftime(STAMP)}"


def latest_due(cron: str, now: datetime) -> datetime:
    """The latest due time at or before `now` (pure). Due times fall on whole minutes, so starting a
    reverse walk a second past `now`, cut to the second, includes `now` itself and nothing later."""
    start = now.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
    return next(CronSim(cron, start, reverse=True))


def next_due(cron: str, now: datetime) -> datetime:
    """The first due time after `now` (pure)."""
    return next(CronSim(cron, now.astimezone(UTC)))


def due(cron: str, last: datetime | None, now: datetime) -> datetime | None:
    """The due time between `last` (exclusive) and `now` (inclusive) that needs a task, or None (pure).
    However many due times were missed (the supervisor was down), only the latest needs one: a
    report missed three times is wanted once, now. A schedule never run (`last` None) starts now."""
    if last is None:
        return None
    try:
        latest = latest_due(cron, now)
    except (StopIteration, CronSimError):
        return None
    return latest if latest > last else None


def parse_moment(value: Any) -> datetime | None:
    """A saved moment back as a datetime, or None when it is not one (the file may be hostile)."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def listing(schedules: list[Schedule], state: Mapping[str, Any], now: datetime) -> list[dict[str, Any]]:
    """What `hermes-sup schedules` shows: each schedule's cron, next due time and last run (pure)."""
    rows = []
    for schedule in schedules:
        saved = state.get(schedule.name) if isinstance(state.get(schedule.name), Mapping) else {}
        try:
            upcoming: str | None = iso(next_due(schedule.cron, now))
        except (StopIteration, CronSimError):
            upcoming = None
        last_task = saved.get("task") if isinstance(saved.get("task"), str) else None
        rows.append({"name": schedule.name, "cron": schedule.cron, "title": str(schedule.task.get("title", "")),
                     "next_due": upcoming, "last_due": iso(m) if (m := parse_moment(saved.get("last_due"))) else None,
                     "last_task": last_task})
    return rows


def read_state(path: Path) -> dict[str, Any]:
    """runs/schedules.json, or {} when it is missing or unreadable (each schedule then starts now)."""
    try:
        data = read_bytes_nofollow(path, MAX_STATE_BYTES)
        state = load_json(data.decode("utf-8")) if len(data) <= MAX_STATE_BYTES else {}
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def system_clock() -> datetime:
    """The clock the scheduler reads: the system's, or the epoch seconds in $HERMES_SUP_SCHEDULE_CLOCK's
    file (tests move time on by writing it)."""
    path = os.environ.get(CLOCK_ENV)
    if path:
        with contextlib.suppress(OSError, ValueError):
            return datetime.fromtimestamp(float(Path(path).read_text().strip()), UTC)
    return datetime.now(UTC)


class Scheduler(LoopThread):
    """The supervisor's thread that adds each schedule's due task to the board and says so."""

    name = "schedules"

    def __init__(self, board: BoardStore, runs: Path, schedules: list[Schedule], *,
                 clock: Callable[[], datetime] = system_clock, tick: float = TICK) -> None:
        super().__init__()
        self.board = board
        self.path = runs / STATE_FILE
        self.schedules = schedules  # replaced whole (one assignment) by `reconfigure` after a reload
        self.clock = clock
        self.tick = tick
        self._woken = threading.Event()
        self.start()

    def reconfigure(self, schedules: list[Schedule]) -> None:
        """A reload's schedules, looked at at once (the thread may be asleep for want of any)."""
        self.schedules = schedules
        self._woken.set()

    def _wake_thread(self) -> None:
        self._woken.set()

    def say(self, say: Callable[[str], None]) -> None:
        """Hand what the thread posted to the supervisor's `say` (its wake_fd is readable)."""
        for line in self.drain():
            say(line)

    def finish(self, selector: Any, say: Callable[[str], None], timeout: float) -> None:
        """At the supervisor's end: stop the thread, say its last lines, close its pipe."""
        selector.unregister(self.wake_fd)
        if self.stop(timeout):
            self.say(say)
            self.close()

    def _run(self) -> None:
        said: tuple[str, Any] | None = None
        while True:
            try:
                self.run_once()
                said = None
            except Exception as exc:  # a board or disk failing now is no reason to stop scheduling
                # Said once per kind of trouble, not once a second while it lasts (a temp file's
                # name in the text changes at every try).
                kind = (type(exc).__name__, getattr(exc, "errno", None))
                if kind != said:
                    self._post(f"schedules: could not add the due tasks ({type(exc).__name__}: {exc})")
                said = kind
            # With no schedule there is no clock to look at: it sleeps until a reload or the end.
            self._woken.wait(self.tick if self.schedules else None)
            self._woken.clear()
            if self._stopping.is_set():
                return

    def run_once(self) -> list[str]:
        """Add what is due now; returns the ids added."""
        if not self.schedules:
            return []
        now = self.clock()
        state = read_state(self.path)
        changed, added = False, []
        for schedule in self.schedules:
            saved = state.get(schedule.name) if isinstance(state.get(schedule.name), dict) else {}
            last = parse_moment(saved.get("last_due"))
            if last is None:  # never run (or its record is unreadable): it starts now, nothing is owed
                state[schedule.name] = {"last_due": iso(latest_due(schedule.cron, now)), "task": None}
                changed = True
                continue
            when = due(schedule.cron, last, now)
            if when is None:
                continue
            ident = task_id(schedule.name, when)
            if self._add(schedule, ident, when):
                added.append(ident)
            state[schedule.name] = {"last_due": iso(when), "task": ident}
            changed = True
        if changed:
            write_json_atomic(self.path, {name: entry for name, entry in state.items()
                                          if name in {s.name for s in self.schedules}})
        return added

    def _add(self, schedule: Schedule, ident: str, when: datetime) -> bool:
        """Add the task for one due time; False when it is there already (another supervisor added it)."""
        fields = {**schedule.task, "id": ident}
        meta = fields.get("meta") if isinstance(fields.get("meta"), dict) else {}
        fields["meta"] = {**meta, "schedule": {"name": schedule.name, "due": iso(when)}}
        try:
            self.board.add(fields, by=f"schedule {schedule.name}")
        except TaskError as refused:
            try:
                self.board.get(ident)
            except BoardError:
                raise refused from None
            return False  # its id is taken: added already, by us before a crash or by another host
        self._post(f"schedule {schedule.name}: added {ident} (due {iso(when)})")
        return True
