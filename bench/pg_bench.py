"""PostgreSQL board benchmarks, run by hand: `python bench/pg_bench.py [--quick]`.

Starts a throw-away server of its own (tests/pgserver.py), then measures, in this one run:
1. The server's own commit limit: a loop of single-row UPDATE commits on one connection, right
   before each throughput round.
2. Claim+complete throughput with 1 and 4 claimer processes (two commits per task, so 0.5 is the
   limit's pace for one claimer), as a ratio to (1), the median of 3 rounds.
3. Add-to-claim latency (p50, p99) with 4 idle claimers in wait_for_work (LISTEN/NOTIFY), against
   4 claimers that poll every second.

These machines are noisy and shared: compare ratios within a run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from hermes_sup.kanban.pg.store import PgStore  # noqa: E402

from tests.pgserver import start_server  # noqa: E402

DSN_ENV = "HERMES_SUP_BENCH_PG_DSN"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def commit_limit(dsn: str, seconds: float) -> float:
    """Single-row commits per second on one connection: the floor every claim pays."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_counter (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("INSERT INTO bench_counter VALUES (1, 0) ON CONFLICT DO NOTHING")
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.execute("UPDATE bench_counter SET n = n + 1 WHERE id = 1")
            count += 1
        return count / (time.perf_counter() - start)


def store_for(dsn: str, schema: str, host: str, migrate: bool = False) -> PgStore:
    return PgStore(dsn, schema=schema, host=host, boot_id="bench", migrate_schema=migrate)


def claimer_main(schema: str, go_file: str) -> None:
    store = store_for(os.environ[DSN_ENV], schema, f"host-{os.getpid()}")
    while not os.path.exists(go_file):
        time.sleep(0.005)
    while (doc := store.claim("bench")) is not None:
        store.complete(doc["id"], doc["claim"]["token"], result="ok")
    store.close()


def throughput(dsn: str, claimers: int, tasks: int) -> float:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    store = store_for(dsn, schema, "filler", migrate=True)
    for index in range(tasks):
        store.add({"id": f"t{index:06d}", "title": f"task {index}"})
    go = Path(tempfile.mkdtemp()) / "go"
    env = {**os.environ, DSN_ENV: dsn}
    procs = [subprocess.Popen([sys.executable, __file__, "--claimer", schema, str(go)], env=env)
             for _ in range(claimers)]
    time.sleep(1.0)  # let every claimer connect before the clock starts
    start = time.perf_counter()
    go.touch()
    for proc in procs:
        proc.wait()
    elapsed = time.perf_counter() - start
    assert store.counts()["done"] == tasks, store.counts()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    store.close()
    return tasks / elapsed


def waiter_main(schema: str, mode: str, out: str, stop_file: str) -> None:
    store = store_for(os.environ[DSN_ENV], schema, f"host-{os.getpid()}")
    if mode == "listen":
        store.listener().wait_ready(10)
    Path(out + ".ready").touch()
    seen: list[tuple[str, float]] = []
    while not os.path.exists(stop_file):
        if mode == "listen":
            doc = store.wait_for_work("bench", timeout=0.5)
        else:
            doc = store.claim("bench")
            if doc is None:
                time.sleep(1.0)
        if doc is not None:
            seen.append((doc["id"], time.time()))
            store.complete(doc["id"], doc["claim"]["token"])
    Path(out).write_text(json.dumps(seen))
    store.close()


def latency(dsn: str, mode: str, waiters: int, drops: int) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    store = store_for(dsn, schema, "adder", migrate=True)
    tmp = Path(tempfile.mkdtemp())
    stop = tmp / "stop"
    env = {**os.environ, DSN_ENV: dsn}
    outs = [tmp / f"w{i}.json" for i in range(waiters)]
    procs = [subprocess.Popen([sys.executable, __file__, "--waiter", schema, mode, str(out), str(stop)], env=env)
             for out in outs]
    deadline = time.monotonic() + 60
    while not all(Path(str(out) + ".ready").exists() for out in outs):
        if time.monotonic() > deadline:
            raise SystemExit("waiters did not start")
        time.sleep(0.05)
    added: dict[str, float] = {}
    for index in range(drops):
        time.sleep(random.uniform(0.05, 0.25))
        task_id = f"d{index:05d}"
        added[task_id] = time.time()
        store.add({"id": task_id, "title": "drop"})
    deadline = time.monotonic() + 30
    while store.counts()["done"] < drops and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.touch()
    for proc in procs:
        proc.wait()
    claimed = {task: at for out in outs for task, at in json.loads(out.read_text())}
    delays = [(claimed[task] - at) * 1000 for task, at in added.items() if task in claimed]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    store.close()
    return {"p50_ms": round(pct(delays, 0.5), 2), "p99_ms": round(pct(delays, 0.99), 2),
            "claimed": len(delays), "dropped": drops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tasks and drops")
    parser.add_argument("--claimer", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--waiter", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.claimer:
        claimer_main(*args.claimer)
        return
    if args.waiter:
        waiter_main(*args.waiter)
        return
    tasks, drops, rounds = (500, 30, 1) if args.quick else (2000, 100, 3)
    server = start_server()
    try:
        dsn = server.dsn
        # The disk is shared and its fsync rate drifts by 10x within minutes here: every round is
        # set against the commit limit measured right before it.
        results: dict[str, object] = {}
        for claimers in (1, 4):
            limits, rates = [], []
            for _round in range(rounds):
                limits.append(commit_limit(dsn, 2.0))
                rates.append(throughput(dsn, claimers, tasks))
            results[f"claim_complete_{claimers}"] = {
                "tasks_per_s": round(statistics.median(rates)),
                "commit_limit_per_s": round(statistics.median(limits)),
                "ratio_to_limit": round(statistics.median(r / lim for r, lim in zip(rates, limits, strict=True)), 3)}
        results["latency_listen"] = latency(dsn, "listen", 4, drops)
        results["latency_poll_1s"] = latency(dsn, "poll", 4, drops)
        print(json.dumps(results, indent=2))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
