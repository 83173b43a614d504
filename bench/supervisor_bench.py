"""hermes-sup's supervisor side by side with supervisord 4, same machine, same run, same child.

Run by hand: `python bench/supervisor_bench.py [--kills 200] [--idle 60]`. supervisord is
installed into bench/.venv-supervisord on first use (never a dependency of hermes-sup).

1. Restart latency: SIGKILL the child, time until the replacement's first line of Python runs
   (the child stamps it), over --kills kills; for hermes-sup also until the supervisor has the
   replacement's first heartbeat. Split: "spawn" is the child's own start-up (python to its
   first line, measured alone), "detect+delay" is the rest.
2. Start 20 children until all have run their first line (and, for hermes-sup, reported ready).
3. The supervisor's own idle CPU (percent of one core over --idle seconds) and RSS, 20 children.
4. The agent runtime itself (`python -m hermes_sup.agents run`, not a `command` child), with the fork
   server off and on: SIGKILL to the replacement's first heartbeat (its state `running` in
   supervisor.json), over --kills kills, split into detect (SIGKILL to the process's exit, as a pidfd
   of the bench's own sees it: the supervisor's pidfd becomes readable at the same moment), decide (to
   the supervisor's `exited` event, recorded just before it spawns), spawn (to its `started` event,
   the new process made) and first heartbeat (to `running`); then each of 4 agents' unique memory
   (USS) and RSS.
5. 20 idle agents of the agent runtime (a provider configured, nothing on the board, the default
   max_rss_mb and heartbeat_timeout), fork server off and on: the supervisor's CPU and the agents'
   (mean and highest per agent), percent of one core over --idle seconds.

Both supervisors restart at once here: hermes-sup because each kill hits an agent that has been
up longer than `reset_after` (set to 0.2 s, so every kill is a healthy agent's first crash),
supervisord with startsecs=0 and autorestart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUPERVISORD_VENV = HERE / ".venv-supervisord"
CHILD = '''\
import os, sys, time, socket
stamp = time.time()
with open(os.environ["BENCH_STAMPS"], "a") as f:
    f.write(f"{os.getpid()} {stamp}\\n")
path = os.environ.get("HERMES_SUP_NOTIFY")
if path:
    import json
    name = json.loads(os.environ["HERMES_SUP_AGENT"])["name"]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    while True:
        try:
            s.sendto(f"NAME={name}\\nPID={os.getpid()}\\nWATCHDOG=1".encode(), path)
        except OSError:
            pass
        time.sleep(5)
time.sleep(86400)
'''


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def stamps(path: Path) -> dict[int, float]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            pid, ts = line.split()
            out[int(pid)] = float(ts)
    return out


def wait_for(predicate, timeout: float, interval: float = 0.0005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met")


def child_startup(child: Path, runs: int = 30) -> float:
    """Median seconds from exec of `python child.py` to its first line (the 'spawn' share)."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        stamp_file = Path(tmp) / "s"
        for _ in range(runs):
            stamp_file.unlink(missing_ok=True)
            started = time.time()
            proc = subprocess.Popen([sys.executable, str(child)], env={**os.environ, "BENCH_STAMPS": str(stamp_file)})
            wait_for(lambda: stamp_file.exists() and stamp_file.read_text().strip(), 10)
            times.append(float(stamp_file.read_text().split()[1]) - started)
            proc.kill()
            proc.wait()
    return statistics.median(times)


# -- hermes-sup --------------------------------------------------------------------------------------

class Hermes:
    name = "hermes-sup"

    def __init__(self, base: Path, child: Path, count: int) -> None:
        self.ws = base / "hermes-ws"
        subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "init", str(self.ws)], check=True,
                       capture_output=True, cwd=ROOT)
        agents = "".join(f"  - name: c{i:02d}\n    command: [{sys.executable}, {child}]\n" for i in range(count))
        (self.ws / "hermes.yaml").write_text(
            "defaults:\n  restart: {policy: always, backoff: {initial: 0.5, max: 30}, max_restarts: 1000000,\n"
            "            window: 1, reset_after: 0.2}\n  heartbeat_timeout: 60\n  max_rss_mb: null\n"
            f"agents:\n{agents}")
        self.stamps = base / "hermes-stamps"
        self.env = {**os.environ, "BENCH_STAMPS": str(self.stamps)}

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.supervisor", "-w", str(self.ws), "up"],
                                     env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self.proc

    def state(self) -> dict:
        try:
            return json.loads((self.ws / "runs" / "supervisor.json").read_text())
        except (OSError, ValueError):
            return {}

    def running_pids(self) -> list[int]:
        agents = self.state().get("agents", {})
        return [a["pid"] for a in agents.values() if a.get("state") == "running" and a.get("pid")]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


# -- supervisord ----------------------------------------------------------------------------------------

def ensure_supervisord() -> Path:
    exe = SUPERVISORD_VENV / "bin" / "supervisord"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(SUPERVISORD_VENV)], check=True)
        subprocess.run([str(SUPERVISORD_VENV / "bin" / "pip"), "install", "--quiet", "supervisor>=4,<5"], check=True)
    return exe


class Supervisord:
    name = "supervisord"

    def __init__(self, base: Path, child: Path, count: int) -> None:
        self.exe = ensure_supervisord()
        self.dir = base / "supervisord"
        self.dir.mkdir()
        self.stamps = base / "supervisord-stamps"
        self.conf = self.dir / "supervisord.conf"
        self.conf.write_text(f"""\
[supervisord]
nodaemon=true
logfile={self.dir}/supervisord.log
pidfile={self.dir}/supervisord.pid
loglevel=warn

[program:child]
command={sys.executable} {child}
process_name=%(program_name)s_%(process_num)02d
numprocs={count}
autorestart=true
startsecs=0
startretries=1000000
environment=BENCH_STAMPS="{self.stamps}"
stdout_logfile={self.dir}/%(program_name)s_%(process_num)02d.log
redirect_stderr=true
""")

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen([str(self.exe), "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        return self.proc

    def running_pids(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children() if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return []

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


# -- the agent runtime, with and without the fork server -------------------------------------------------

class HermesAgents(Hermes):
    """Real agents (the agent runtime), with the fork server on or off; an openai provider is named,
    so the fork server imports that SDK (no call is ever made)."""

    def __init__(self, base: Path, count: int, fork: bool, *, memory_limit: bool = False, spares: bool = True) -> None:
        self.ws = base / "hermes-ws"
        subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "init", str(self.ws)], check=True,
                       capture_output=True, cwd=ROOT)
        # Its own chain of the configured provider: an idle agent with a model to use, not one that
        # looks for a server every few seconds because it has none (`auto` with no key is offline).
        agents = "".join(f"  - name: a{i:02d}\n    providers: [local]\n" for i in range(count))
        (self.ws / "hermes.yaml").write_text(
            "providers:\n  local: {kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
            "defaults:\n  restart: {policy: always, backoff: {initial: 0.5, max: 30}, max_restarts: 1000000,\n"
            "            window: 1, reset_after: 0.2}\n  heartbeat_timeout: 60\n"
            + ("" if memory_limit else "  max_rss_mb: null\n") + f"agents:\n{agents}")
        self.env = {**os.environ, "HERMES_SUP_FORK_SERVER": "1" if fork else "0", "HERMES_SUP_SPARES": str(int(spares))}

    def restart_at(self, pid: int) -> tuple[float, float] | None:
        """When the supervisor recorded the restart that started `pid`: its `exited` event (written
        once the exit was seen and the restart decided, just before the spawn) and its `started`
        event (once the new process was made), in seconds since the epoch (the board stamps `at` as
        it appends each event)."""
        from datetime import datetime

        def at(event: dict) -> float:
            return datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()

        events = [json.loads(line) for line in (self.ws / "kanban" / "events.jsonl").read_text().splitlines()]
        for index in range(len(events) - 1, -1, -1):
            if events[index].get("event") == "started" and events[index].get("pid") == pid:
                exited = [e for e in events[:index] if e.get("event") == "exited"
                          and e.get("agent") == events[index].get("agent")]
                return (at(exited[-1]), at(events[index])) if exited else None
        return None


def agent_restarts(fork: bool, base: Path, kills: int, spares: bool = True) -> dict[str, float]:
    """Restarts of one agent. With spares (the default), the first restart forks anew and each later
    one is the spare forked ahead of it (supervisor/spares.py); the first is also reported alone."""
    sup = HermesAgents(_folder(base, f"agents-{fork}-{spares}"), 1, fork, spares=spares)
    sup.start()
    parts: dict[str, list[float]] = {"detect": [], "decide": [], "spawn": [], "heartbeat": [], "started": [],
                                     "total": []}
    try:
        wait_for(lambda: len(sup.running_pids()) == 1, 60, 0.01)
        for _ in range(kills):
            time.sleep(0.3)  # longer than reset_after: each kill is a healthy agent's first crash
            old = sup.running_pids()[0]
            pidfd = os.pidfd_open(old)
            try:
                killed_at = time.time()
                os.kill(old, signal.SIGKILL)
                select.select([pidfd], [], [], 10)
                gone_at = time.time()
            finally:
                os.close(pidfd)
            new = wait_for(lambda o=old: [p for p in sup.running_pids() if p != o], 30, 0.001)[0]
            ready_at = time.time()
            exited_at, started_at = wait_for(lambda n=new: sup.restart_at(n), 10)
            parts["detect"].append(gone_at - killed_at)
            parts["decide"].append(exited_at - gone_at)
            parts["spawn"].append(started_at - exited_at)
            parts["heartbeat"].append(ready_at - started_at)
            parts["started"].append(started_at - killed_at)
            parts["total"].append(ready_at - killed_at)
    finally:
        sup.stop()
    out: dict[str, float] = {"kills": kills, "first_started_ms": 1000 * parts["started"][0]}
    for part, values in parts.items():
        out[f"{part}_median_ms"] = 1000 * statistics.median(values)
        out[f"{part}_p99_ms"] = 1000 * pct(values, 0.99)
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time used by all threads of `pid`, in seconds: the scheduler's nanoseconds where Linux gives
    them (/proc/PID/task/*/schedstat), since psutil's clock ticks (10 ms) are a third of what an idle
    agent may use in 30 s."""
    try:
        return sum(int((task / "schedstat").read_text().split()[0])
                   for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, ValueError, IndexError):
        return sum(psutil.Process(pid).cpu_times()[:2])


def agents_idle(fork: bool, base: Path, count: int, idle: float) -> dict[str, float]:
    """The supervisor's CPU and each idle agent's (percent of one core) over `idle` seconds."""
    sup = HermesAgents(_folder(base, f"agents-idle-{fork}"), count, fork, memory_limit=True)  # the default
    sup.start()
    try:
        wait_for(lambda: len(sup.running_pids()) == count, 120, 0.05)
        time.sleep(3)  # past start-up
        pids = [sup.proc.pid, *sup.running_pids()]
        before = [cpu_seconds(pid) for pid in pids]
        started = time.monotonic()
        time.sleep(idle)
        elapsed = time.monotonic() - started
        used = [(cpu_seconds(pid) - b) / elapsed * 100 for pid, b in zip(pids, before, strict=True)]
    finally:
        sup.stop()
    agents = used[1:]
    return {"agents": count, "supervisor_cpu_percent": used[0], "agent_cpu_percent_mean": sum(agents) / len(agents),
            "agent_cpu_percent_max": max(agents), "load_average": os.getloadavg()[0]}


def agent_memory(fork: bool, base: Path, count: int = 4) -> dict[str, float]:
    sup = HermesAgents(_folder(base, f"agents-mem-{fork}"), count, fork)
    sup.start()
    try:
        wait_for(lambda: len(sup.running_pids()) == count, 60, 0.01)
        time.sleep(2)  # past start-up
        infos = [psutil.Process(pid).memory_full_info() for pid in sup.running_pids()]
        spare = spare_memory(sup) if fork else None
    finally:
        sup.stop()
    return {"agents": count, "uss_mb": [round(i.uss / (1 << 20), 1) for i in infos],
            "rss_mb": [round(i.rss / (1 << 20), 1) for i in infos], "spare_uss_mb": spare}


def spare_memory(sup: HermesAgents) -> float:
    """The USS of the spare process a restarted agent gets (supervisor/spares.py), in MB."""
    old = sup.running_pids()[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: len(sup.running_pids()) == 4 and old not in sup.running_pids(), 30, 0.01)

    def spare() -> int | None:
        for child in psutil.Process(sup.proc.pid).children():
            with contextlib.suppress(psutil.Error):
                command = child.cmdline()  # padded with empty arguments to the fork server's length
                if child.pid not in sup.running_pids() and "hermes_sup.agents" in command and "run" in command \
                        and child.status() != psutil.STATUS_ZOMBIE:
                    return child.pid
        return None

    pid = wait_for(spare, 30, 0.05)
    return round(psutil.Process(pid).memory_full_info().uss / (1 << 20), 2)


# -- measurements -----------------------------------------------------------------------------------

def restart_latency(sup, kills: int) -> dict[str, float]:
    sup.start()
    try:
        wait_for(lambda: len(sup.running_pids()) == 1, 30, 0.01)
        totals, ready = [], []
        for _ in range(kills):
            time.sleep(0.3)  # longer than reset_after: each kill is a healthy agent's first crash
            old = sup.running_pids()[0]
            before = set(stamps(sup.stamps))
            killed_at = time.time()
            os.kill(old, signal.SIGKILL)
            new = wait_for(lambda b=before, o=old: [p for p in stamps(sup.stamps) if p not in b and p != o], 10)
            totals.append(stamps(sup.stamps)[new[0]] - killed_at)
            if isinstance(sup, Hermes):
                wait_for(lambda n=new[0]: sup.running_pids() == [n], 10)
                ready.append(time.time() - killed_at)
    finally:
        sup.stop()
    result = {"kills": kills, "median_ms": 1000 * statistics.median(totals), "p99_ms": 1000 * pct(totals, 0.99)}
    if ready:
        result["to_heartbeat_median_ms"] = 1000 * statistics.median(ready)
        result["to_heartbeat_p99_ms"] = 1000 * pct(ready, 0.99)
    return result


def start_many(sup, count: int, idle: float) -> dict[str, float]:
    started = time.time()
    proc = sup.start()
    try:
        wait_for(lambda: len(stamps(sup.stamps)) >= count, 60, 0.002)
        first_lines = time.time() - started
        wait_for(lambda: len(sup.running_pids()) == count, 60, 0.002)
        all_running = time.time() - started
        time.sleep(2)  # let start-up settle before the idle measurement
        me = psutil.Process(proc.pid)
        cpu0 = me.cpu_times()
        time.sleep(idle)
        cpu1 = me.cpu_times()
        cpu = (cpu1.user - cpu0.user + cpu1.system - cpu0.system) / idle * 100
        rss = me.memory_info().rss / (1 << 20)
    finally:
        sup.stop()
    return {"children": count, "all_first_line_s": first_lines, "all_running_s": all_running,
            "idle_cpu_percent": cpu, "rss_mb": rss}


def versus_supervisord(report: dict[str, object], base: Path, child: Path, args: argparse.Namespace) -> None:
    """Parts 1 to 3: the same `command` child under both supervisors."""
    spawn = child_startup(child)
    report["child_startup_ms"] = spawn * 1000
    print(f"child start-up alone (python to its first line): {spawn * 1000:.1f} ms median")
    for cls in (Hermes, Supervisord):
        lat = restart_latency(_fresh(cls, base, child, 1), args.kills)
        lat["detect_plus_delay_median_ms"] = lat["median_ms"] - spawn * 1000
        report[f"{cls.name}_restart"] = lat
        extra = (f"; to first heartbeat: median {lat['to_heartbeat_median_ms']:.1f} ms, "
                 f"p99 {lat['to_heartbeat_p99_ms']:.1f} ms" if "to_heartbeat_median_ms" in lat else "")
        print(f"{cls.name}: SIGKILL to replacement running: median {lat['median_ms']:.1f} ms, "
              f"p99 {lat['p99_ms']:.1f} ms over {args.kills} kills "
              f"(detect+delay {lat['detect_plus_delay_median_ms']:.1f} ms, spawn {spawn * 1000:.1f} ms){extra}")
    for cls in (Hermes, Supervisord):
        many = start_many(_fresh(cls, base, child, 20), 20, args.idle)
        report[f"{cls.name}_20"] = many
        print(f"{cls.name}: 20 children: all running their first line after {many['all_first_line_s']:.2f} s, "
              f"all 'running' after {many['all_running_s']:.2f} s; idle CPU {many['idle_cpu_percent']:.2f}% "
              f"of a core over {args.idle:g} s; RSS {many['rss_mb']:.1f} MB")
    h, s = report["hermes-sup_restart"], report["supervisord_restart"]
    print(f"restart latency ratio hermes-sup / supervisord (medians): {h['median_ms'] / s['median_ms']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--agents-only", action="store_true", help="only the agent runtime's figures (parts 4, 5)")
    parser.add_argument("--fork", choices=("off", "on", "both"), default="both", help="the fork server in parts 4, 5")
    parser.add_argument("--skip", action="append", default=[], choices=("restart", "memory", "idle"),
                        help="leave out a part of the agent runtime's figures (repeatable)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hermes-supbench-"))
    child = base / "child.py"
    child.write_text(CHILD)
    report: dict[str, object] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count()}
    try:
        if not args.agents_only:
            versus_supervisord(report, base, child, args)
        for fork in {"off": (False,), "on": (True,), "both": (False, True)}[args.fork]:
            on = "on" if fork else "off"
            lat = agent_restarts(fork, base, args.kills) if "restart" not in args.skip else None
            bare = agent_restarts(fork, base, args.kills, spares=False) if fork and lat else None
            mem = agent_memory(fork, base) if "memory" not in args.skip else None
            idle = agents_idle(fork, base, 20, args.idle) if "idle" not in args.skip else None
            report[f"agent_runtime_fork_server_{on}"] = {**(lat or {}), **(mem or {}), "idle": idle,
                                                          "no_spares": bare}
            for what, figures in ((f"fork server {on}", lat), ("fork server on, no spares", bare)):
                if figures:
                    split = ", ".join(f"{part} {figures[f'{part}_median_ms']:.1f} (p99 {figures[f'{part}_p99_ms']:.1f})"
                                      for part in ("detect", "decide", "spawn", "heartbeat"))
                    print(f"agent runtime, {what}: SIGKILL to `started`: median "
                          f"{figures['started_median_ms']:.1f} ms (p99 {figures['started_p99_ms']:.1f}; the first "
                          f"{figures['first_started_ms']:.1f}); to first heartbeat: median "
                          f"{figures['total_median_ms']:.1f} ms (p99 {figures['total_p99_ms']:.1f})"
                          f" over {args.kills} kills (load {os.getloadavg()[0]:.2f}); split, ms: {split}")
            if mem:
                print(f"agent runtime, fork server {on}: 4 agents' USS {mem['uss_mb']} MB, RSS {mem['rss_mb']} MB"
                      + (f"; a spare's USS {mem['spare_uss_mb']} MB" if mem["spare_uss_mb"] is not None else ""))
            if idle:
                print(f"agent runtime, fork server {on}: 20 idle agents over {args.idle:g} s (load "
                      f"{idle['load_average']:.2f}): supervisor {idle['supervisor_cpu_percent']:.3f}% of a core, "
                      f"agents {idle['agent_cpu_percent_mean']:.3f}% each "
                      f"(highest {idle['agent_cpu_percent_max']:.3f}%)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"supervisor-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")


def _folder(base: Path, name: str) -> Path:
    folder = base / f"{name}-{time.monotonic_ns()}"
    folder.mkdir()
    return folder


def _fresh(cls, base: Path, child: Path, count: int):
    return cls(_folder(base, f"{cls.name}-{count}"), child, count)


if __name__ == "__main__":
    main()
