"""The supervisor's event loop: one subprocess per agent, kept alive.

Everything that happens arrives as an event on one selector: a child's exit (a pidfd per child, so
a crash is seen the moment it happens, not at the next timer tick), a heartbeat (a datagram on the
notify socket), a command from the CLI (the control socket), a signal (through set_wakeup_fd). The
select timeout is the next deadline (a backoff ending, a heartbeat overdue, a stop timing out), so
an idle supervisor sleeps (while agents are judged on heartbeats, never longer than a second, so
that a turn far longer than its wait shows the supervisor itself was stopped). What to do on an
exit is decided by `exits.on_exit` (over `policy.decide`); an agent as kept is a `child.Child`.
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
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from hermes_sup.agents.notify import NOTIFY_ENV, parse
from hermes_sup.agents.telemetry import Telemetry, exporting
from hermes_sup.agents.worker import AGENT_ENV, SUPERVISOR_ENV, WORKSPACE_ENV
from hermes_sup.kanban.backends import open_board
from hermes_sup.kanban.fsio import read_bytes_nofollow
from hermes_sup.kanban.liveness import start_time
from hermes_sup.kanban.task import now_iso

from . import cgroups
from .alerts import AlertSender, exposed, rules_of
from .boardwork import BoardWork
from .child import Child, published_agents
from .cliargs import sane_state
from .control import (
    CONTROL_SOCKET,
    NOTIFY_SOCKET,
    SOCKET_DIR,
    ControlServer,
    bind_private,
    down_timeout,
    enable_credentials,
    peer_allowed,
    recv_datagram,
)
from .control import request as request  # the CLI's entry point, kept importable from here
from .exits import State, Why, event, on_exit
from .ingestwarn import IngestWarnings, team_of
from .policy import cleared, decide_failed_start, loop_gap
from .procs import (
    MARKER_ENV,
    Marker,
    ScanIncomplete,
    environ_names,
    is_agent_process,
    marked,
    marker_value,
    new_marker,
    stop_all,
    strays,
    trees_rss_mb,
)
from .schedules import Scheduler, schedules_of
from .sessions import open_log, process_age, signal_session
from .spec import ChildSpec, build_specs, describe_reload, plan_reload
from .statefile import SUPERVISOR_FILE, StateWriter, quiet, read_state
from .steer import agent_groups, held_from, targets
from .supevents import SupervisorEvents
from .workspace import ConfigError, Workspace, load_config, private_dir

STATE_FILE = SUPERVISOR_FILE
# Agents starting at once (the rest queued): an agent's start is mostly Python's imports, on one core.
START_AT_ONCE = max(4, 2 * (os.cpu_count() or 1))
INGEST_EVERY = 1.0  # seconds between the supervisor's looks at inbox/ while no agent runs
RSS_CHECK_INTERVAL = 5.0
SCAN_RETRY = 2.0  # seconds between sweeps for what exited agents left, while /proc cannot be read whole
# While agents are judged on their heartbeats the loop turns at least this often, so that a turn
# much longer than its wait can only mean the supervisor itself was not running (see loop_gap).
LOOP_TICK = 1.0
GAP_TOLERANCE = 1.0
NOTIFY_BATCH = 256  # datagrams read per wake-up: a flood of them cannot hold the loop
BOARD_LOCK_WAIT = 2.0  # the board thread's wait for the lock before it retries later
# Once `down` began, a restart or reload would start an agent nobody stops: the supervisor would never end.
STOPPING = "the supervisor is stopping the team; nothing is started now"


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
        self.telemetry = Telemetry.from_settings(config.get("telemetry"), os.environ, agent="supervisor",
                                                 workspace=str(ws.root), host=config.get("host"))
        self.events = SupervisorEvents(exporting(self.board.append_event, self.telemetry), lambda: self.known)
        self._print = self.say  # a line alone: the board's own news, the operator's (recorded from its answer)
        self.tell = self.events.telling(self._print)  # a line and the events it was rendered from
        self.say = self.events.recording(self._print)  # a line, recorded as a note
        self.alerts = AlertSender(self.board, rules_of(config), str(ws.root), self.say)
        self.selector = selectors.DefaultSelector()
        self.rng = random.Random()
        self.shutting_down = False
        self.signals: list[int] = []
        self._dirty = True
        self._next_rss = 0.0
        self._next_ingest = 0.0
        self.started_at = now_iso()
        self.containment = cgroups.detect(ws.root)
        self.state_writer = StateWriter(self.runs / STATE_FILE, self.say)
        # Read once: a snapshot (every state write, every `status`) then needs no descriptor at all,
        # which matters when they have run out.
        self._own_start = start_time(os.getpid())
        self._last_woke = time.monotonic()
        self._notify_refused = 0
        self._sweep_at: float | None = None  # when to look again for what exited agents left running
        self._scan_failing = False

    # -- set-up -----------------------------------------------------------------------------------

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
        self.control = ControlServer(sockets / CONTROL_SOCKET, self.selector, self.events.commands(self.command),
                                     self.say)
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
        self.selector.register(read_end, selectors.EVENT_READ, self._on_wakeup)

    # -- processes --------------------------------------------------------------------------------

    def start(self, child: Child) -> None:
        """Spawn the agent; a spawn that fails (no descriptors left, no memory, no command) is a
        failed start of that agent, retried with backoff, never an error of the supervisor."""
        try:
            self._start_now(child)
        except (OSError, psutil.Error) as exc:
            self._abandon_spawn(child)
            err = exc.errno if isinstance(exc, OSError) else None
            error = f"{exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
            decision = decide_failed_start(child.spec.restart, child.history, now=time.monotonic(),
                                           error=error, err=err, rng=self.rng)
            child.history, child.last_exit = decision.history, f"could not start: {error}"
            name = child.spec.name
            if decision.action == "fatal":
                child.state, child.restart_at = State.FATAL, None
                line = f"{name}: FATAL: {decision.reason}"
                self.tell(line, [event("fatal", name, line, reason=decision.reason)])
            else:
                child.state, child.restart_at = State.BACKOFF, time.monotonic() + decision.delay
                line = f"{name}: {decision.reason}"
                self.tell(line, [event("start_failed", name, line, delay=round(decision.delay, 2),
                                       reason=f"could not start: {error}")])
            self._dirty = True

    def _abandon_spawn(self, child: Child) -> None:
        """Undo a spawn that failed half-way: a process started without its pidfd would be
        unsupervised, so it goes."""
        if child.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(child.pidfd)
            os.close(child.pidfd)
            child.pidfd = None
        if child.proc is not None and child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)  # its own session and group, just made
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=5)
        child.proc = None

    def _start_now(self, child: Child) -> None:
        if child.alive():  # never a second process for one agent
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
        child.proc, child.cgroup = self._spawn(spec, env)
        child.marker, child.env_names = marker, frozenset(env)
        child.pidfd = os.pidfd_open(child.proc.pid)
        self.selector.register(child.pidfd, selectors.EVENT_READ, lambda c=child: self._on_exit(c))
        child.pid_started = start_time(child.proc.pid)
        now = time.monotonic()
        child.state, child.started, child.last_beat = "starting", now, now
        child.started_at = now_iso()
        child.restart_at = child.stop_deadline = None
        child.stopping_for, child.task = "", None
        self._dirty = True
        line = f"{spec.name}: started (pid {child.pid})"
        self.tell(line, [event("started", spec.name, line, pid=child.pid)])

    def _spawn(self, spec: ChildSpec, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path | None]:
        """Start the agent's process in a session of its own and, in cgroup mode, in its own cgroup
        from its first instruction on (if joining it fails, in its session only, and say so)."""
        fd, join, where = None, None, None
        if self.containment.base is not None:
            where = cgroups.agent_cgroup(self.containment.base, spec.name)
            try:
                fd, join = cgroups.joiner(where)
            except OSError as exc:
                self.say(f"{spec.name}: cannot use its cgroup ({exc.strerror}); process group only")
                where = None
        try:
            # The agent writes to its own log file, never to a pipe we must drain.
            log = open_log(spec.workdir / "agent.log", self.say)
            try:
                return subprocess.Popen(
                    spec.argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, preexec_fn=join,
                ), where
            finally:
                os.close(log)
        except subprocess.SubprocessError as exc:  # the preexec function failed: nothing was started
            if join is None:
                raise
            self.say(f"{spec.name}: cannot join its cgroup ({exc}); process group only")
        finally:
            if fd is not None:
                os.close(fd)
        log = open_log(spec.workdir / "agent.log", self.say)
        try:
            return subprocess.Popen(spec.argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True), None
        finally:
            os.close(log)

    def _kill_leftovers(self, child: Child, pid: int | None) -> None:
        """No process an agent started outlives it: what is left in its cgroup, in its session's
        process groups, or carries its marker (having left both, with setsid in process-group mode)."""
        if child.cgroup is not None:
            cgroups.kill(child.cgroup)
        if pid is not None:
            signal_session(pid, signal.SIGKILL)
        self._sweep_strays()

    def _sweep_strays(self) -> None:
        """SIGKILL every process of this workspace's agents that no supervised agent owns any more (its
        marker's instance has exited). When /proc cannot be read whole (no descriptors left) this is
        retried on a timer: the supervision goes on meanwhile, and the leftovers go once it can."""
        keep = {c.marker.nonce for c in self.children.values() if c.pidfd is not None and c.marker is not None}
        try:
            stop_all(strays(marked(self.ws.root), keep), 0)
        except ScanIncomplete as exc:
            self._sweep_at = time.monotonic() + SCAN_RETRY
            self._proc_trouble(exc)
            return
        self._sweep_at = None
        self._proc_trouble(None)

    def _proc_trouble(self, exc: OSError | None) -> None:
        """Say once when reading /proc starts failing (a failed scan each turn must not flood the
        log), and once when it works again."""
        if exc is not None and not self._scan_failing:
            self._scan_failing = True
            self.say(f"supervisor: cannot read /proc ({exc.strerror or exc}); the agents are still supervised, "
                     f"and what exited agents left running is stopped once it can be read (retrying every "
                     f"{SCAN_RETRY:g} s)")
        elif exc is None and self._scan_failing:
            self._scan_failing = False
            self.say("supervisor: reading /proc works again")

    def stop(self, child: Child, why: str, *, kill: bool = False) -> None:
        """SIGTERM the agent's process group (SIGKILL after stop_timeout), or SIGKILL at once."""
        child.stopping_for = why
        if not child.alive():
            child.restart_at = None
            if child.state in ("queued", "backoff", "starting", "running"):
                child.state = "stopped"
            self._dirty = True
            return
        child.state = "stopping"
        child.stop_deadline = time.monotonic() + child.spec.stop_timeout
        self._signal_group(child, signal.SIGKILL if kill else signal.SIGTERM)
        self._dirty = True

    def _signal_group(self, child: Child, signum: int) -> None:
        if child.pid is not None:
            signal_session(child.pid, signum)

    def adopt(self, child: Child, info: dict[str, Any], marker: Marker, pidfd: int) -> None:
        """Take over an agent a previous supervisor started and that is still running: no restart,
        only a pidfd to see it exit (it is not our child, so its exit status is not ours to read)."""
        pid = info["pid"]
        child.pidfd = pidfd
        child.adopted, child.pid_started, child.marker = pid, info.get("pid_started"), marker
        child.env_names = environ_names(pid)
        where = cgroups.cgroup_of(pid)
        if where is not None and where.name == cgroups.agent_name(child.spec.name) \
                and where.parent.name == cgroups.base_name(self.ws.root):
            child.cgroup = where
        self.selector.register(child.pidfd, selectors.EVENT_READ, lambda c=child: self._on_exit(c))
        now = time.monotonic()
        child.state, child.last_beat = "running", now
        child.started = now - process_age(pid)
        child.started_at = info.get("started_at") or now_iso()
        child.restarts = int(info.get("restarts") or 0)
        child.task = info.get("task")
        self._dirty = True
        line = f"{child.spec.name}: adopted the running agent (pid {pid})"
        self.tell(line, [event("adopted", child.spec.name, line, pid=pid)])

    def _take_over(self, previous: dict[str, Any]) -> set[str]:
        """Adopt the agents of a previous supervisor that are still alive: the same process (pid and
        start time) and one of this agent (its marker); then stop every other process any agent of this
        workspace left (not wanted any more, changed, or never saved). Returns the names adopted."""
        adopted = set()
        agents = previous.get("agents")
        for name, info in (agents if isinstance(agents, dict) else {}).items():
            child = self.children.get(name)
            if child is None or not isinstance(info, dict) or child.spec.digest != info.get("digest") \
                    or name in self.held:  # a held agent still running is a stray, stopped below
                continue
            pid, started = info.get("pid"), info.get("pid_started")
            if not isinstance(pid, int) or pid <= 0 or not isinstance(started, (int, float)):
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            # Checked once the pidfd is open: it cannot name a newer process that reused the pid.
            marker = is_agent_process(pid, started, self.ws.root, name)
            if marker is None:
                os.close(pidfd)
                continue
            self.adopt(child, info, marker, pidfd)
            adopted.add(name)
        keep = {child.marker.nonce for name, child in self.children.items() if name in adopted and child.marker}
        left = strays(marked(self.ws.root), keep)
        if left:
            self.say(f"supervisor: stopping {len(left)} process(es) a previous supervisor left running and "
                     f"nobody runs now: {', '.join(f'{p.marker.agent} (pid {p.pid})' for p in left)}")
            stop_all(left, max((c.spec.stop_timeout for c in self.children.values()), default=10.0))
        # What dropped its marker too, in the agents' cgroups (wherever the previous supervisor made them).
        kept = {child.cgroup for child in self.children.values() if child.cgroup is not None}
        for folder in cgroups.workspace_cgroups(self.ws.root) - kept:
            cgroups.kill(folder)
        return adopted

    def _withhold_secrets(self) -> None:
        """Restart each agent whose environment holds a webhook's URL or secret variable, named so only
        after it started (by a reload, or in the hermes.yaml of this supervisor for an agent a previous
        one started): nothing takes a variable back from a running process and what it started."""
        running = {name: child.env_names for name, child in self.children.items()
                   if child.alive() and child.state != "stopping"}
        for name in exposed(running, self.alerts.env_names()):
            self.say(f"{name}: restarting, its environment holds a webhook's variable that agents are not given")
            self.stop(self.children[name], "reload")

    def _on_exit(self, child: Child) -> None:
        assert child.pidfd is not None
        pid = child.pid
        returncode = child.proc.wait() if child.proc is not None else None
        child.adopted = None
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        child.pidfd = None
        # No grandchild outlives its agent (a shell command it started, a delegated child, say).
        self._kill_leftovers(child, pid)
        now = time.monotonic()
        why = Why(child.stopping_for)
        child.proc, child.task, child.stop_deadline = None, None, None
        # A crashed agent's claim goes back to todo at once; one that stopped cleanly released it.
        # On the board thread: the loop never waits for the board lock.
        self.boardwork.recover()
        self._dirty = True
        decided = on_exit(child.spec.name, child.spec.restart, child.history, why, returncode, now=now,
                          uptime=now - child.started, held=child.spec.name in self.held, rng=self.rng)
        child.history, child.last_exit = decided.history, decided.last_exit
        self.tell(decided.line, decided.events)
        if decided.state is State.STARTING:
            child.restarts += int(decided.restarted)
            self.start(child)
            return
        child.state, child.restart_at = decided.state, decided.restart_at

    # -- events -----------------------------------------------------------------------------------

    def _on_notify(self) -> None:
        for _ in range(NOTIFY_BATCH):
            try:
                data, sender, uid = recv_datagram(self.notify)
            except BlockingIOError:
                return
            except OSError:
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
            child.last_beat = time.monotonic()
            if ("READY" in fields or "WATCHDOG" in fields) and child.state == "starting":
                child.state = "running"
                self._dirty = True
            if "TASK" in fields:
                task = None if fields["TASK"] == "-" else fields["TASK"]
                if task != child.task:
                    child.task, self._dirty = task, True

    def _on_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_read, 512)
        pending, self.signals = self.signals, []
        for signum in pending:
            if signum == signal.SIGHUP:
                answer = self.reload()
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

    def command(self, request: dict[str, Any]) -> dict[str, Any]:
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "state": self.snapshot()}
        if cmd == "restart":
            name = request.get("agent")
            child = self.children.get(name) if isinstance(name, str) else None
            if child is None:
                return {"ok": False, "message": f"no agent named {name!r}; agents: {', '.join(self.children)}"}
            if self.shutting_down:
                return {"ok": False, "message": STOPPING}
            if name in self.held:
                return {"ok": False, "message": f"{name} was stopped by hand and stays stopped until "
                                                f"`hermes-sup start {name}`"}
            child.history = cleared(child.history)  # a manual restart is not a crash
            if child.alive():
                self.stop(child, "restart")
            else:
                child.restarts += 1
                self.start(child)
            return {"ok": True, "message": f"{name}: restarting"}
        if cmd in ("stop", "start"):
            return self.steer(cmd, request.get("agent"))
        if cmd == "reload":
            return self.reload()
        if cmd == "down":
            timeout = down_timeout(request.get("timeout"))  # ValueError: a bad request, refused
            if timeout is not None:
                for child in self.children.values():
                    child.spec = _with_stop_timeout(child.spec, timeout)
            self.shutdown("hermes-sup down")
            return {"ok": True, "message": "stopping"}
        return {"ok": False, "message": f"unknown command {cmd!r}"}

    def steer(self, cmd: str, name: object) -> dict[str, Any]:
        """`stop`: stop the agents `name` means and keep them stopped until `start`, which starts
        them again; neither is counted as a restart."""
        chosen = targets(name, [n for n in self.children if n in self.known], self.groups)
        if chosen is None:
            return {"ok": False, "message": f"no agent named {name!r}; agents: {', '.join(self.children)}"}
        if self.shutting_down:
            return {"ok": False, "message": STOPPING}
        said = []
        for agent in chosen:
            child = self.children[agent]
            if cmd == "stop":
                said.append(self._hold(child))
            else:
                said.append(self._release(child))
        self._dirty = True
        return {"ok": True, "message": "; ".join(said), "agents": chosen}

    def _hold(self, child: Child) -> str:
        name = child.spec.name
        self.held.add(name)
        if child.state == "stopping":
            # Already on its way out (a restart, a hang): it stays out once gone, on the same deadline.
            child.stopping_for = "stop"
        elif child.alive():
            self.stop(child, "stop")
        else:
            child.state, child.restart_at, child.stopping_for = "stopped", None, ""
            return f"{name}: stopped (not running); stays stopped until `hermes-sup start {name}`"
        self._print(f"{name}: stopping by hand; stays stopped until `hermes-sup start {name}`")  # event: its answer
        return f"{name}: stopping; stays stopped until `hermes-sup start {name}`"

    def _release(self, child: Child) -> str:
        name = child.spec.name
        was_held = name in self.held
        self.held.discard(name)
        if child.state == "stopping":
            # Its exit starts it again: a stop by hand now sees it is no longer held (see _on_exit).
            return f"{name}: starting once its old process has stopped"
        if child.alive():
            return f"{name}: already {child.state}"
        child.history = cleared(child.history)  # a start by hand begins a fresh run, as from fatal
        self._print(f"{name}: started by hand" + ("" if was_held else f" (it was {child.state})"))  # the same
        self.start(child)
        return f"{name}: starting"

    def reload(self) -> dict[str, Any]:
        """Apply hermes.yaml anew. Whatever reading or checking it raises (not only ConfigError: a
        file nested deep enough to exhaust the parser's recursion, say) refuses the reload and
        leaves the team as it was; it never ends the supervisor."""
        if self.shutting_down:
            return {"ok": False, "message": STOPPING}
        try:
            config = load_config(self.ws.config_path)
            everyone = build_specs(config, self.ws.root)
            wanted = [s for s in everyone if self.only is None or s.name in self.only]
            plan = plan_reload({name: child.spec for name, child in self.children.items()}, wanted)
        except ConfigError as exc:
            return {"ok": False, "message": f"reload refused, the team is unchanged: {exc}"}
        except Exception as exc:  # see the docstring
            return {"ok": False, "message": f"reload refused, the team is unchanged: {self.ws.config_path}: "
                                            f"could not be read: {type(exc).__name__}: {exc}"}
        by_name = {spec.name: spec for spec in wanted}
        for name in plan.stop:
            self.stop(self.children[name], "remove")
            self.held.discard(name)
        for name in plan.restart:
            child = self.children[name]
            child.spec = by_name[name]
            if name in self.held:
                continue  # stopped by hand: the new settings apply when it is started
            self.stop(child, "reload") if child.alive() else self.start(child)
        for name in plan.start:
            self.children[name] = Child(by_name[name])
            self.start(self.children[name])
        self.known = {spec.name for spec in build_specs(config, self.ws.root)}
        self.groups = agent_groups(config)
        self.held &= self.known
        self._dirty = True
        self.ingest_warnings.team = team_of(everyone)
        self.scheduler.schedules = schedules_of(config)
        self.alerts.reconfigure(rules_of(config))
        self._withhold_secrets()
        return {"ok": True, "message": describe_reload(plan),
                "plan": {"start": plan.start, "stop": plan.stop, "restart": plan.restart, "keep": plan.keep}}

    def shutdown(self, why: str) -> None:
        if not self.shutting_down:
            self.say(f"supervisor: stopping the team ({why})")
        self.shutting_down = True
        for child in self.children.values():
            if child.state != "stopping" or child.stopping_for != "down":
                self.stop(child, "down")

    # -- timers -----------------------------------------------------------------------------------

    def _deadlines(self, now: float) -> float:
        soonest = now + 60.0
        for when in (self.control.next_deadline(), self.state_writer.retry_at if self._dirty else None,
                     self._sweep_at):
            if when is not None:
                soonest = min(soonest, when)
        if not any(child.state == State.RUNNING for child in self.children.values()):
            soonest = min(soonest, self._next_ingest)
        for child in self.children.values():
            if child.restart_at is not None:
                soonest = min(soonest, child.restart_at)
            if child.stop_deadline is not None:
                soonest = min(soonest, child.stop_deadline)
            if child.state in ("starting", "running"):
                soonest = min(soonest, child.last_beat + child.spec.heartbeat_timeout, now + LOOP_TICK)
                if child.spec.max_rss_mb:
                    soonest = min(soonest, self._next_rss)
        return soonest

    def _credit_gap(self, woke: float, expected: float) -> None:
        """After a turn of the loop that took much longer than its wait, the supervisor was not
        running (SIGSTOP, a suspended VM): the agents' heartbeats are judged on the time it ran."""
        gap = loop_gap(elapsed=woke - self._last_woke, expected=expected, tolerance=GAP_TOLERANCE)
        self._last_woke = woke
        if not gap:
            return
        self.say(f"supervisor: did not run for {gap:.1f} s (stopped or starved); that time is not counted "
                 f"against the agents' heartbeats")
        for child in self.children.values():
            if child.state in ("starting", "running"):
                child.last_beat += gap

    def _start_queued(self) -> None:
        """Start queued agents while fewer than START_AT_ONCE are starting: 256 agents started at once
        on 2 cores took minutes to import, and some were killed as never ready before they could be;
        one at a time per ready one, each gets the machine its ready time assumes."""
        if self.shutting_down:
            return
        starting = sum(1 for child in self.children.values() if child.state == State.STARTING)
        for child in self.children.values():
            if starting >= START_AT_ONCE:
                return
            if child.state == State.QUEUED:
                self.start(child)
                starting += child.state == State.STARTING

    def _due(self, now: float) -> None:
        self.control.expire(now)
        self._start_queued()
        if now >= self._next_ingest and not self.shutting_down:
            self._next_ingest = now + INGEST_EVERY
            if not any(child.state == State.RUNNING for child in self.children.values()):
                self.boardwork.ingest()  # no agent waits for work to ingest the drops: the supervisor does
        if self._sweep_at is not None and now >= self._sweep_at:
            self._sweep_strays()
        for child in list(self.children.values()):
            if child.restart_at is not None and now >= child.restart_at and not self.shutting_down:
                child.restarts += 1
                self.start(child)
            if child.stop_deadline is not None and now >= child.stop_deadline and child.alive():
                line = f"{child.spec.name}: did not stop within {child.spec.stop_timeout:g} s; SIGKILL"
                self.tell(line, [event("killed", child.spec.name, line, pid=child.pid)])
                self._signal_group(child, signal.SIGKILL)
                child.stop_deadline = None
            if child.state in ("starting", "running") and now - child.last_beat > child.spec.heartbeat_timeout:
                if self._beat_written(child, now):
                    continue  # its heartbeats were dropped (a full notify queue), not missed
                what = "never reported ready" if child.state == "starting" else "stopped heart-beating"
                line = f"{child.spec.name}: {what} for {child.spec.heartbeat_timeout:g} s; killing it"
                self.tell(line, [event("hung", child.spec.name, line, pid=child.pid)])
                self.stop(child, "hang", kill=True)
        if now >= self._next_rss:
            self._next_rss = now + RSS_CHECK_INTERVAL
            limited = [child for child in self.children.values()
                       if child.spec.max_rss_mb and child.state in ("starting", "running") and child.pid]
            try:
                memory = trees_rss_mb(child.pid for child in limited) if limited else {}
            except OSError as exc:  # no descriptors to read it: looked at again next interval
                self._proc_trouble(exc)
                limited = []
            for child in limited:
                limit, rss = child.spec.max_rss_mb, memory.get(child.pid or 0, 0.0)
                if rss > limit:
                    line = f"{child.spec.name}: uses {rss:.0f} MB, over max_rss_mb {limit:g}; restarting it"
                    self.tell(line, [event("over_memory", child.spec.name, line, pid=child.pid)])
                    self.stop(child, "memory")

    # -- state ------------------------------------------------------------------------------------

    def _beat_written(self, child: Child, now: float) -> bool:
        """Whether the agent's own state file says it beat within heartbeat_timeout: its heartbeat
        thread writes it at every beat, as it sends the datagram. A notify queue of 10 (Linux's
        default net.unix.max_dgram_qlen) overflows while a supervisor of 256 agents is busy, and a
        dropped heartbeat is not a hung agent: 390 live agents of a 256-agent team were killed so.
        Credits the beat (and a starting agent is then running: it is up)."""
        path = child.spec.workdir / "state.json"
        try:
            written = os.stat(path, follow_symlinks=False)
            data = json.loads(read_bytes_nofollow(path, limit=64 * 1024) or b"{}")
        except (OSError, ValueError):
            return False
        age = time.time() - written.st_mtime
        if not isinstance(data, dict) or data.get("pid") != child.pid or not 0 <= age < child.spec.heartbeat_timeout:
            return False
        child.last_beat = now - age
        if child.state == State.STARTING:
            child.state, self._dirty = State.RUNNING, True
        return True

    def snapshot(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "pid_started": self._own_start, "started_at": self.started_at,
            "workspace": str(self.ws.root), "shutting_down": self.shutting_down, "held": sorted(self.held),
            "agents": {name: {
                "pid": child.pid, "pid_started": child.pid_started, "state": child.state,
                "restarts": child.restarts, "started_at": child.started_at if child.pid else None,
                "uptime_s": round(time.monotonic() - child.started, 1) if child.pid else None,
                "task": child.task, "last_exit": child.last_exit or None,
                "log": str(child.spec.workdir / "agent.log"), "digest": child.spec.digest,
                "held": name in self.held,
            } for name, child in self.children.items()},
        }

    def save(self) -> None:
        """Write the state file; while the disk refuses, the write stays pending and is retried."""
        if self.state_writer.write(self.snapshot(), time.monotonic()):
            self._dirty = False

    def serve(self) -> int:
        # As sane as the CLI sees it: any process of the user (an agent) may have rewritten it.
        previous = sane_state(read_state(self.runs / STATE_FILE))
        self.held = held_from(previous, self.known)
        self._bind()
        self.say(f"supervisor: {self.containment.detail}")
        adopted = self._take_over(previous)
        self._withhold_secrets()
        self.boardwork.recover()
        for name, child in self.children.items():
            if name in self.held:
                line = f"{name}: stopped by hand; not started (`hermes-sup start {name}` starts it)"
                self.tell(line, [event("held", name, line)])
            elif name not in adopted:
                child.state = State.QUEUED  # started in turn (_start_queued): a few at a time, each in its time
        self._start_queued()
        self.save()
        self._last_woke = time.monotonic()
        while True:
            now = time.monotonic()
            wait = max(0.0, self._deadlines(now) - now)
            ready = self.selector.select(wait)
            # Before anything is judged: a turn far longer than its wait was time the supervisor
            # did not run (and select may then report nothing at all, though heartbeats wait).
            self._credit_gap(time.monotonic(), wait)
            for key, _events in ready:
                key.data()
            self._due(time.monotonic())
            if self._dirty and self.state_writer.due(time.monotonic()):
                self.save()
            # Done once every exit has been handled (its pidfd read and closed), not merely once no
            # agent is alive: an agent reaped by a liveness check still has its exit to record.
            if self.shutting_down and all(child.pidfd is None for child in self.children.values()):
                break
        self.save()
        self.alerts.stop(timeout=BOARD_LOCK_WAIT)
        self.control.close()
        self.notify_path.unlink(missing_ok=True)
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


def _with_stop_timeout(spec: ChildSpec, seconds: float) -> ChildSpec:
    from dataclasses import replace

    return replace(spec, stop_timeout=seconds)

