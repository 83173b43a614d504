"""One agent as the supervisor keeps it: its spec, its process (started, or adopted from a previous
supervisor) and what its restarts and exits have left."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..kanban.liveness import holder_alive
from .forking import Forked
from .policy import RestartHistory
from .procs import Marker
from .spec import ChildSpec


@dataclass
class Child:
    spec: ChildSpec
    state: str = "stopped"  # starting, running, backoff, fatal, stopping, stopped
    proc: subprocess.Popen[bytes] | Forked | None = None  # Forked: a fork of the fork server
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
    # The names of the environment it was started with (None: not known), to see whether it holds a
    # variable that was withheld from the agents only after it started (see operator.Operator.withhold_secrets).
    env_names: frozenset[str] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else self.adopted

    def published(self, now: float, held: bool) -> dict[str, Any]:
        """What supervisor.json (and `status`) says of it (`now`: time.monotonic())."""
        return {
            "pid": self.pid, "pid_started": self.pid_started, "state": self.state,
            "restarts": self.restarts, "started_at": self.started_at if self.pid else None,
            "uptime_s": round(now - self.started, 1) if self.pid else None,
            "task": self.task, "last_exit": self.last_exit or None,
            "log": str(self.spec.workdir / "agent.log"), "digest": self.spec.digest, "held": held,
        }

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self.adopted is None:
            return False
        try:
            return holder_alive(self.adopted, self.pid_started, None) is True
        except OSError:  # /proc unreadable (no descriptors): its pidfd has not reported an exit yet
            return self.pidfd is not None


def published_agents(runs: Path) -> list[dict[str, Any]]:
    """This host's agents as its heartbeat publishes them on a shared board (agentrows.py)."""
    from .views.agentrows import published  # it reads supervisor.json as this module names it

    return published(runs)
