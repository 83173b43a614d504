"""What other supervisors and exited agents left: adopting a previous supervisor's agents still running, and
stopping every process of this workspace's agents that no supervised agent owns any more."""

from __future__ import annotations

import os
import selectors
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..kanban.task import now_iso
from . import cgroups
from .child import Child
from .exits import event
from .held import Held
from .procs import SHORT_OF, Marker, ScanIncomplete, environ_names, is_agent_process, marked, stop_all, strays
from .sessions import process_age, signal_session

if TYPE_CHECKING:
    from .runner import Supervisor

SCAN_RETRY = 2.0  # seconds between sweeps for what exited agents left, while /proc cannot be read whole


class Leftovers:
    """Adoption and stray sweeps for `sup`; owns when the next sweep is due while /proc cannot be read whole."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.sweep_at: float | None = None  # when to look again for what exited agents left running
        self.scan_failing = False
        self.held = Held()

    def exited(self, child: Child, cgroup: Path | None) -> None:
        """What is left in an exited agent's `cgroup` (its keeper at least) goes, once its replacement
        runs (not on the restart's path): that is in the agent's other cgroup, or in this one, made
        anew because it was empty or killed first when neither was (cgroups.joiner). The inotify
        instance held for it is closed (see held.py)."""
        if cgroup is not None and (child.proc is None or child.cgroup != cgroup):
            cgroups.kill(cgroup)
        self.held.release(child.spec.name)

    def kill_leftovers(self, pid: int | None) -> None:
        """No process an exited agent (`pid`) started outlives it: what is left in its session's
        process groups, or carries its marker (having left both, with setsid in process-group mode).
        Called once its replacement runs, so that two scans of /proc are not on the restart path; a
        replacement that got the very pid back is a session of its own, never signalled here."""
        if pid is not None and all(c.pid != pid for c in self.sup.children.values() if c.pidfd is not None):
            signal_session(pid, signal.SIGKILL)
        self.sweep_strays()

    def sweep_strays(self) -> None:
        """SIGKILL every process of this workspace's agents that no supervised agent owns any more (its
        marker's instance has exited). When /proc cannot be read whole (no descriptors left) this is
        retried on a timer: the supervision goes on meanwhile, and the leftovers go once it can."""
        keep = {c.marker.nonce for c in self.sup.children.values() if c.pidfd is not None and c.marker is not None}
        try:
            stop_all(strays(marked(self.sup.ws.root), keep), 0)
        except ScanIncomplete as exc:
            self.sweep_at = time.monotonic() + SCAN_RETRY
            self.proc_trouble(exc)
            return
        self.sweep_at = None
        self.proc_trouble(None)

    def proc_trouble(self, exc: OSError | None) -> None:
        """Say once when reading /proc starts failing (a failed scan each turn must not flood the
        log), and once when it works again."""
        if exc is not None and not self.scan_failing:
            self.scan_failing = True
            self.sup.say(f"supervisor: cannot read /proc ({exc.strerror or exc}); the agents are still supervised, "
                     f"and what exited agents left running is stopped once it can be read (retrying every "
                     f"{SCAN_RETRY:g} s)")
        elif exc is None and self.scan_failing:
            self.scan_failing = False
            self.sup.say("supervisor: reading /proc works again")

    def adopt(self, child: Child, info: dict[str, Any], marker: Marker, pidfd: int) -> None:
        """Take over an agent a previous supervisor started and that is still running: no restart,
        only a pidfd to see it exit (it is not our child, so its exit status is not ours to read)."""
        pid = info["pid"]
        child.pidfd = pidfd
        child.adopted, child.pid_started, child.marker = pid, info.get("pid_started"), marker
        child.env_names = environ_names(pid)
        where = cgroups.cgroup_of(pid)
        if where is not None and where.parent.name == cgroups.base_name(self.sup.ws.root) \
                and where.name in {path.name for path in cgroups.agent_cgroups(where.parent, child.spec.name)}:
            child.cgroup = where
        self.sup.selector.register(child.pidfd, selectors.EVENT_READ, lambda c=child: self.sup._on_exit(c))
        now = time.monotonic()
        child.state, child.last_beat = "running", now
        child.started = now - process_age(pid)
        child.started_at = info.get("started_at") or now_iso()
        child.restarts = int(info.get("restarts") or 0)
        child.task = info.get("task")
        self.sup.dirty = True
        line = f"{child.spec.name}: adopted the running agent (pid {pid})"
        self.sup.tell(line, [event("adopted", child.spec.name, line, pid=pid)])

    def take_over(self, previous: dict[str, Any]) -> set[str]:
        """Adopt the agents of a previous supervisor that are still alive: the same process (pid and
        start time) and one of this agent (its marker); then stop every other process any agent of this
        workspace left (not wanted any more, changed, or never saved). Returns the names adopted."""
        adopted = set()
        agents = previous.get("agents")
        for name, info in (agents if isinstance(agents, dict) else {}).items():
            child = self.sup.children.get(name)
            if child is None or not isinstance(info, dict) or child.spec.digest != info.get("digest") \
                    or name in self.sup.held:  # a held agent still running is a stray, stopped below
                continue
            pid, started = info.get("pid"), info.get("pid_started")
            if not isinstance(pid, int) or pid <= 0 or not isinstance(started, (int, float)):
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            # Checked once the pidfd is open: it cannot name a newer process that reused the pid.
            marker = is_agent_process(pid, started, self.sup.ws.root, name)
            if marker is None:
                os.close(pidfd)
                continue
            self.adopt(child, info, marker, pidfd)
            adopted.add(name)
        keep = {child.marker.nonce for name, child in self.sup.children.items() if name in adopted and child.marker}
        try:
            left = strays(marked(self.sup.ws.root), keep)
            if left:
                self.sup.say(f"supervisor: stopping {len(left)} process(es) a previous supervisor left running and "
                             f"nobody runs now: {', '.join(f'{p.marker.agent} (pid {p.pid})' for p in left)}")
                stop_all(left, max((c.spec.stop_timeout for c in self.sup.children.values()), default=10.0))
            # What dropped its marker too, in the agents' cgroups (wherever the previous supervisor made them).
            kept = {child.cgroup for child in self.sup.children.values() if child.cgroup is not None}
            for folder in cgroups.workspace_cgroups(self.sup.ws.root) - kept:
                cgroups.kill(folder)
        except OSError as exc:
            # Short of descriptors as it starts (a limit as low as a few agents' worth; its own threads
            # opening files meanwhile): it supervises on, as after an agent's exit. What carries a
            # marker goes at the first sweep that can read /proc (sweep_strays, retried on a timer);
            # a previous supervisor's cgroups are left to the next start.
            if not isinstance(exc, ScanIncomplete) and exc.errno not in SHORT_OF:
                raise
            self.sweep_at = time.monotonic()
            self.proc_trouble(exc)
        return adopted
