"""The supervisor's event loop: one subprocess per agent, kept alive.

Everything that happens arrives as an event on one selector: a child's exit (a pidfd per child, so
a crash is seen the moment it happens, not at the next timer tick), a heartbeat (a datagram on the
notify socket), a command from the CLI (the control socket), a signal (through set_wakeup_fd). The
select timeout is the next deadline (a backoff ending, a heartbeat overdue, a stop timing out), so
an idle supervisor sleeps. What to do on an exit is decided by `policy.decide`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from hermes_sup.agents.notify import NOTIFY_ENV, parse
from hermes_sup.agents.worker import AGENT_ENV, WORKSPACE_ENV
from hermes_sup.kanban import Board
from hermes_sup.kanban.fsio import write_json_atomic
from hermes_sup.kanban.liveness import holder_alive, start_time
from hermes_sup.kanban.task import now_iso

from . import cgroups
from .policy import RestartHistory, cleared, decide, describe_exit
from .procs import MARKER_ENV, Marker, is_agent_process, marked, marker_value, new_marker, stop_all, strays
from .spec import ChildSpec, build_specs, describe_reload, plan_reload
from .workspace import ConfigError, Workspace, load_config, private_dir

STATE_FILE = "supervisor.json"
NOTIFY_SOCKET = "notify.sock"
CONTROL_SOCKET = "control.sock"
RSS_CHECK_INTERVAL = 5.0
# Once `down` began, a restart or reload would start an agent nobody stops: the supervisor would never end.
STOPPING = "the supervisor is stopping the team; nothing is started now"


@dataclass
class Child:
    spec: ChildSpec
    state: str = "stopped"  # starting, running, backoff, fatal, stopping, stopped
    proc: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    pid_started: float | None = None
    started: float = 0.0
    started_at: str = ""
    last_beat: float = 0.0
    restarts: int = 0
    history: RestartHistory = field(default_factory=RestartHistory)
    restart_at: float | None = None
    stop_deadline: float | None = None
    stopping_for: str = ""
    last_exit: str = ""
    task: str | None = None
    adopted: int | None = None  # pid of an agent a previous supervisor started (not our child)
    marker: Marker | None = None  # what its processes carry in their environment (procs.py)
    cgroup: Path | None = None  # its own cgroup, in cgroup mode

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else self.adopted

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.adopted is not None and holder_alive(self.adopted, self.pid_started, None) is True


class Supervisor:
    def __init__(self, ws: Workspace, config: dict[str, Any], *, only: set[str] | None = None,
                 say: Callable[[str], None] = print) -> None:
        self.ws = ws
        self.runs = ws.runs_path
        self.say = say
        self.only = only
        self.children: dict[str, Child] = {}
        for spec in build_specs(config, ws.root):
            if only is None or spec.name in only:
                self.children[spec.name] = Child(spec)
        self.board = Board(ws.board_path)
        self.selector = selectors.DefaultSelector()
        self.rng = random.Random()
        self.shutting_down = False
        self.signals: list[int] = []
        self._dirty = True
        self._next_rss = 0.0
        self.started_at = now_iso()
        self.containment = cgroups.detect(ws.root)

    # -- set-up -----------------------------------------------------------------------------------

    def _bind(self) -> None:
        private_dir(self.runs)  # the sockets below: only the user may send to or command the team
        # Only the holder of the workspace's supervisor lock gets here, so old socket files are stale.
        self.notify_path = self.runs / NOTIFY_SOCKET
        self.notify_path.unlink(missing_ok=True)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.notify.bind(str(self.notify_path))
        self.notify.setblocking(False)
        self.selector.register(self.notify, selectors.EVENT_READ, self._on_notify)
        control_path = self.runs / CONTROL_SOCKET
        control_path.unlink(missing_ok=True)
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.control.bind(str(control_path))
        self.control.listen(8)
        self.control.setblocking(False)
        self.selector.register(self.control, selectors.EVENT_READ, self._on_control)
        read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_read = read_end
        signal.set_wakeup_fd(write_end)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda n, _f: self.signals.append(n))
        self.selector.register(read_end, selectors.EVENT_READ, self._on_wakeup)

    # -- processes --------------------------------------------------------------------------------

    def start(self, child: Child) -> None:
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
        }
        child.proc, child.cgroup = self._spawn(spec, env)
        child.marker = marker
        child.pidfd = os.pidfd_open(child.proc.pid)
        self.selector.register(child.pidfd, selectors.EVENT_READ, lambda c=child: self._on_exit(c))
        child.pid_started = start_time(child.proc.pid)
        now = time.monotonic()
        child.state, child.started, child.last_beat = "starting", now, now
        child.started_at = now_iso()
        child.restart_at = child.stop_deadline = None
        child.stopping_for, child.task = "", None
        self._dirty = True
        self.say(f"{spec.name}: started (pid {child.pid})")

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
            with open(spec.workdir / "agent.log", "ab") as log:
                return subprocess.Popen(
                    spec.argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, preexec_fn=join,
                ), where
        except subprocess.SubprocessError as exc:  # the preexec function failed: nothing was started
            if join is None:
                raise
            self.say(f"{spec.name}: cannot join its cgroup ({exc}); process group only")
        finally:
            if fd is not None:
                os.close(fd)
        with open(spec.workdir / "agent.log", "ab") as log:
            return subprocess.Popen(spec.argv, cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True), None

    def _kill_leftovers(self, child: Child, pid: int | None) -> None:
        """No process an agent started outlives it: what is left in its cgroup, in its session's
        process groups, or carries its marker (having left both, with setsid in process-group mode)."""
        if child.cgroup is not None:
            cgroups.kill(child.cgroup)
        if pid is not None:
            signal_session(pid, signal.SIGKILL)
        if child.marker is not None:
            nonce = child.marker.nonce
            stop_all([p for p in marked(self.ws.root) if p.marker.nonce == nonce], 0)

    def stop(self, child: Child, why: str, *, kill: bool = False) -> None:
        """SIGTERM the agent's process group (SIGKILL after stop_timeout), or SIGKILL at once."""
        child.stopping_for = why
        if not child.alive():
            child.restart_at = None
            if child.state in ("backoff", "starting", "running"):
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
        where = cgroups.cgroup_of(pid)
        if where is not None and where.name == cgroups.agent_name(child.spec.name) \
                and where.parent.name == cgroups.base_name(self.ws.root):
            child.cgroup = where
        self.selector.register(child.pidfd, selectors.EVENT_READ, lambda c=child: self._on_exit(c))
        now = time.monotonic()
        child.state, child.last_beat = "running", now
        child.started = now - _age(pid)
        child.started_at = info.get("started_at") or now_iso()
        child.restarts = int(info.get("restarts") or 0)
        child.task = info.get("task")
        self._dirty = True
        self.say(f"{child.spec.name}: adopted the running agent (pid {pid})")

    def _take_over(self, previous: dict[str, Any]) -> set[str]:
        """Adopt the agents of a previous supervisor that are still alive: the same process (pid and
        start time) and one of this agent (its marker); then stop every other process any agent of this
        workspace left (not wanted any more, changed, or never saved). Returns the names adopted."""
        adopted = set()
        agents = previous.get("agents")
        for name, info in (agents if isinstance(agents, dict) else {}).items():
            child = self.children.get(name)
            if child is None or not isinstance(info, dict) or child.spec.digest != info.get("digest"):
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
        uptime = now - child.started
        why = child.stopping_for
        child.last_exit = describe_exit(returncode) + (f" ({why})" if why else "")
        child.proc, child.task, child.stop_deadline = None, None, None
        # A crashed agent's claim goes back to todo at once; one that stopped cleanly released it.
        for recovered in self.board.recover():
            self.say(f"board: {recovered['task']} back to {recovered['to']} ({recovered['reason']})")
        self._dirty = True
        if why in ("down", "remove"):
            child.state = "stopped"
            self.say(f"{child.spec.name}: stopped, {child.last_exit}")
            return
        if why in ("restart", "reload"):
            child.restarts += 1
            self.say(f"{child.spec.name}: {child.last_exit}; restarting")
            self.start(child)
            return
        decision = decide(child.spec.restart, child.history, now=now,
                          returncode=returncode if not why else -signal.SIGKILL, uptime=uptime, rng=self.rng)
        child.history = decision.history
        if decision.action == "fatal":
            child.state = "fatal"
            self.say(f"{child.spec.name}: FATAL: {decision.reason}")
        elif decision.action == "stop":
            child.state = "stopped"
            self.say(f"{child.spec.name}: {decision.reason}")
        elif decision.delay <= 0:
            child.restarts += 1
            self.say(f"{child.spec.name}: {decision.reason}")
            self.start(child)
        else:
            child.state, child.restart_at = "backoff", now + decision.delay
            self.say(f"{child.spec.name}: {decision.reason}")

    # -- events -----------------------------------------------------------------------------------

    def _on_notify(self) -> None:
        while True:
            try:
                data = self.notify.recv(4096)
            except BlockingIOError:
                return
            fields = parse(data)
            child = self.children.get(fields.get("NAME", ""))
            if child is None or str(child.pid) != fields.get("PID"):
                continue  # a stale message from a process we no longer run
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
                self.say(self.reload()["message"])
            else:
                self.shutdown(f"{signal.Signals(signum).name}")

    def _on_control(self) -> None:
        try:
            conn, _ = self.control.accept()
        except BlockingIOError:
            return
        with conn:
            conn.settimeout(2.0)
            try:
                request = json.loads(conn.makefile("rb").readline() or b"{}")
                reply = self.command(request)
            except (OSError, ValueError) as exc:
                reply = {"ok": False, "message": f"bad request: {exc}"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")

    def command(self, request: dict[str, Any]) -> dict[str, Any]:
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "state": self.snapshot()}
        if cmd == "restart":
            name = request.get("agent")
            child = self.children.get(name or "")
            if child is None:
                return {"ok": False, "message": f"no agent named {name!r}; agents: {', '.join(self.children)}"}
            if self.shutting_down:
                return {"ok": False, "message": STOPPING}
            child.history = cleared(child.history)  # a manual restart is not a crash
            if child.alive():
                self.stop(child, "restart")
            else:
                child.restarts += 1
                self.start(child)
            return {"ok": True, "message": f"{name}: restarting"}
        if cmd == "reload":
            return self.reload()
        if cmd == "down":
            if isinstance(request.get("timeout"), (int, float)):
                for child in self.children.values():
                    child.spec = _with_stop_timeout(child.spec, float(request["timeout"]))
            self.shutdown("hermes-sup down")
            return {"ok": True, "message": "stopping"}
        return {"ok": False, "message": f"unknown command {cmd!r}"}

    def reload(self) -> dict[str, Any]:
        if self.shutting_down:
            return {"ok": False, "message": STOPPING}
        try:
            config = load_config(self.ws.config_path)
            wanted = [s for s in build_specs(config, self.ws.root) if self.only is None or s.name in self.only]
        except ConfigError as exc:
            return {"ok": False, "message": f"reload refused, the team is unchanged: {exc}"}
        except Exception as exc:  # a config the checks missed must not end the team it was meant to change
            return {"ok": False, "message": f"reload refused, the team is unchanged: {type(exc).__name__}: {exc}"}
        plan = plan_reload({name: child.spec for name, child in self.children.items()}, wanted)
        by_name = {spec.name: spec for spec in wanted}
        for name in plan.stop:
            self.stop(self.children[name], "remove")
        for name in plan.restart:
            child = self.children[name]
            child.spec = by_name[name]
            self.stop(child, "reload") if child.alive() else self.start(child)
        for name in plan.start:
            self.children[name] = Child(by_name[name])
            self.start(self.children[name])
        self._dirty = True
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
        for child in self.children.values():
            if child.restart_at is not None:
                soonest = min(soonest, child.restart_at)
            if child.stop_deadline is not None:
                soonest = min(soonest, child.stop_deadline)
            if child.state in ("starting", "running"):
                soonest = min(soonest, child.last_beat + child.spec.heartbeat_timeout)
                if child.spec.max_rss_mb:
                    soonest = min(soonest, self._next_rss)
        return soonest

    def _due(self, now: float) -> None:
        for child in list(self.children.values()):
            if child.restart_at is not None and now >= child.restart_at and not self.shutting_down:
                child.restarts += 1
                self.start(child)
            if child.stop_deadline is not None and now >= child.stop_deadline and child.alive():
                self.say(f"{child.spec.name}: did not stop within {child.spec.stop_timeout:g} s; SIGKILL")
                self._signal_group(child, signal.SIGKILL)
                child.stop_deadline = None
            if child.state in ("starting", "running") and now - child.last_beat > child.spec.heartbeat_timeout:
                what = "never reported ready" if child.state == "starting" else "stopped heart-beating"
                self.say(f"{child.spec.name}: {what} for {child.spec.heartbeat_timeout:g} s; killing it")
                self.stop(child, "hang", kill=True)
        if now >= self._next_rss:
            self._next_rss = now + RSS_CHECK_INTERVAL
            for child in self.children.values():
                limit = child.spec.max_rss_mb
                if limit and child.state in ("starting", "running") and child.pid:
                    rss = tree_rss_mb(child.pid)
                    if rss > limit:
                        self.say(f"{child.spec.name}: uses {rss:.0f} MB, over max_rss_mb {limit:g}; restarting it")
                        self.stop(child, "memory")

    # -- state ------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "pid_started": start_time(os.getpid()), "started_at": self.started_at,
            "workspace": str(self.ws.root), "shutting_down": self.shutting_down,
            "agents": {name: {
                "pid": child.pid, "pid_started": child.pid_started, "state": child.state,
                "restarts": child.restarts, "started_at": child.started_at if child.pid else None,
                "uptime_s": round(time.monotonic() - child.started, 1) if child.pid else None,
                "task": child.task, "last_exit": child.last_exit or None,
                "log": str(child.spec.workdir / "agent.log"), "digest": child.spec.digest,
            } for name, child in self.children.items()},
        }

    def save(self) -> None:
        write_json_atomic(self.runs / STATE_FILE, self.snapshot(), fsync=False)
        self._dirty = False

    def serve(self) -> int:
        previous = _read_json(self.runs / STATE_FILE)
        self._bind()
        self.say(f"supervisor: {self.containment.detail}")
        adopted = self._take_over(previous)
        for recovered in self.board.recover():
            self.say(f"board: {recovered['task']} back to {recovered['to']} ({recovered['reason']})")
        for name, child in self.children.items():
            if name not in adopted:
                self.start(child)
        self.save()
        while True:
            now = time.monotonic()
            for key, _events in self.selector.select(max(0.0, self._deadlines(now) - now)):
                key.data()
            self._due(time.monotonic())
            if self._dirty:
                self.save()
            # Done once every exit has been handled (its pidfd read and closed), not merely once no
            # agent is alive: an agent reaped by a liveness check still has its exit to record.
            if self.shutting_down and all(child.pidfd is None for child in self.children.values()):
                break
        self.save()
        self.board.close()
        for path in (self.notify_path, self.runs / CONTROL_SOCKET):
            path.unlink(missing_ok=True)
        if self.containment.base is not None:
            cgroups.remove(self.containment.base)
        self.say("supervisor: stopped")
        return 0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _age(pid: int) -> float:
    try:
        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def session_groups(sid: int) -> set[int]:
    """The process groups of session `sid`: an agent leads its session, and what it starts in a
    group of its own (a terminal command, a delegated child) stays in that session."""
    groups = {sid}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 4 and int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
            groups.add(int(fields[2]))
    return groups


def signal_session(sid: int, signum: int) -> None:
    """Signal every process group of an agent's session (the group of the agent itself first)."""
    for group in sorted(session_groups(sid), key=lambda g: g != sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


def tree_rss_mb(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / (1 << 20)


def _with_stop_timeout(spec: ChildSpec, seconds: float) -> ChildSpec:
    from dataclasses import replace

    return replace(spec, stop_timeout=seconds)


def request(runs: Path, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any] | None:
    """Send one command to a running supervisor; None if none is listening."""
    path = runs / CONTROL_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps(payload).encode() + b"\n")
            data = sock.makefile("rb").readline()
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    return json.loads(data) if data else None
