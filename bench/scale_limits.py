"""The peers a team's drain is set against: the disk's fsync'd-rename rate and the board alone."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.board_bench import fsync_limit  # noqa: E402
from bench.board_bench import throughput as file_throughput  # noqa: E402

START_TIMEOUT = 120.0


def settle_seconds(folder: Path) -> float:
    """How long to wait before a drain on `folder`'s filesystem, from /proc and /sys: 31 s on
    ext4 without a journal, else 0. There the inode allocator passes over every inode freed in the
    last 30 s (once written back) reading each as it goes, so what the bench itself deleted just
    before (the last cell's files, the disk probe's renames, thousands) made each file the next drain
    created cost up to ten times more: measured, 12-13 ms of the agents' CPU a task right after a
    cell, 8.4-8.9 ms after a quiet minute. The drain's own deletions still count, as they should."""
    try:
        dev = os.stat(folder).st_dev
        name = Path(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")).name
    except OSError:
        return 0.0
    if not Path(f"/proc/fs/ext4/{name}").is_dir():
        return 0.0
    journaled = any(entry.startswith(f"{name}-") for entry in _listdir("/proc/fs/jbd2"))
    return 0.0 if journaled else 31.0


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def settle(seconds: float) -> None:
    """Write back what is dirty, then wait `seconds` (settle_seconds) for recently freed inodes to age."""
    if seconds > 0:
        os.sync()
        time.sleep(seconds)


def disk_rate(folder: Path, procs: int, seconds: float) -> float:
    """fsync'd write-and-rename of a small JSON file per second, summed over `procs` processes
    started together, each on a file of its own in `folder` (board_bench's measure, N at once)."""
    folder.mkdir(parents=True, exist_ok=True)
    if procs == 1:
        return fsync_limit(folder, seconds)
    # Forked, not exec'd: 256 fresh interpreters importing the board would take half a minute of
    # this machine's two cores before each probe.
    ctx = multiprocessing.get_context("fork")
    ready, go, rates = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_fsync_child, args=(folder / f"p{n}", ready, go, rates, seconds))
                for n in range(procs)]
    try:
        for child in children:
            child.start()
        for _ in children:
            if not ready.acquire(timeout=START_TIMEOUT):
                raise RuntimeError(f"the {procs} fsync processes did not start")
        go.set()
        total = sum(rates.get(timeout=seconds + START_TIMEOUT) for _ in children)
        for child in children:
            child.join(timeout=START_TIMEOUT)
        return total
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join()


def _fsync_child(folder: Path, ready: Any, go: Any, rates: Any, seconds: float) -> None:
    """One of disk_rate's processes: ready, wait for go, then write-and-rename for `seconds`."""
    folder.mkdir(parents=True, exist_ok=True)
    ready.release()
    go.wait()
    rates.put(fsync_limit(folder, seconds))


def board_alone(backend: str, claimers: int, tasks: int, base: Path, dsn: str | None) -> float:
    """Claim+complete tasks per second of `claimers` processes on a board of `tasks` tasks, with no
    supervisor and no agent runtime: bench/board_bench.py's and bench/pg_bench.py's own runs."""
    if backend == "file":
        base.mkdir(parents=True, exist_ok=True)
        return file_throughput(base, claimers, tasks)["per_second"]
    from bench.pg_bench import throughput as pg_throughput  # psycopg only where PostgreSQL is measured

    assert dsn is not None, "the pg backend needs the server's DSN"
    return pg_throughput(dsn, claimers, tasks)
