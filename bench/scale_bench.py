"""Issue 32's curve: a team of offline agents draining a backlog as it grows, against the disk, the board and huey."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_huey import huey_rate, huey_version  # noqa: E402
from bench.scale_limits import board_alone, disk_rate, settle, settle_seconds  # noqa: E402
from bench.scale_team import Team  # noqa: E402

DESCRIPTION = """\
Run by hand: `python bench/scale_bench.py [--quick] [--json]`. For every backend (the file board,
PostgreSQL), team size and backlog: `hermes-sup up --detach` on a workspace of offline agents,
the backlog of one-step `steps` tasks (write_file) dropped into kanban/inbox/, and the drain timed
from the first drop to the last task done. In the same run, beside it: the disk's fsync'd
write-and-rename rate (1 process and N processes), the board alone (bench/board_bench.py's and
bench/pg_bench.py's claim+complete with N claimers) and huey 3.5 (SqliteHuey, WAL, a synchronous
commit per task; installed into bench/.venv-huey, never a dependency of hermes-sup) draining the
same number of file-writing tasks with N worker processes. PostgreSQL is a throw-away server of
its own (tests/pgserver.py). Medians over --repeat runs. Everything it starts is stopped and
removed at the end, Ctrl-C included.
"""
FULL_AGENTS = (1, 2, 4, 16, 64, 256)
FULL_BACKLOGS = (200, 2000, 10_000)
QUICK_AGENTS = (1, 4, 16)
QUICK_BACKLOGS = (200,)
BACKENDS = ("file", "pg")


def log(message: str) -> None:
    """Progress goes to stderr, so stdout holds the table or the JSON alone."""
    print(message, file=sys.stderr, flush=True)


def numbers(text: str) -> tuple[int, ...]:
    return tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())


def names(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in chosen if name not in BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {unknown}: choose from {', '.join(BACKENDS)}")
    return chosen


def poll_interval(backlog: int) -> float:
    # The drain's end is read from the tasks themselves; polling only says when to look, so a large
    # backlog is looked at less often (a listing of done/ grows with it).
    return 0.05 if backlog <= 500 else 0.1 if backlog <= 2000 else 0.25


def machine() -> dict[str, Any]:
    """What the figures were measured on: cores, CPU model, the filesystem under the temp dirs."""
    model = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    fstype = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        fstype = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", tempfile.gettempdir()],
                                capture_output=True, text=True, check=False).stdout.strip()
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model, "tmp": tempfile.gettempdir(),
            "tmp_fstype": fstype, "python": sys.version.split()[0]}


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM ends the run as Ctrl-C does, through every cleanup."""
    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def quietly(what: str, action: Callable[[], object]) -> Callable[[], None]:
    """A cleanup that reports its failure and lets the others run."""
    def run() -> None:
        try:
            action()
        except Exception as exc:  # a cleanup must never stop the next one
            log(f"cleanup: {what} failed: {exc}")
    return run


@contextlib.contextmanager
def pg_database(server: Any) -> Iterator[str]:
    """A database of its own for one team on the bench's server; yields its DSN, dropped afterwards."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"scale_{os.urandom(4).hex()}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(server.dsn, dbname=name)
    finally:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Run:
    """One run of the curve: its settings, the temp dir, the PostgreSQL server and every figure."""

    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.stack = stack
        self.base = Path(tempfile.mkdtemp(prefix="hermes-scale-"))
        stack.callback(quietly("removing the temp dir", lambda: shutil.rmtree(self.base, ignore_errors=True)))
        # Each drain, and each peer's, starts after the bench's own deletions have aged (scale_limits).
        self.settle_s = settle_seconds(self.base) if args.settle is None else args.settle
        self.server: Any = None
        self.rows: list[dict[str, Any]] = []  # one per drain of every repeat
        # The peers' rates by repeat, so a drain is set against the peers measured in its own repeat.
        self.huey: dict[tuple[int, int], dict[int, float]] = {}
        self.board: dict[tuple[str, int, int], dict[int, float]] = {}
        self.syscalls: dict[str, dict[str, float]] = {}
        self.errors: list[str] = []  # cells that failed: the curve goes on without them

    def attempt(self, what: str, action: Callable[[], object]) -> None:
        """Run one cell's measurement; a failure is reported and kept, and the next cell runs."""
        try:
            action()
        except Exception as exc:  # any failure of one cell (a stalled drain, a refused connection); Ctrl-C is not one
            self.errors.append(f"{what}: {exc}")
            log(f"FAILED {what}: {exc}")

    def folder(self, name: str) -> Path:
        path = self.base / f"{name}-{time.monotonic_ns()}"
        path.mkdir(parents=True)
        return path

    def start_pg(self) -> str:
        from tests.pgserver import start_server

        log("starting a throw-away PostgreSQL server (tests/pgserver.py)")
        # Each agent holds about two connections, and the board alone one per claimer.
        self.server = start_server(max_connections=max(200, 3 * max(self.args.agents) + 100))
        self.stack.callback(quietly("stopping the PostgreSQL server", self.server.stop))
        import psycopg

        with psycopg.connect(self.server.dsn, autocommit=True) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    def huey_cells(self, rep: int) -> None:
        for agents in self.args.agents:
            for backlog in self.args.backlogs:
                self.attempt(f"[{rep + 1}] huey, {agents} worker(s), {backlog} tasks",
                             functools.partial(self.huey_cell, rep, agents, backlog))

    def huey_cell(self, rep: int, agents: int, backlog: int) -> None:
        settle(self.settle_s)
        row = huey_rate(self.folder("huey"), agents, backlog, poll_interval(backlog))
        self.huey.setdefault((agents, backlog), {})[rep] = row["per_second"]
        log(f"[{rep + 1}] huey, {agents} worker(s), {backlog} tasks: {row['per_second']:,.1f} tasks/s")

    def team_cells(self, rep: int, backend: str, agents: int) -> None:
        with contextlib.ExitStack() as team_stack:
            dsn = team_stack.enter_context(pg_database(self.server)) if backend == "pg" else None
            team = Team(self.folder(f"ws-{backend}-{agents}"), agents, dsn, self.args.fork_server)
            team_stack.callback(quietly(f"down ({backend}, {agents} agents)", team.down))
            up = team.up()
            log(f"[{rep + 1}] {backend}, {agents} agent(s): up --detach {up:.2f} s")
            for backlog in self.args.backlogs:
                self.rows.append(self.drain(rep, backend, team, up, backlog))
            if self.args.syscalls and rep == 0 and agents == self.args.agents[0]:
                self.trace(backend, team)
        for backlog in self.args.backlogs:
            settle(self.settle_s)
            rate = board_alone(backend, agents, backlog, self.folder("board"), self.server.dsn if dsn else None)
            self.board.setdefault((backend, agents, backlog), {})[rep] = rate
            log(f"[{rep + 1}] {backend} board alone, {agents} claimer(s), {backlog} tasks: {rate:,.1f} tasks/s")

    def drain(self, rep: int, backend: str, team: Team, up: float, backlog: int) -> dict[str, Any]:
        seconds = self.args.fsync_seconds
        settle(self.settle_s)
        disk1_before = disk_rate(self.folder("disk"), 1, seconds)
        disk_n = disk_rate(self.folder("disk"), team.agents, seconds)
        settle(self.settle_s)  # the probes' renames freed thousands of inodes
        row = team.drain(f"r{rep}-b{backlog}-", backlog, poll_interval(backlog))
        disk1 = (disk1_before + disk_rate(self.folder("disk"), 1, seconds)) / 2
        log(f"[{rep + 1}] {backend}, {team.agents} agent(s), {backlog} tasks: {row['per_second']:,.1f} tasks/s "
            f"in {row['seconds']:.2f} s (disk {disk1:,.0f}/s, {team.agents} procs {disk_n:,.0f}/s)")
        return {"rep": rep, "backend": backend, "agents": team.agents, "backlog": backlog, "up_s": up,
                "disk_1_per_s": disk1, "disk_n_per_s": disk_n, **row}

    def trace(self, backend: str, team: Team) -> None:
        from bench.scale_strace import syscalls_per_task

        count = self.args.syscall_tasks
        per_task = syscalls_per_task(team, "sys-", count, self.folder("strace") / "strace.out", 0.05)
        self.syscalls[backend] = {"agents": team.agents, "tasks": count, **per_task}
        log(f"{backend}, {team.agents} agent(s), {count} tasks, syscalls per task: "
            + ", ".join(f"{name} {value:.1f}" for name, value in per_task.items()))

    def cells(self) -> list[dict[str, Any]]:
        """Each (backend, agents, backlog): the medians over the repeats, with every ratio taken
        within one repeat first (each drain against the peers measured beside it)."""
        out = []
        for backend in self.args.backends:
            for agents in self.args.agents:
                for backlog in self.args.backlogs:
                    rows = [r for r in self.rows
                            if (r["backend"], r["agents"], r["backlog"]) == (backend, agents, backlog)]
                    if not rows:
                        continue
                    board = self.board.get((backend, agents, backlog), {})
                    huey = self.huey.get((agents, backlog), {})
                    out.append(summary(backend, agents, backlog, rows, board, huey))
        return out


def summary(backend: str, agents: int, backlog: int, rows: list[dict[str, Any]], board: dict[int, float],
            huey: dict[int, float]) -> dict[str, Any]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    def ratios(peers: dict[int, float]) -> float | None:
        pairs = [(r["per_second"], peers[r["rep"]]) for r in rows if r["rep"] in peers]
        return statistics.median(rate / peer for rate, peer in pairs) if pairs else None

    return {"backend": backend, "agents": agents, "backlog": backlog, "repeats": len(rows), "up_s": med("up_s"),
            "drain_s": med("seconds"), "tasks_per_s": med("per_second"),
            "ratio_disk_1": statistics.median(r["per_second"] / r["disk_1_per_s"] for r in rows),
            "ratio_disk_n": statistics.median(r["per_second"] / r["disk_n_per_s"] for r in rows),
            "ratio_board": ratios(board), "ratio_huey": ratios(huey),
            "disk_1_per_s": med("disk_1_per_s"), "disk_n_per_s": med("disk_n_per_s"),
            "board_per_s": statistics.median(board.values()) if board else None,
            "huey_per_s": statistics.median(huey.values()) if huey else None,
            "supervisor_cpu_percent": med("supervisor_cpu_percent"), "agent_uss_mb": med("agent_uss_mb_mean"),
            "agent_uss_mb_max": med("agent_uss_mb_max")}


COLUMNS = (("backend", "{}"), ("agents", "{}"), ("backlog", "{:,}"), ("up s", "{:.1f}"), ("drain s", "{:.1f}"),
           ("tasks/s", "{:,.1f}"), ("/disk 1", "{:.3f}"), ("/disk N", "{:.3f}"), ("/board", "{:.3f}"),
           ("/huey", "{:.3f}"), ("sup CPU %", "{:.1f}"), ("agent USS MB", "{:.1f}"))
KEYS = ("backend", "agents", "backlog", "up_s", "drain_s", "tasks_per_s", "ratio_disk_1", "ratio_disk_n",
        "ratio_board", "ratio_huey", "supervisor_cpu_percent", "agent_uss_mb")


def table(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"machine: {m['nproc']} cores, {m['cpu_model']}, {m['tmp']} on {m['tmp_fstype']}; python {m['python']}; "
             f"huey {report['huey_version']}; PostgreSQL {report.get('pg_version') or '-'}; load "
             f"{report['load_before'][0]:.1f} before, {report['load_after'][0]:.1f} after; "
             f"{report['settings']['repeat']} repeat(s), medians"]
    rows = [[label for label, _ in COLUMNS]]
    for cell in report["cells"]:
        rows.append(["-" if cell[key] is None else fmt.format(cell[key])
                     for key, (_label, fmt) in zip(KEYS, COLUMNS, strict=True)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines += ["  ".join(value.rjust(width) for value, width in zip(row, widths, strict=True)) for row in rows]
    lines.append("peers per cell (tasks/s): " + "; ".join(
        f"{c['backend']} {c['agents']}x{c['backlog']}: disk 1 proc {c['disk_1_per_s']:,.0f}, N procs "
        f"{c['disk_n_per_s']:,.0f}, board alone {fmt_rate(c['board_per_s'])}, huey {fmt_rate(c['huey_per_s'])}"
        for c in report["cells"]))
    for backend, counts in report["syscalls"].items():
        lines.append(f"syscalls per task, {backend}, {counts['agents']} agent(s), {counts['tasks']} tasks: "
                     + ", ".join(f"{name} {counts[name]:.1f}"
                                 for name in ("fsync", "fdatasync", "rename", "openat", "flock")))
    lines += [f"FAILED {error}" for error in report.get("errors", [])]
    return "\n".join(lines)


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=numbers, help="team sizes (default 1,2,4,16,64,256; --quick 1,4,16)")
    parser.add_argument("--backlogs", type=numbers, help="tasks per drain (default 200,2000,10000; --quick 200)")
    parser.add_argument("--backends", type=names, default=BACKENDS, help="file, pg or both (default file,pg)")
    parser.add_argument("--quick", action="store_true", help="a small curve (about 3 minutes) and one repeat")
    parser.add_argument("--repeat", type=int, help="runs of the whole curve, medians kept (default 3; --quick 1)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    parser.add_argument("--syscalls", action="store_true",
                        help="strace -c the smallest team's agents over a small drain, per task")
    parser.add_argument("--syscall-tasks", type=int, default=200, help="tasks of the --syscalls drain")
    parser.add_argument("--fork-server", choices=("on", "off"), help="override hermes.yaml's fork_server (default: on)")
    parser.add_argument("--fsync-seconds", type=float, help="length of each disk-rate probe (default 2; --quick 1)")
    parser.add_argument("--settle", type=float, metavar="SECONDS",
                        help="wait before each drain and peer, after a sync (default: 31 on ext4 without a journal, "
                             "else 0; see bench/scale_limits.settle_seconds)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the JSON is written")
    parser.add_argument("--show", type=Path, metavar="JSON", help="print the table of a report written before; no run")
    args = parser.parse_args(argv)
    args.agents = args.agents or (QUICK_AGENTS if args.quick else FULL_AGENTS)
    args.backlogs = args.backlogs or (QUICK_BACKLOGS if args.quick else FULL_BACKLOGS)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.fsync_seconds = args.fsync_seconds or (1.0 if args.quick else 2.0)
    args.fork_server = None if args.fork_server is None else args.fork_server == "on"
    if args.syscalls and not shutil.which("strace"):
        parser.error("--syscalls needs strace on PATH")
    return args


def measure(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    run = Run(args, stack)
    report: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(),
                              "load_before": os.getloadavg(), "huey_version": huey_version(),
                              "settings": {"agents": args.agents, "backlogs": args.backlogs,
                                           "backends": args.backends, "repeat": args.repeat,
                                           "fork_server": args.fork_server, "fsync_seconds": args.fsync_seconds,
                                           "settle_seconds": run.settle_s}}
    if "pg" in args.backends:
        report["pg_version"] = run.start_pg()
    started = time.monotonic()
    for rep in range(args.repeat):
        run.huey_cells(rep)
        for backend in args.backends:
            for agents in args.agents:
                run.attempt(f"[{rep + 1}] {backend}, {agents} agent(s)",
                            functools.partial(run.team_cells, rep, backend, agents))
    report.update({"load_after": os.getloadavg(), "seconds": time.monotonic() - started, "cells": run.cells(),
                   "syscalls": run.syscalls, "drains": run.rows, "errors": run.errors,
                   "huey": [{"workers": a, "backlog": b, "per_second": list(v.values())}
                            for (a, b), v in run.huey.items()],
                   "board_alone": [{"backend": k, "claimers": a, "backlog": b, "per_second": list(v.values())}
                                   for (k, a, b), v in run.board.items()]})
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.show:
        print(table(json.loads(args.show.read_text())))
        return 0
    with interruptible():
        try:
            with contextlib.ExitStack() as stack:
                try:
                    report = measure(args, stack)
                finally:
                    # A second Ctrl-C (or SIGTERM) must not cut the cleanup short.
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except KeyboardInterrupt:
            log("interrupted: every team is down, the PostgreSQL server stopped, the temp dir removed")
            return 130
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    log(f"written to {path} ({report['seconds']:.0f} s)")
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
