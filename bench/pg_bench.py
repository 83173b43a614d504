"""PostgreSQL board benchmarks, run by hand: `python bench/pg_bench.py [--quick]`.

Starts a throw-away server of its own (tests/pgserver.py), then measures, in this one run:
1. The server's own commit limit: a loop of single-row UPDATE commits on one connection, right
   before each throughput round.
2. Claim+complete throughput with 1, 4 and 8 claimer processes (two commits per task, so 0.5 is
   the limit's pace for one claimer), as a ratio to (1), the median of 3 rounds.
3. Add-to-claim latency across hosts (p50, p99): a task added by a process of host A, claimed by
   one of 4 idle claimers of host B in wait_for_work (LISTEN/NOTIFY); beside 4 claimers that poll
   every second, and the file board's drop-to-claim with 4 watching claimers (bench/board_bench.py).
4. Host death: a claimer process holding a task, heartbeating for its host, is SIGKILLed; the time
   until a claimer of another host has the task, against host_timeout.
5. Claim latency (p50, p99) with 100,000 finished tasks and 200,000 dead row versions in the table,
   autovacuum off, against an empty table, with the claim's plan.

These machines are noisy and shared: compare ratios within a run, not absolute numbers across runs.
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
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from hermes_sup.kanban.pg.store import PgStore  # noqa: E402

from bench.claimers import run as run_claimers  # noqa: E402
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


def claimer(schema: str, dsn: str) -> Callable[[], int]:
    """One claimer of the board alone (bench/claimers.py): connected before the clock starts."""
    store = store_for(dsn, schema, f"host-{os.getpid()}")
    store.counts()

    def work() -> int:
        done = 0
        while (doc := store.claim("bench")) is not None:
            store.complete(doc["id"], doc["claim"]["token"], result="ok")
            done += 1
        store.close()
        return done
    return work


def throughput(dsn: str, claimers: int, tasks: int) -> float:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    store = store_for(dsn, schema, "filler", migrate=True)
    for index in range(tasks):
        store.add({"id": f"t{index:06d}", "title": f"task {index}"})
    store.close()  # no connection of the bench's is shared with the forked claimers
    elapsed, _ = run_claimers(claimer, [(schema, dsn)] * claimers)
    store = store_for(dsn, schema, "filler")
    assert store.counts()["done"] == tasks, store.counts()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    store.close()
    return tasks / elapsed


def waiter_main(schema: str, mode: str, out: str, stop_file: str) -> None:
    # Host B: every waiter is a process of its own, on a host other than the adder's.
    store = store_for(os.environ[DSN_ENV], schema, "host-b")
    if mode == "listen":
        store.listener().wait_ready(10)
    Path(out + ".ready").touch()
    seen: list[tuple[str, float]] = []
    while not os.path.exists(stop_file):
        if mode == "listen":
            doc = store.wait_for_work(f"w{os.getpid()}", timeout=0.5)
        else:
            doc = store.claim(f"p{os.getpid()}")
            if doc is None:
                time.sleep(1.0)
        if doc is not None:
            seen.append((doc["id"], time.time()))
            store.complete(doc["id"], doc["claim"]["token"])
    Path(out).write_text(json.dumps(seen))
    store.close()


def latency(dsn: str, mode: str, waiters: int, drops: int) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    store = store_for(dsn, schema, "host-a", migrate=True)
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
    time.sleep(0.5)  # every waiter in its wait
    rng = random.Random(1)
    added: dict[str, float] = {}
    for index in range(drops):
        # At a random moment, so the pollers' 1-second cycle is met at every phase.
        time.sleep(rng.uniform(0.05, 0.25))
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
    shutil.rmtree(tmp, ignore_errors=True)
    return {"p50_ms": pct(delays, 0.5), "p99_ms": pct(delays, 0.99), "claimed": len(delays), "dropped": drops}


def file_latency(drops: int) -> dict[str, float]:
    """The file board's drop-to-claim with 4 claimers watching (bench/board_bench.py's own measure)."""
    from bench.board_bench import drop_latency

    base = Path(tempfile.mkdtemp(prefix="hermes-bench-"))
    try:
        row = drop_latency(base, "watch", 4, drops)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"p50_ms": row["median_ms"], "p99_ms": row["p99_ms"], "claimed": row["drops"], "dropped": drops}


# -- host death -------------------------------------------------------------------------------------

def victim_main(schema: str, host: str, host_timeout: str, held_file: str) -> None:
    """Claims the one task, heartbeating for its host as a supervisor would, and holds it until killed."""
    store = PgStore(os.environ[DSN_ENV], schema=schema, host=host, boot_id="bench", migrate_schema=False,
                    host_timeout=float(host_timeout))
    store.start_heartbeat()
    doc = store.claim("victim")
    assert doc is not None, "the victim found no task"
    Path(held_file).write_text(doc["id"])
    threading.Event().wait()


def survivor_main(schema: str, host: str, host_timeout: str, out: str) -> None:
    """Another host's claimer, waiting for work (and recovering dead claims) as an agent does."""
    store = PgStore(os.environ[DSN_ENV], schema=schema, host=host, boot_id="bench", migrate_schema=False,
                    host_timeout=float(host_timeout))
    store.start_heartbeat()
    store.listener().wait_ready(10)
    Path(out + ".ready").touch()
    doc = store.wait_for_work("survivor", timeout=10 * float(host_timeout) + 30)
    if doc is not None:
        at = time.time()
        # Renamed into place: the bench reads it as soon as it exists.
        Path(out + ".tmp").write_text(json.dumps({"task": doc["id"], "at": at}))
        os.replace(out + ".tmp", out)
    store.close()


def wait_for_file(path: Path, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.01)


def host_death(dsn: str, host_timeout: float, trials: int) -> dict[str, object]:
    """Seconds from the SIGKILL of a host's claimer (heartbeat and all) to another host's claim."""
    env = {**os.environ, DSN_ENV: dsn}
    rng = random.Random(2)
    times: list[float] = []
    for trial in range(trials):
        schema = f"bench_{uuid.uuid4().hex[:8]}"  # a schema each, so no sweeper lease is left over
        store = store_for(dsn, schema, "host-adder", migrate=True)
        store.add({"id": "held", "title": "held by a host that dies"})
        tmp = Path(tempfile.mkdtemp())
        victim = subprocess.Popen([sys.executable, __file__, "--victim", schema, f"dead-{trial}", str(host_timeout),
                                   str(tmp / "held")], env=env)
        survivor: subprocess.Popen[bytes] | None = None
        try:
            wait_for_file(tmp / "held", "the victim's claim")
            # Started after the claim, so the task can only reach it through the dead host's recovery.
            survivor = subprocess.Popen([sys.executable, __file__, "--survivor", schema, "alive", str(host_timeout),
                                         str(tmp / "got")], env=env)
            wait_for_file(Path(str(tmp / "got") + ".ready"), "the survivor's start")
            time.sleep(rng.uniform(0, host_timeout / 6))  # a kill at any phase of the heartbeat
            killed = time.time()
            victim.kill()
            victim.wait()
            wait_for_file(tmp / "got", "the survivor's claim", timeout=10 * host_timeout + 30)
            got = json.loads((tmp / "got").read_text())
            assert got["task"] == "held", got
            times.append(got["at"] - killed)
            survivor.wait(timeout=30)
        finally:
            for proc in (victim, survivor):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            store.close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            shutil.rmtree(tmp, ignore_errors=True)
    return {"host_timeout_s": host_timeout, "trials": trials, "median_s": statistics.median(times),
            "min_s": min(times), "max_s": max(times)}


# -- claims over a table full of history -------------------------------------------------------------

PICK = """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
    SELECT t.id FROM tasks t WHERE t.status = 'todo' AND t.assignee IS NULL AND t.role IS NULL
    ORDER BY t.priority DESC, t.created, t.id LIMIT 1 FOR UPDATE OF t SKIP LOCKED"""


def fill_history(dsn: str, schema: str, finished: int) -> None:
    """`finished` done tasks, the row versions of their todo and doing days left dead (autovacuum off)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("ALTER TABLE tasks SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)")
        conn.execute("""INSERT INTO tasks (id, status, max_attempts, created, document)
            SELECT 'old-' || g, 'todo', 3, now() - interval '1 day' + g * interval '1 ms',
                   jsonb_build_object('title', 'old task ' || g, 'history', '[]'::jsonb)
            FROM generate_series(1, %s) g""", (finished,))
        # As claims and completions would leave them: every task once in doing, then done, with no
        # VACUUM in between, so the claimable index still points at 100,000 dead todo versions.
        conn.execute("UPDATE tasks SET status = 'doing', attempts = 1, claims = 1 WHERE id LIKE 'old-%'")
        conn.execute("""UPDATE tasks SET status = 'done',
            document = document || '{"result": "ok"}'::jsonb WHERE id LIKE 'old-%'""")


def claim_times(dsn: str, schema: str, todo: int, prefix: str) -> list[float]:
    """Milliseconds of each claim of `todo` new tasks, one claimer, each completed before the next."""
    store = store_for(dsn, schema, "host-a")
    for index in range(todo):
        store.add({"id": f"{prefix}-{index:05d}", "title": "new task"})
    times = []
    for _claim in range(todo):
        started = time.perf_counter()
        doc = store.claim("bench")
        times.append((time.perf_counter() - started) * 1000)
        assert doc is not None and doc["id"].startswith(prefix), doc
        store.complete(doc["id"], doc["claim"]["token"], result="ok")
    store.close()
    return times


def plan_of(dsn: str, schema: str) -> dict[str, object]:
    """The pick's plan on the table as the claims left it: which index, how many buffers."""
    with psycopg.connect(dsn) as conn:  # a transaction, rolled back: the probe and its row lock are not kept
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("INSERT INTO tasks (id, status, max_attempts, document) VALUES ('probe', 'todo', 1, '{}')")
        plan = conn.execute(PICK).fetchone()[0][0]
        conn.rollback()
    nodes, node = [], plan["Plan"]
    while node:
        nodes.append(node["Node Type"] + (f" on {node['Index Name']}" if node.get("Index Name") else ""))
        node = (node.get("Plans") or [None])[0]
    return {"nodes": " > ".join(nodes), "ms": plan["Execution Time"],
            "buffers": plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)}


def table_stats(dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute("""SELECT n_live_tup, n_dead_tup, autovacuum_count + vacuum_count
            FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'tasks'""", (schema,)).fetchone()
    return {"live": row[0], "dead": row[1], "vacuums": row[2]}


def history_claims(dsn: str, finished: int, todo: int) -> dict[str, dict[str, object]]:
    """The same claims on an empty table, on one with `finished` done tasks and their dead row
    versions (no VACUUM, no ANALYZE: autovacuum off), and on that table after a VACUUM ANALYZE."""
    results: dict[str, dict[str, object]] = {}
    history = f"bench_{uuid.uuid4().hex[:8]}"
    store_for(dsn, history, "host-a", migrate=True).close()
    fill_history(dsn, history, finished)
    for label, schema in (("empty", f"bench_{uuid.uuid4().hex[:8]}"), ("dead", history), ("vacuumed", history)):
        if label == "empty":
            store_for(dsn, schema, "host-a", migrate=True).close()
        if label == "vacuumed":
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'VACUUM ANALYZE "{schema}".tasks')
        table = table_stats(dsn, schema)
        times = claim_times(dsn, schema, todo, label)
        results[label] = {"p50_ms": pct(times, 0.5), "p99_ms": pct(times, 0.99), "first_ms": times[0],
                          "claims": len(times), **table, "plan": plan_of(dsn, schema)}
        if label == "empty":
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{history}" CASCADE')
    return results


# -- the run ----------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer tasks, drops and trials: a check that it runs")
    parser.add_argument("--host-timeout", type=float, default=5.0, help="host_timeout of the host-death trials")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--waiter", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--victim", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--survivor", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for role, run in (("waiter", waiter_main), ("victim", victim_main),
                      ("survivor", survivor_main)):
        if getattr(args, role):
            run(*getattr(args, role))
            return
    tasks, drops, rounds, trials, finished, todo = ((300, 30, 1, 2, 20_000, 200) if args.quick
                                                    else (2000, 200, 3, 5, 100_000, 1000))
    report: dict[str, object] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                                 "load_before": os.getloadavg()}
    server = start_server()
    try:
        dsn = server.dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            report["server"] = conn.execute("SHOW server_version").fetchone()[0]
        # The disk is shared and its fsync rate drifts by 10x within minutes here: every round is
        # set against the commit limit measured right before it.
        for claimers in (1, 4, 8):
            limits, rates = [], []
            for _round in range(rounds):
                limits.append(commit_limit(dsn, 2.0))
                rates.append(throughput(dsn, claimers, tasks))
            report[f"claim_complete_{claimers}"] = {
                "tasks": tasks, "tasks_per_s": statistics.median(rates),
                "commit_limit_per_s": statistics.median(limits),
                "ratio_to_limit": statistics.median(r / lim for r, lim in zip(rates, limits, strict=True)),
                "ratios": [r / lim for r, lim in zip(rates, limits, strict=True)]}
        report["latency_listen"] = latency(dsn, "listen", 4, drops)
        report["latency_poll_1s"] = latency(dsn, "poll", 4, drops)
        report["latency_file_board"] = file_latency(max(20, drops // 2))
        report["host_death"] = host_death(dsn, args.host_timeout, trials)
        report["history_claims"] = history_claims(dsn, finished, todo)
    finally:
        server.stop()
    report["load_after"] = os.getloadavg()
    print_table(report)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"pg-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")


def print_table(report: dict[str, Any]) -> None:
    rows: list[tuple[str, str]] = []
    for claimers in (1, 4, 8):
        row = report[f"claim_complete_{claimers}"]
        rounds = ", ".join(f"{r:.0%}" for r in row["ratios"])
        rows.append((f"claim+complete, {claimers} claimer(s), {row['tasks']} tasks",
                     f"{row['tasks_per_s']:,.0f} tasks/s = {row['ratio_to_limit']:.0%} of the commit limit "
                     f"({row['commit_limit_per_s']:,.0f}/s; rounds {rounds})"))
    for key, label in (("latency_listen", "add on host A -> claim on host B, 4 claimers in wait_for_work"),
                       ("latency_poll_1s", "the same, 4 claimers polling every 1 s"),
                       ("latency_file_board", "file board: drop -> claim, 4 claimers watching")):
        row = report[key]
        rows.append((label, f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms "
                            f"({row['claimed']} of {row['dropped']} claimed)"))
    death = report["host_death"]
    rows.append((f"host SIGKILLed -> its task claimed on another host (host_timeout {death['host_timeout_s']:g} s)",
                 f"median {death['median_s']:.1f} s, {death['min_s']:.1f} to {death['max_s']:.1f} s over "
                 f"{death['trials']} trials = {death['median_s'] / death['host_timeout_s']:.2f}x host_timeout"))
    for label, row in report["history_claims"].items():
        table = f"{row['live']:,} live, {row['dead']:,} dead rows, {row['vacuums']} vacuums"
        rows.append((f"claim, {row['claims']} todo, table {label}: {table}",
                     f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, first {row['first_ms']:.1f} ms; "
                     f"plan {row['plan']['nodes']}, {row['plan']['buffers']} buffers, {row['plan']['ms']:.2f} ms"))
    width = max(len(label) for label, _ in rows)
    print(f"PostgreSQL {report['server']}, {report['cpus']} CPUs, load {report['load_before'][0]:.1f} before, "
          f"{report['load_after'][0]:.1f} after")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
