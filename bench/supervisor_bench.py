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
   server off and on: SIGKILL to the supervisor's `started` event (detect, decide, spawn) and to the
   replacement's first heartbeat (its state `running`), over --kills kills; then each of 4 agents'
   unique memory (USS) and RSS.

Both supervisors restart at once here: hermes-sup because each kill hits an agent that has been
up longer than `reset_after` (set to 0.2 s, so every kill is a healthy agent's first crash),
supervisord with startsecs=0 and autorestart.
"""

from __future__ import annotations

import argparse
import json
import os
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

    def __init__(self, base: Path, count: int, fork: bool) -> None:
        self.ws = base / "hermes-ws"
        subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "init", str(self.ws)], check=True,
                       capture_output=True, cwd=ROOT)
        agents = "".join(f"  - name: a{i:02d}\n" for i in range(count))
        (self.ws / "hermes.yaml").write_text(
            "providers:\n  local: {kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
            "defaults:\n  restart: {policy: always, backoff: {initial: 0.5, max: 30}, max_restarts: 1000000,\n"
            "            window: 1, reset_after: 0.2}\n  heartbeat_timeout: 60\n  max_rss_mb: null\n"
            f"agents:\n{agents}")
        self.env = {**os.environ, "HERMES_SUP_FORK_SERVER": "1" if fork else "0"}

    def started_at(self, pid: int) -> float | None:
        """When the supervisor said it started `pid` (its `started` event), in seconds since the epoch."""
        from datetime import datetime

        for line in reversed((self.ws / "kanban" / "events.jsonl").read_text().splitlines()):
            event = json.loads(line)
            if event.get("event") == "started" and event.get("pid") == pid:
                return datetime.fromisoformat(event["at"].replace("Z", "+00:00")).timestamp()
        return None


def agent_restarts(fork: bool, base: Path, kills: int) -> dict[str, float]:
    sup = HermesAgents(_folder(base, f"agents-{fork}"), 1, fork)
    sup.start()
    try:
        wait_for(lambda: len(sup.running_pids()) == 1, 60, 0.01)
        spawned, ready = [], []
        for _ in range(kills):
            time.sleep(0.3)  # longer than reset_after: each kill is a healthy agent's first crash
            old = sup.running_pids()[0]
            killed_at = time.time()
            os.kill(old, signal.SIGKILL)
            new = wait_for(lambda o=old: [p for p in sup.running_pids() if p != o], 30, 0.001)[0]
            ready.append(time.time() - killed_at)
            spawned.append(wait_for(lambda n=new: sup.started_at(n), 10) - killed_at)
    finally:
        sup.stop()
    return {"kills": kills, "to_started_median_ms": 1000 * statistics.median(spawned),
            "to_started_p99_ms": 1000 * pct(spawned, 0.99), "to_heartbeat_median_ms": 1000 * statistics.median(ready),
            "to_heartbeat_p99_ms": 1000 * pct(ready, 0.99)}


def agent_memory(fork: bool, base: Path, count: int = 4) -> dict[str, float]:
    sup = HermesAgents(_folder(base, f"agents-mem-{fork}"), count, fork)
    sup.start()
    try:
        wait_for(lambda: len(sup.running_pids()) == count, 60, 0.01)
        time.sleep(2)  # past start-up
        infos = [psutil.Process(pid).memory_full_info() for pid in sup.running_pids()]
    finally:
        sup.stop()
    return {"agents": count, "uss_mb": [round(i.uss / (1 << 20), 1) for i in infos],
            "rss_mb": [round(i.rss / (1 << 20), 1) for i in infos]}


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
    parser.add_argument("--agents-only", action="store_true", help="only the agent runtime's figures (part 4)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hermes-supbench-"))
    child = base / "child.py"
    child.write_text(CHILD)
    report: dict[str, object] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count()}
    try:
        if not args.agents_only:
            versus_supervisord(report, base, child, args)
        for fork in (False, True):
            name = f"agent_runtime_fork_server_{'on' if fork else 'off'}"
            lat = agent_restarts(fork, base, args.kills)
            mem = agent_memory(fork, base)
            report[name] = {**lat, **mem}
            print(f"agent runtime, fork server {'on' if fork else 'off'}: SIGKILL to `started`: median "
                  f"{lat['to_started_median_ms']:.1f} ms (p99 {lat['to_started_p99_ms']:.1f}); to first heartbeat: "
                  f"median {lat['to_heartbeat_median_ms']:.1f} ms (p99 {lat['to_heartbeat_p99_ms']:.1f}) over "
                  f"{args.kills} kills; 4 agents' USS {mem['uss_mb']} MB, RSS {mem['rss_mb']} MB")
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
