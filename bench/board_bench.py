"""Board benchmarks, run by hand: `make bench` or `python bench/board_bench.py [--quick]`.

1. The machine's own limit: fsync'd temp-write-and-rename of a small JSON file, one process,
   measured right before and right after each throughput run.
2. Claim+complete throughput with 1, 4 and 8 claimer processes on 10,000 tasks, as a ratio to (1),
   the median of 3 rounds.
3. Drop-to-claim latency with 4 idle claimers in wait_for_work, against a claimer that polls
   every second (the baseline the watcher must beat).
4. `hermes-sup board --json` over 10,000 tasks, the whole command.

Every figure is a median (and p99 where it is a distribution) over repeated measurements in this
one run; these machines are noisy, so compare ratios, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.kanban import Board  # noqa: E402
from hermes_sup.kanban.fsio import write_json_atomic  # noqa: E402

from bench.claimers import run as run_claimers  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- 1. the machine's fsync limit ------------------------------------------------------------------

def fsync_limit(folder: Path, seconds: float) -> float:
    doc = {"id": "x", "title": "a small task", "status": "todo", "priority": 0, "history": []}
    count = 0
    end = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < end:
        write_json_atomic(folder / "probe.json", doc)
        count += 1
    return count / (time.perf_counter() - started)


# -- 2. throughput ---------------------------------------------------------------------------------

def fill(root: Path, count: int) -> None:
    board = Board(root)
    for i in range(count):
        board.add({"title": f"task {i}", "priority": i % 5})


def claimer(root: str) -> Callable[[], int]:
    """One claimer of the board alone (bench/claimers.py), its claim index built before the clock starts."""
    board = Board(root)
    board.claims.catch_up()  # one lock-free scan of the backlog

    def work() -> int:
        done = 0
        while (doc := board.claim(f"c{os.getpid()}")) is not None:
            board.complete(doc["id"], doc["claim"]["token"], "ok")
            done += 1
        return done
    return work


def throughput(base: Path, claimers: int, tasks: int) -> dict[str, float]:
    root = base / f"tp-{claimers}"
    fill(root, tasks)
    elapsed, done = run_claimers(claimer, [(str(root),)] * claimers)
    assert sum(done) == tasks, f"{sum(done)} of {tasks} tasks completed"
    shutil.rmtree(root)
    return {"claimers": claimers, "tasks": tasks, "seconds": elapsed, "per_second": tasks / elapsed}


# -- 3. drop-to-claim latency ----------------------------------------------------------------------

def waiter_main(root: str, out: str, mode: str) -> None:
    board = Board(root)
    Path(out + ".ready").touch()
    with open(out, "a") as log:
        while True:
            if mode == "watch":
                doc = board.wait_for_work(f"w{os.getpid()}", timeout=120)
            else:  # the baseline: a claimer that looks once a second
                board.ingest()
                doc = board.claim(f"p{os.getpid()}")
                if doc is None:
                    time.sleep(1.0)
                    continue
            if doc is None:
                return
            stamp = time.time()
            board.complete(doc["id"], doc["claim"]["token"], "ok")
            log.write(json.dumps({"title": doc["title"], "claimed": stamp}) + "\n")
            log.flush()


def drop_latency(base: Path, mode: str, claimers: int, drops: int) -> dict[str, float]:
    root = base / f"lat-{mode}"
    Board(root)
    outs = [base / f"lat-{mode}-{n}.jsonl" for n in range(claimers)]
    procs = [subprocess.Popen([sys.executable, __file__, "_waiter", str(root), str(out), mode]) for out in outs]
    try:
        while not all(Path(str(out) + ".ready").exists() for out in outs):
            time.sleep(0.01)
        time.sleep(0.5)  # all waiting
        dropped: dict[str, float] = {}
        rng = random.Random(1)
        for n in range(drops):
            # A drop at a random moment of the poller's 1-second cycle, not right after its last claim.
            time.sleep(rng.uniform(0, 1.0) if mode == "poll" else 0.02)
            title = f"drop {n}"
            tmp = root / f".drop-{n}.tmp"
            tmp.write_text(json.dumps({"title": title}))
            dropped[title] = time.time()
            os.rename(tmp, root / "inbox" / f"drop-{n}.json")
            # wait for the claim before the next drop, so claimers are idle each time
            deadline = time.time() + 10
            while time.time() < deadline:
                if any(title in out.read_text() for out in outs if out.exists()):
                    break
                time.sleep(0.002)
        claimed = {}
        for out in outs:
            for line in out.read_text().splitlines():
                record = json.loads(line)
                claimed[record["title"]] = record["claimed"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    latencies = [1000 * (claimed[t] - dropped[t]) for t in dropped if t in claimed]
    shutil.rmtree(root)
    return {"mode": mode, "claimers": claimers, "drops": len(latencies),
            "median_ms": statistics.median(latencies), "p99_ms": pct(latencies, 0.99)}


# -- 4. board --json over 10,000 tasks -------------------------------------------------------------

def board_json(base: Path, tasks: int, repeats: int) -> dict[str, float]:
    ws = base / "ws"
    subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "init", str(ws)], check=True, capture_output=True,
                   cwd=ROOT)
    fill(ws / "kanban", tasks)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "-w", str(ws), "board", "--json"],
                              capture_output=True, cwd=ROOT, check=True)
        times.append(time.perf_counter() - started)
        assert json.loads(done.stdout)["counts"]["todo"] == tasks
    startup = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "--version"], capture_output=True, cwd=ROOT,
                       check=True)
        startup.append(time.perf_counter() - started)
    return {"tasks": tasks, "median_s": statistics.median(times), "max_s": max(times),
            "cli_startup_median_s": statistics.median(startup)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="throughput runs per claimer count")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    tasks = 2000 if args.quick else 10_000
    drops = 20 if args.quick else 100
    base = Path(tempfile.mkdtemp(prefix="hermes-bench-"))
    report: dict[str, object] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count()}
    try:
        # The disk's fsync rate drifts by a factor of several within minutes, so each run is set
        # against the limit measured just before and just after it, and the median of 3 rounds kept.
        rows = []
        for claimers in (1, 4, 8):
            runs = []
            for _round in range(args.rounds):
                before = fsync_limit(base, 1.5)
                row = throughput(base, claimers, tasks)
                after = fsync_limit(base, 1.5)
                row["fsync_limit"] = (before + after) / 2
                row["ratio_to_fsync_limit"] = row["per_second"] / row["fsync_limit"]
                runs.append(row)
            summary = {
                "claimers": claimers, "tasks": tasks, "rounds": runs,
                "median_per_second": statistics.median(r["per_second"] for r in runs),
                "median_fsync_limit": statistics.median(r["fsync_limit"] for r in runs),
                "median_ratio": statistics.median(r["ratio_to_fsync_limit"] for r in runs),
            }
            rows.append(summary)
            ratios = ", ".join(f"{r['ratio_to_fsync_limit']:.0%}" for r in runs)
            print(f"claim+complete, {claimers} claimer(s), {tasks} tasks: median {summary['median_per_second']:,.0f} "
                  f"tasks/s = {summary['median_ratio']:.0%} of the fsync limit (median limit "
                  f"{summary['median_fsync_limit']:,.0f}/s; ratios {ratios})")
        report["throughput"] = rows

        watch = drop_latency(base, "watch", 4, drops)
        poll = drop_latency(base, "poll", 1, max(10, drops // 5))
        report["drop_to_claim"] = [watch, poll]
        print(f"drop-to-claim, 4 waiting claimers (watcher): median {watch['median_ms']:.1f} ms, "
              f"p99 {watch['p99_ms']:.1f} ms over {watch['drops']} drops")
        print(f"drop-to-claim, 1 claimer polling every 1 s (baseline): median {poll['median_ms']:.1f} ms, "
              f"p99 {poll['p99_ms']:.1f} ms over {poll['drops']} drops")
        print(f"  watcher / polling median: {watch['median_ms'] / poll['median_ms']:.3f}")

        bj = board_json(base, tasks, 5)
        report["board_json"] = bj
        print(f"hermes-sup board --json over {tasks} tasks: median {bj['median_s']:.2f} s "
              f"(max {bj['max_s']:.2f} s; CLI start-up alone {bj['cli_startup_median_s']:.2f} s)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"board-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_waiter":
        waiter_main(*sys.argv[2:])
    else:
        main()
