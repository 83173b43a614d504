"""A team of offline agents driven through the CLI: up, a backlog dropped into kanban/inbox/ and timed to done, down."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench.scale_wait import wait_drained

ROOT = Path(__file__).resolve().parent.parent
DSN_ENV = "HERMES_SUP_BENCH_PG_DSN"  # hermes.yaml names the variable; the DSN itself is never written down
UP_TIMEOUT = 1800.0

# Offline agents take any task (no roles) and run its steps without a model.
CONFIG = """\
providers:
  none: {kind: offline}
tiers: {cheap: [none], standard: [none], premium: [none]}
defaults:
  heartbeat_timeout: 120
  max_rss_mb: null
agents:
"""
MAX_COUNT = 64  # hermes.yaml's limit on one entry's count: larger teams are several entries


def agents_yaml(agents: int) -> str:
    """The agents: entries of a team of `agents` offline agents, 64 at most to an entry (pure)."""
    entries, left, n = [], agents, 0
    while left > 0:
        entries.append(f"  - {{name: a{n}, count: {min(left, MAX_COUNT)}}}\n")
        left, n = left - MAX_COUNT, n + 1
    return "".join(entries)
PG_CONFIG = f"board: {{backend: postgres, dsn_env: {DSN_ENV}, host_timeout: 60}}\nhost: bench\n"


def task_doc(task_id: str) -> dict[str, object]:
    """A one-step task: write a small file, no model needed (the issue's workload)."""
    return {"id": task_id, "title": "scale bench", "steps": [
        {"tool": "write_file", "args": {"path": "out.txt", "content": "done\n"}}]}


class Team:
    """One workspace and its supervisor, on the file board or on a PostgreSQL database of its own."""

    def __init__(self, ws: Path, agents: int, dsn: str | None = None, fork_server: bool | None = None) -> None:
        self.ws = ws
        self.agents = agents
        self.dsn = dsn
        self.up_done = False
        self.env = dict(os.environ)
        if dsn is not None:
            self.env[DSN_ENV] = dsn
        if fork_server is not None:
            self.env["HERMES_SUP_FORK_SERVER"] = "1" if fork_server else "0"
        self._cli("init", str(ws), workspace=False)
        text = CONFIG + agents_yaml(agents) + (PG_CONFIG if dsn is not None else "")
        (ws / "hermes.yaml").write_text(text)
        self.stage = ws / "stage"  # drops are written here and renamed into inbox/: each appears whole
        self.stage.mkdir()
        self._conn = None

    def _cli(self, *args: str, workspace: bool = True, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        prefix = ["-w", str(self.ws)] if workspace else []
        done = subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", *prefix, *args], capture_output=True,
                              text=True, env=self.env, cwd=ROOT, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"hermes-sup {' '.join(args)} exited {done.returncode}: {done.stderr[-1500:]}")
        return done

    def up(self) -> float:
        """`up --detach`, which returns once every agent has reported ready; its seconds."""
        self.up_done = True  # from here on down() is owed, even if up fails or is interrupted
        started = time.perf_counter()
        self._cli("up", "--detach", timeout=UP_TIMEOUT)
        return time.perf_counter() - started

    def down(self) -> None:
        if self.up_done:
            self.up_done = False
            self._cli("down", timeout=600.0)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def state(self) -> dict:
        return json.loads((self.ws / "runs" / "supervisor.json").read_text())

    def agent_pids(self) -> list[int]:
        return [a["pid"] for a in self.state()["agents"].values() if a.get("pid") and a.get("state") == "running"]

    def stage_backlog(self, prefix: str, count: int) -> list[Path]:
        """Write the backlog's files outside inbox/, before the clock starts."""
        paths = []
        for n in range(count):
            path = self.stage / f"{prefix}{n:06d}.json"
            path.write_text(json.dumps(task_doc(f"{prefix}{n:06d}")))
            paths.append(path)
        return paths

    def done_count(self, prefix: str) -> int:
        """Done tasks of this backlog, cheaply: the done/ folder's entry names, or one COUNT query."""
        if self.dsn is None:
            return sum(1 for entry in os.scandir(self.ws / "kanban" / "done") if entry.name.startswith(prefix))
        row = self._pg().execute("SELECT count(*) FROM hermes_sup.tasks WHERE status = 'done' AND id LIKE %s",
                                 (prefix + "%",)).fetchone()
        return int(row[0])

    def last_done_at(self, prefix: str) -> float:
        """When the backlog's last task was done (its done file written, or its `done` event's time)."""
        if self.dsn is None:
            folder = self.ws / "kanban" / "done"
            return max(entry.stat().st_mtime for entry in os.scandir(folder) if entry.name.startswith(prefix))
        row = self._pg().execute("SELECT extract(epoch FROM max(at)) FROM hermes_sup.events "
                                 "WHERE dst = 'done' AND task LIKE %s", (prefix + "%",)).fetchone()
        return float(row[0])

    def _pg(self):
        if self._conn is None:
            import psycopg

            self._conn = psycopg.connect(self.dsn, autocommit=True)
        return self._conn

    def drain(self, prefix: str, count: int, poll: float) -> dict[str, float]:
        """Drop `count` one-step tasks into inbox/ and time them from the first drop to the last done,
        with the supervisor's CPU over that time and each agent's USS once they are done."""
        staged = self.stage_backlog(prefix, count)
        inbox = self.ws / "kanban" / "inbox"
        supervisor = psutil.Process(self.state()["pid"])
        cpu0 = supervisor.cpu_times()
        first_drop = time.time()
        for path in staged:
            os.rename(path, inbox / path.name)
        wait_drained(lambda: self.done_count(prefix), count, poll, f"{self.agents} agent(s)")
        wall = time.time() - first_drop
        cpu1 = supervisor.cpu_times()
        seconds = max(self.last_done_at(prefix) - first_drop, 1e-6)
        uss = agents_uss(self.agent_pids())
        return {"seconds": seconds, "per_second": count / seconds,
                "supervisor_cpu_percent": 100 * (cpu1.user - cpu0.user + cpu1.system - cpu0.system) / wall,
                "agent_uss_mb_mean": statistics.mean(uss) if uss else float("nan"),
                "agent_uss_mb_max": max(uss) if uss else float("nan")}


def agents_uss(pids: list[int]) -> list[float]:
    """Each agent's unique memory (USS) in MB; an agent gone meanwhile is left out."""
    sizes = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            sizes.append(psutil.Process(pid).memory_full_info().uss / (1 << 20))
    return sizes
