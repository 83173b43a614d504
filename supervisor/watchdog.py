"""The supervisor's watch over running agents: a missed heartbeat is a hung agent (unless its state file
shows the beat was only dropped), memory over max_rss_mb a restart, and a stopped supervisor's own gap
not held against them."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from ..kanban.fsio import read_bytes_nofollow
from . import cgroups
from .child import Child
from .exits import State, event
from .policy import loop_gap
from .procs import trees_rss_mb

if TYPE_CHECKING:
    from .runner import Supervisor

RSS_CHECK_INTERVAL = 5.0
GAP_TOLERANCE = 1.0


def tree_memory(children: list[Child]) -> dict[int, float]:
    """Each agent's process tree's resident memory in MB, by its pid: from its cgroup where it has one,
    else from one scan of the process table for those without."""
    memory: dict[int, float] = {}
    scan = []
    for child in children:
        rss = cgroups.rss_mb(child.cgroup) if child.cgroup is not None else None
        if rss is None:
            scan.append(child.pid or 0)
        else:
            memory[child.pid or 0] = rss
    return {**memory, **(trees_rss_mb(scan) if scan else {})}


class Watchdog:
    """Heartbeat, memory and loop-gap checks for `sup`'s agents; owns when memory is next read."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.next_rss = 0.0
        self.last_woke = time.monotonic()

    def heart(self, child: Child, now: float) -> None:
        """Kill an agent that never reported ready, or stopped heart-beating, within heartbeat_timeout."""
        if child.state in ("starting", "running") and now - child.last_beat > child.spec.heartbeat_timeout:
            if self.beat_written(child, now):
                return  # its heartbeats were dropped (a full notify queue), not missed
            what = "never reported ready" if child.state == "starting" else "stopped heart-beating"
            line = f"{child.spec.name}: {what} for {child.spec.heartbeat_timeout:g} s; killing it"
            self.sup.tell(line, [event("hung", child.spec.name, line, pid=child.pid)])
            self.sup.stop(child, "hang", kill=True)

    def memory(self, now: float) -> None:
        """Every RSS_CHECK_INTERVAL, restart each agent whose process tree is over its max_rss_mb."""
        if now < self.next_rss:
            return
        self.next_rss = now + RSS_CHECK_INTERVAL
        limited = [child for child in self.sup.children.values()
                   if child.spec.max_rss_mb and child.state in ("starting", "running") and child.pid]
        try:
            memory = tree_memory(limited)
        except OSError as exc:  # no descriptors to read it: looked at again next interval
            self.sup.leftovers.proc_trouble(exc)
            limited = []
        for child in limited:
            limit, rss = child.spec.max_rss_mb or 0.0, memory.get(child.pid or 0, 0.0)
            if rss > limit:
                line = f"{child.spec.name}: uses {rss:.0f} MB, over max_rss_mb {limit:g}; restarting it"
                self.sup.tell(line, [event("over_memory", child.spec.name, line, pid=child.pid)])
                self.sup.stop(child, "memory")

    def credit_gap(self, woke: float, expected: float) -> None:
        """After a turn of the loop that took much longer than its wait, the supervisor was not
        running (SIGSTOP, a suspended VM): the agents' heartbeats are judged on the time it ran."""
        gap = loop_gap(elapsed=woke - self.last_woke, expected=expected, tolerance=GAP_TOLERANCE)
        self.last_woke = woke
        if not gap:
            return
        self.sup.say(f"supervisor: did not run for {gap:.1f} s (stopped or starved); that time is not counted "
                     f"against the agents' heartbeats")
        for child in self.sup.children.values():
            if child.state in ("starting", "running"):
                child.last_beat += gap

    def beat_written(self, child: Child, now: float) -> bool:
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
            child.state, self.sup.dirty = State.RUNNING, True
        return True
