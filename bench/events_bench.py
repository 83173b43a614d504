"""Watching benchmarks, run by hand: `python bench/events_bench.py [--quick]`.

1. Event -> `events -f` line latency: a real `events -f --json` process follows a board that this
   process changes one transition at a time; the time from just before the change to the line
   read from the follower's stdout, p50/p99 over 1,000 transitions.
2. Wall time of the whole commands `status`, `board` and `task show ID` (a process each, Python's
   start included) with 10,000 tasks on the board; target: each < 300 ms (median of 7 runs, the
   commands and `--help` taking turns).

These machines are shared and noisy: the figures are medians and percentiles of one run. The
commands run as an installed package does, with its bytecode cached: PYTHONDONTWRITEBYTECODE is
dropped from their environment and the first run of each is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.kanban import Board  # noqa: E402

CLI = (sys.executable, "-m", "hermes_sup.supervisor")
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
TARGET_MS = 300.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def init(ws: Path) -> None:
    subprocess.run([*CLI, "init", str(ws)], check=True, capture_output=True, cwd=ROOT)


def follow_latency(ws: Path, count: int) -> list[float]:
    """Seconds from before each transition to its line on the follower's stdout."""
    proc = subprocess.Popen([*CLI, "-w", str(ws), "events", "-f", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1)
    arrived: dict[str, float] = {}
    seen = threading.Condition()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            task = json.loads(line).get("task")
            with seen:
                arrived[task] = time.perf_counter()
                seen.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    board = Board(ws / "kanban")
    latencies = []
    try:
        board.add({"title": "warm-up", "id": "warm-up"})
        with seen:
            seen.wait_for(lambda: "warm-up" in arrived, timeout=30)
        for n in range(count):
            task = f"t-{n}"
            started = time.perf_counter()
            board.add({"title": task, "id": task})
            with seen:
                if not seen.wait_for(lambda t=task: t in arrived, timeout=30):
                    raise SystemExit(f"{task}: no line within 30 s")
                latencies.append(arrived[task] - started)
    finally:
        board.close()
        proc.terminate()
        proc.wait(timeout=30)
    return latencies


def command_times(ws: Path, commands: list[list[str]], runs: int) -> list[list[float]]:
    """Each command's wall times, the commands taking turns run by run, so that a busy moment of
    this shared machine falls on all of them alike rather than on one command's runs."""
    times: list[list[float]] = [[] for _ in commands]
    for run in range(runs + 1):
        for args, kept in zip(commands, times, strict=True):
            started = time.perf_counter()
            done = subprocess.run([*CLI, "-w", str(ws), *args], cwd=ROOT, capture_output=True, env=ENV)
            if run:  # the first wrote the bytecode cache
                kept.append(time.perf_counter() - started)
            if done.returncode not in (0, 1):
                raise SystemExit(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.decode()[:500]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 transitions and 1,000 tasks")
    options = parser.parse_args()
    transitions, tasks, runs = (100, 1000, 3) if options.quick else (1000, 10_000, 7)
    with tempfile.TemporaryDirectory(prefix="events-bench-") as tmp:
        ws = Path(tmp) / "ws"
        init(ws)
        latencies = follow_latency(ws, transitions)
        print(f"event -> `events -f` line, {transitions} transitions: p50 {pct(latencies, 0.5) * 1000:.1f} ms, "
              f"p99 {pct(latencies, 0.99) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
        big = Path(tmp) / "big"
        init(big)
        board = Board(big / "kanban")
        started = time.perf_counter()
        try:
            for n in range(tasks):
                board.add({"title": f"task {n}", "id": f"task-{n}", "priority": n % 5,
                           "depends_on": [f"task-{n - 1}"] if n % 10 == 9 else []})
        finally:
            board.close()
        print(f"(filled {tasks:,} tasks in {time.perf_counter() - started:.1f} s)")
        commands = [["--help"], ["status"], ["board"], ["task", "show", f"task-{tasks // 2}"]]
        baseline, *measured = command_times(big, commands, runs)
        print(f"`--help` (Python's start and the CLI's imports): median {statistics.median(baseline) * 1000:.0f} ms")
        for args, times in zip(commands[1:], measured, strict=True):
            median = statistics.median(times) * 1000
            own = median - statistics.median(baseline) * 1000
            print(f"`{' '.join(args)}` with {tasks:,} tasks: median {median:.0f} ms ({own:+.0f} ms over `--help`), "
                  f"max {max(times) * 1000:.0f} ms ({'meets' if median < TARGET_MS else 'MISSES'} the "
                  f"{TARGET_MS:.0f} ms target)")


if __name__ == "__main__":
    main()
