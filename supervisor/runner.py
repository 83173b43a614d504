"""The supervisor's event loop: one subprocess per agent, kept alive.

Everything that happens arrives as an event on one selector: a child's exit (a pidfd per child, so
a crash is seen the moment it happens, not at the next timer tick), a heartbeat (a datagram on the
notify socket), a command from the CLI (the control socket), a signal (through set_wakeup_fd). The
select timeout is the next deadline (a backoff ending, a heartbeat overdue, a stop timing out), so
an idle supervisor sleeps (while agents are judged on heartbeats, never longer than a quarter of
their heartbeat_timeout, so that a turn far longer than its wait shows the supervisor itself was
stopped), and a turn woken by heartbeats alone, before any deadline, judges nothing
(`policy.beats_only`). What to do on an exit is decided by `exits.on_exit` (over `policy.decide`);
an agent as kept is a `child.Child`. The loop composes `operator.Operator` (the CLI's requests),
`watchdog.Watchdog` (heartbeats, memory, the loop's own gaps) and `leftovers.Leftovers` (adopting a
previous supervisor's agents, sweeping strays).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import psutil

from ..agents.launchenv import AGENT_ENV, SUPERVISOR_ENV, WORKSPACE_ENV
from ..agents.notify import NOTIFY_ENV, parse
from ..kanban.backends import open_board
from ..kanban.liveness import start_time
from ..kanban.task import now_iso
from . import cgroups
from .boardwork import BoardWork
from .child import Child, published_agents
from .cliargs import sane_state
from .config.workspace import Workspace, private_dir
from .control import (
    CONTROL_SOCKET,
    NOTIFY_SOCKET,
    SOCKET_DIR,
    ControlServer,
    bind_private,
    enable_credentials,
    peer_allowed,
    recv_datagram,
)
from .control import request as request  # the CLI's entry point, kept importable from here
from .exits import State, Why, event, on_exit, on_failed_start
from .forking import Forked, ForkServer, become_subreaper, enabled, preloads, reap_orphans
from .governance.alerts import AlertSender, rules_of
from .governance.schedules import Scheduler, schedules_of
from .ingestwarn import IngestWarnings, team_of
from .leftovers import Leftovers
from .operator import Operator
from .policy import beats_only, judge_every
from .procs import MARKER_ENV, marker_value, new_marker
from .sessions import session_table, signal_session
from .spares import Spares
from .spawn import abandon, spawn
from .spec import build_specs
from .statefile import SUPERVISOR_FILE, StateWriter, quiet, read_state, task_write_at
from .steer import agent_groups, held_from
from .supevents import SupervisorEvents, note
from .suptelemetry import SupervisorTelemetry
from .watchdog import Watchdog

STATE_FILE = SUPERVISOR_FILE
# Agents starting at once (the rest queued): an agent's start is mostly Python's imports, on one core.
START_AT_ONCE = max(4, 2 * (os.cpu_count() or 1))
# While agents are judged on their heartbeats the loop turns at least every judge_every(their
# timeout), never more often than this, so that a turn much longer than its wait can only mean the
# supervisor itself was not running (see loop_gap).
LOOP_TICK = 1.0
NOTIFY_BATCH = 256  # datagrams read per wake-up: a flood of them cannot hold the loop
BOARD_LOCK_WAIT = 2.0  # the board thread's wait for the lock before it retries later
# Once `down` began, a restart or reload would start an agent nobody stops: the supervisor would never end.


class Supervisor:
    def __init__(self, ws: Workspace, config: dict[str, Any], *, only: set[str] | None = None,
                 say: Callable[[str], None] = print) -> None:
        self.ws = ws
        self.runs = ws.runs_path
        self.say = quiet(say)
        self.only = only
        self.children: dict[str, Child] = {}
        specs = build_specs(config, ws.root)
        for spec in specs:
            if only is None or spec.name in only:
                self.children[spec.name] = Child(spec)
        # Agents a person stopped: kept stopped (across reload and a new supervisor, through
        # supervisor.json) until started again. Known names cover agents left out by --agents too.
        self.known = {spec.name for spec in specs}
        self.groups = agent_groups(config)
        self.held: set[str] = set()
        # The whole team of hermes.yaml, also when `up --agents` runs a part of it: a task for the rest is
        # no mistake. What ingest warnings judge new tasks by.
        self._team = team_of(specs)
        self._schedules = schedules_of(config)
        self.board = open_board(ws.root, config.get("board"), lock_timeout=BOARD_LOCK_WAIT, host=config.get("host"))
        # A shared board's other hosts see this one alive (its agents never do it), and its agents as
        # the dashboard's panel shows them: read from supervisor.json (written whole), not from this
        # loop's state, since the board's heartbeat thread reads them.
        self.board.announce_host(functools.partial(published_agents, self.runs))
        # What it says, and the operator's commands, are also events of the board's stream (supevents.py).
        self.telemetry = SupervisorTelemetry(config, str(ws.root))  # its events as spans; a reload remakes it
        self.events = SupervisorEvents(self.telemetry.exporting(self.board.append_event), lambda: self.known)
        self._print = self.say  # a line alone: the board's own news, the operator's (recorded from its answer)
        self.tell = self.events.telling(self._print)  # a line and the events it was rendered from
        self.say = self.events.recording(self._print)  # a line, recorded as a note
        self.alerts = AlertSender(self.board, rules_of(config), str(ws.root), self.say)
        self.operator = Operator(self)
        self.selector = selectors.DefaultSelector()
        self.rng = random.Random()
        self.shutting_down = False
        self.signals: list[int] = []
        self.dirty = True
        self.task_write_at: float | None = None  # when a change of tasks alone is written (statefile.py)
        self.started_at = now_iso()
        self.containment = cgroups.detect(ws.root)
        self.state_writer = StateWriter(self.runs / STATE_FILE, self.say)
        # Read once: a snapshot (every state write, every `status`) then needs no descriptor at all,
        # which matters when they have run out.
        self._own_start = start_time(os.getpid())
        self.watchdog = Watchdog(self)
        self._notify_refused = 0
        self.leftovers = Leftovers(self)
        self.fork_wanted = enabled(config, os.environ)  # read at `up` only: a reload says a change waits
        self.forks = ForkServer(self.selector, self.say, preloads=preloads(config)) if self.fork_wanted else None
        self.spares = Spares(self.forks, self.say) if self.forks is not None else None

    def _bind(self) -> None:
        # Whatever the umask, nothing of ours (runs/, and what the agents, who inherit it, write) is
        # writable by another user: through a world-writable runs/ one could move the socket folder
        # aside and put theirs in its place, or rewrite an agent's memory.
        os.umask(os.umask(0) | 0o022)
        private_dir(self.runs)
        # Only the holder of the workspace's supervisor lock gets here, so old socket files are stale.
        # Both sockets live in a 0700 folder of ours: no other user can reach them, whatever the umask.
        sockets = private_dir(self.runs / SOCKET_DIR)
        self.notify_path = sockets / NOTIFY_SOCKET
        self.notify = bind_private(self.notify_path, socket.SOCK_DGRAM)
        enable_credentials(self.notify)
        self.selector.register(self.notify, selectors.EVENT_READ, self._on_notify)
        answer = self.events.commands(self.operator.answer)
        self.control = ControlServer(sockets / CONTROL_SOCKET, self.selector, answer, self.say)
        self.alerts.start()
        self.boardwork = BoardWork(self.board)
        self.selector.register(self.boardwork.wake_fd, selectors.EVENT_READ, self._on_board_messages)
        self.ingest_warnings = IngestWarnings(self.board, self._team)
        self.selector.register(self.ingest_warnings.wake_fd, selectors.EVENT_READ, self._on_ingest_warnings)
        self.scheduler = Scheduler(self.board, self.runs, self._schedules)  # adds due tasks (schedules.py)
        self.selector.register(self.scheduler.wake_fd, selectors.EVENT_READ, lambda: self.scheduler.say(self.say))
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_read = read_end
        signal.set_wakeup_fd(write_end)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda n, _f: self.signals.append(n))
        if self.forks is not None and become_subreaper():  # forked agents, and orphans, become our children
            signal.signal(signal.SIGCHLD, lambda _n, _f: None)  # only to wake the loop (set_wakeup_fd): reap
            signal.siginterrupt(signal.SIGCHLD, False)
        elif self.forks is not None:
            self.say("supervisor: cannot be a child subreaper; agents start by exec")
            self.forks = self.spares = None
        self.selector.register(read_end, selectors.EVENT_READ, self._on_wakeup)

    def start(self, child: Child, told: list[tuple[str, list[dict[str, Any]]]] | None = None) -> None:
        """Spawn the agent; a spawn that fails (no descriptors left, no memory, no command) is a
        failed start of that agent, retried with backoff, never an error of the supervisor. `told`:
        lines and events of its exit, stamped when it happened, told once the new process runs."""
        told = [] if told is None else told
        try:
            self._start_now(child, told)
        except (OSError, psutil.Error, ValueError) as exc:  # ValueError: a NUL in its argv or environment
            abandon(child, self.selector)
            while told:
                self.tell(*told.pop(0))
            err = exc.errno if isinstance(exc, OSError) else None
            error = (f"{exc.strerror or exc}" if isinstance(exc, OSError)
                     else f"{exc} in its command or environment" if isinstance(exc, ValueError) else str(exc))
            decided = on_failed_start(child.spec.name, child.spec.restart, child.history, error, err,
                                      now=time.monotonic(), rng=self.rng)
            child.history, child.last_exit = decided.history, decided.last_exit
            child.state, child.restart_at = decided.state, decided.restart_at
            self.tell(decided.line, list(decided.events))
            self.dirty = True

    def _start_now(self, child: Child, told: list[tuple[str, list[dict[str, Any]]]]) -> None:
        if child.alive():  # never a second process for one agent
            while told:
                self.tell(*told.pop(0))
            self.say(f"{child.spec.name}: still running as pid {child.pid}; not starting another")
            return
        spec = child.spec
        spec.workdir.mkdir(parents=True, exist_ok=True)
        marker = new_marker(self.ws.root, spec.name)
        env = {
            **os.environ, **dict(spec.env),
            AGENT_ENV: json.dumps(spec.agent_config()), WORKSPACE_ENV: str(self.ws.root),
            NOTIFY_ENV: str(self.notify_path), "PYTHONUNBUFFERED": "1", MARKER_ENV: marker_value(marker),
            SUPERVISOR_ENV: str(os.getpid()),
        }
        for name in self.alerts.env_names():
            env.pop(name, None)
        if self.forks is not None and spec.forkable:  # the first of its agents, started later (reload, `start`)
            self.forks.wanted(os.environ)
        def say(line: str) -> None:  # what starting it says comes after what its exit said
            told.append((line, [note(line, self.known, now_iso())])) if told else self.say(line)

        child.proc, child.cgroup = spawn(spec, env, self.containment.base, self.forks, say, self.spares, child.cgroup)
        at = now_iso()  # it runs: what else there is to do and say waited for this (the `started` event's time)
        while told:
            self.tell(*told.pop(0))
        child.marker, child.env_names = marker, frozenset(env)
        child.pidfd = os.pidfd_open(child.proc.pid)
        self.selector.register(child.pidfd, selectors.EVENT_READ, lambda c=child: self._on_exit(c))
        child.pid_started = start_time(child.proc.pid)
        now = time.monotonic()
        child.state, child.started, child.last_beat = "starting", now, now
        child.started_at = at
        child.restart_at = child.stop_deadline = None
        child.stopping_for, child.task = "", None
        self.dirty = True
        line = f"{spec.name}: started (pid {child.pid})"
        how = "fork" if isinstance(child.proc, Forked) else "exec"
        self.tell(line, [event("started", spec.name, line, pid=child.pid, start=how, at=at)])

    def stop(self, child: Child, why: str, *, kill: bool = False, table: dict[int, set[int]] | None = None) -> None:
        """SIGTERM the agent's session (SIGKILL after stop_timeout), or SIGKILL; `table`: session_table()."""
        child.stopping_for = why
        if not child.alive():
            child.restart_at = None
            if child.state in ("queued", "backoff", "starting", "running"):
                child.state = "stopped"
            self.dirty = True
            return
        child.state = "stopping"
        child.stop_deadline = time.monotonic() + child.spec.stop_timeout
        self._signal_group(child, signal.SIGKILL if kill else signal.SIGTERM, table)
        self.dirty = True

    def _signal_group(self, child: Child, signum: int, table: dict[int, set[int]] | None = None) -> None:
        if child.pid is not None:
            signal_session(child.pid, signum, table)

    def _on_exit(self, child: Child) -> None:
        assert child.pidfd is not None
        pid, cgroup = child.pid, child.cgroup
        returncode = child.proc.wait() if child.proc is not None else None
        if isinstance(child.proc, Forked) and child.proc.lost:  # reaped elsewhere: never taken for a clean exit
            self.say(f"{child.spec.name}: its exit status was lost; taken as {returncode}")
        child.adopted = None
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        child.pidfd = None
        now = time.monotonic()
        why = Why(child.stopping_for)
        child.proc, child.task, child.stop_deadline = None, None, None
        self.dirty = True
        decided = on_exit(child.spec.name, child.spec.restart, child.history, why, returncode, now=now,
                          uptime=now - child.started, held=child.spec.name in self.held, rng=self.rng)
        child.history, child.last_exit = decided.history, decided.last_exit
        # Told once the replacement runs (writing them is no part of a restart), stamped now.
        told = [(decided.line, [{**record, "at": now_iso()} for record in decided.events])]
        if decided.state is State.STARTING:
            child.restarts += int(decided.restarted)
            self.start(child, told)
        else:
            self.tell(*told[0])
            child.state, child.restart_at = decided.state, decided.restart_at
        self.leftovers.exited(child, cgroup)
        # A crashed agent's claim goes back to todo at once (one that stopped cleanly released it), on
        # the board thread: the loop never waits for the board lock. Asked once the replacement is
        # started: the thread's scan of the board held the interpreter's lock for most of the
        # restart's milliseconds when it ran beside it.
        self.boardwork.recover()
        # No grandchild outlives its agent (a shell command it started, a delegated child, say).
        self.leftovers.kill_leftovers(pid)

    def _on_notify(self) -> None:
        for _ in range(NOTIFY_BATCH):
            try:
                data, sender, uid = recv_datagram(self.notify)
            except OSError:  # BlockingIOError included: none is waiting
                return
            if uid is None or not peer_allowed(uid, os.geteuid()):
                self._notify_refused += 1
                if self._notify_refused == 1:
                    self.say(f"supervisor: ignored a notify message from uid {uid} (not ours); "
                             f"further ones are not logged")
                continue
            fields = parse(data)
            child = self.children.get(fields.get("NAME", ""))
            # The kernel's word on the sender, not the PID it wrote: a process of the agent's (a
            # shell command it ran) cannot beat for it.
            if child is None or child.pid is None or child.pid != sender or str(sender) != fields.get("PID"):
                continue  # a stale message from a process we no longer run, or not from the agent
            if "HOLD" in fields and child.pidfd is not None:
                self.leftovers.held.take(child.spec.name, child.pid, child.pidfd, fields["HOLD"])
            child.last_beat = time.monotonic()
            if ("READY" in fields or "WATCHDOG" in fields) and child.state == "starting":
                child.state = "running"
                self.dirty = True
            if "TASK" in fields:
                task = None if fields["TASK"] == "-" else fields["TASK"]
                if task != child.task:
                    child.task = task
                    if self.task_write_at is None:
                        self.task_write_at = task_write_at(self.state_writer.written_at, time.monotonic())

    def _on_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_read, 512)
        pending, self.signals = self.signals, []
        if self.forks is not None:  # a child of ours that is no agent's exited: an orphan reparented to us
            reap_orphans({c.proc.pid for c in self.children.values() if c.proc} | {self.forks.pid or 0})
        for signum in pending:
            if signum == signal.SIGHUP:
                answer = self.operator.reload()
                self.tell(answer["message"], [event("reload" if answer["ok"] else "reload_refused", None,
                                                    answer["message"])])
            else:
                self.shutdown(f"{signal.Signals(signum).name}")

    def _on_board_messages(self) -> None:
        for line in self.boardwork.drain():
            self._print(line)  # the board's own news (a claim given back): its event is in the stream already

    def _on_ingest_warnings(self) -> None:
        for line in self.ingest_warnings.drain():
            self.tell(line, [event("warning", None, line)])

    def shutdown(self, why: str) -> None:
        if not self.shutting_down:
            self.say(f"supervisor: stopping the team ({why})")
        self.shutting_down = True
        table = session_table()
        for child in self.children.values():
            if child.state != "stopping" or child.stopping_for != "down":
                self.stop(child, "down", table=table)

    def _deadlines(self, now: float) -> float:
        soonest = now + 60.0
        # While `down` runs, neither the inbox nor a fork server's restart is looked at (`_due`): as
        # deadlines they would be past for good, and the loop would spin until the last agent exits.
        forks = self.forks.deadline() if self.forks is not None and not self.shutting_down else None
        spares = self.spares.deadline(self.children.values()) if self.spares and not self.shutting_down else None
        for when in (self.control.next_deadline(), self.state_writer.retry_at if self.dirty else None,
                     self.task_write_at, self.leftovers.sweep_at, forks, spares):
            if when is not None:
                soonest = min(soonest, when)
        for child in self.children.values():
            if child.restart_at is not None:
                soonest = min(soonest, child.restart_at)
            if child.stop_deadline is not None:
                soonest = min(soonest, child.stop_deadline)
            if child.state in ("starting", "running"):
                soonest = min(soonest, child.last_beat + child.spec.heartbeat_timeout,
                              now + judge_every(child.spec.heartbeat_timeout, least=LOOP_TICK))
                if child.spec.max_rss_mb:
                    soonest = min(soonest, self.watchdog.next_rss)
        return soonest

    def _start_queued(self) -> None:
        """Start queued agents while fewer than START_AT_ONCE are starting: 256 agents started at once
        on 2 cores took minutes to import, and some were killed as never ready before they could be;
        one at a time per ready one, each gets the machine its ready time assumes."""
        if self.shutting_down or (self.forks is not None and self.forks.warming(time.monotonic())):
            return  # while the fork server imports (a second or two), it is faster to wait for it
        starting = sum(1 for child in self.children.values() if child.state == State.STARTING)
        for child in self.children.values():
            if starting >= START_AT_ONCE:
                return
            if child.state == State.QUEUED:
                self.start(child)
                starting += child.state == State.STARTING

    def _due(self, now: float) -> None:
        self.control.expire(now)
        if self.forks is not None and self.spares is not None and not self.shutting_down:
            self.forks.due(now, os.environ)
            self.spares.due(now, self.children, self.containment.base)
        self._start_queued()
        if self.leftovers.sweep_at is not None and now >= self.leftovers.sweep_at:
            self.leftovers.sweep_strays()
        late = [c for c in self.children.values() if now >= (c.stop_deadline or float("inf")) and c.alive()]
        table = session_table() if late else {}  # read once, and used at once: every kill before any telling
        for child in late:
            self._signal_group(child, signal.SIGKILL, table)
            child.stop_deadline = None
        for child in late:
            line = f"{child.spec.name}: did not stop within {child.spec.stop_timeout:g} s; SIGKILL"
            self.tell(line, [event("killed", child.spec.name, line, pid=child.pid)])
        for child in list(self.children.values()):
            if child.restart_at is not None and now >= child.restart_at and not self.shutting_down:
                child.restarts += 1
                self.start(child)
            self.watchdog.heart(child, now)
        self.watchdog.memory(now)

    def snapshot(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "pid_started": self._own_start, "started_at": self.started_at,
            "workspace": str(self.ws.root), "shutting_down": self.shutting_down, "held": sorted(self.held),
            "agents": {name: child.published(time.monotonic(), name in self.held)
                       for name, child in self.children.items()},
        }

    def save(self) -> None:
        """Write the state file; while the disk refuses, the write stays pending and is retried."""
        if self.state_writer.write(self.snapshot(), time.monotonic()):
            self.dirty, self.task_write_at = False, None

    def serve(self) -> int:
        # As sane as the CLI sees it: any process of the user (an agent) may have rewritten it.
        previous = sane_state(read_state(self.runs / STATE_FILE))
        self.held = held_from(previous, self.known)
        self._bind()
        self.say(f"supervisor: {self.containment.detail}")
        adopted = self.leftovers.take_over(previous)
        self.operator.withhold_secrets()
        if self.forks is not None and any(child.spec.forkable for name, child in self.children.items()
                                          if name not in self.held):
            self.forks.wanted(os.environ)
        self.boardwork.recover()
        for name, child in self.children.items():
            if name in self.held:
                line = f"{name}: stopped by hand; not started (`hermes-sup start {name}` starts it)"
                self.tell(line, [event("held", name, line)])
            elif name not in adopted:
                child.state = State.QUEUED  # started in turn (_start_queued): a few at a time, each in its time
        self._start_queued()
        self.save()
        self.watchdog.last_woke = time.monotonic()
        soonest = self._deadlines(time.monotonic())
        while True:
            now = time.monotonic()
            wait = max(0.0, soonest - now)
            ready = self.selector.select(wait)
            woke = time.monotonic()
            # Before anything is judged: a turn far longer than its wait was time the supervisor
            # did not run (and select may then report nothing at all, though heartbeats wait).
            self.watchdog.credit_gap(woke, wait)
            for key, _events in ready:
                key.data()
            if self.task_write_at is not None:  # a task taken or finished in this turn: written on time
                soonest = min(soonest, self.task_write_at)
            if beats_only([key.fd for key, _events in ready], self.notify.fileno(), dirty=self.dirty, now=woke,
                          soonest=soonest):
                continue
            self._due(time.monotonic())
            now = time.monotonic()
            if (self.dirty or (self.task_write_at is not None and now >= self.task_write_at)) \
                    and self.state_writer.due(now):
                self.save()
            # Done once every exit has been handled (its pidfd read and closed), not merely once no
            # agent is alive: an agent reaped by a liveness check still has its exit to record.
            if self.shutting_down and all(child.pidfd is None for child in self.children.values()):
                break
            soonest = self._deadlines(time.monotonic())
        self.save()
        if self.forks is not None and self.spares is not None:
            self.spares.close()
            self.forks.close()
        self.alerts.stop(timeout=BOARD_LOCK_WAIT)
        self.control.close()
        self.notify_path.unlink(missing_ok=True)
        self.leftovers.held.close_all()
        self.selector.unregister(self.boardwork.wake_fd)
        self.selector.unregister(self.ingest_warnings.wake_fd)
        self.scheduler.finish(self.selector, self.say, timeout=BOARD_LOCK_WAIT + 1.0)
        if self.ingest_warnings.stop(timeout=BOARD_LOCK_WAIT + 1.0):
            self._on_ingest_warnings()
            self.ingest_warnings.close()
        if self.boardwork.stop(timeout=BOARD_LOCK_WAIT + 1.0):
            self._on_board_messages()
            self.boardwork.close()
            self.board.close()
        if self.containment.base is not None:
            cgroups.remove(self.containment.base)
        self.say("supervisor: stopped")
        self.telemetry.close()
        return 0
