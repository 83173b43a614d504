"""The peers a team's drain is set against: the disk's fsync'd-rename rate and the board alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.board_bench import fsync_limit  # noqa: E402
from bench.board_bench import throughput as file_throughput  # noqa: E402

START_TIMEOUT = 120.0


def disk_rate(folder: Path, procs: int, seconds: float) -> float:
    """fsync'd write-and-rename of a small JSON file per second, summed over `procs` processes
    started together, each on a file of its own in `folder` (board_bench's measure, N at once)."""
    folder.mkdir(parents=True, exist_ok=True)
    if procs == 1:
        return fsync_limit(folder, seconds)
    go = folder / "go"
    go.unlink(missing_ok=True)
    outs = [folder / f"rate-{n}.json" for n in range(procs)]
    children = [subprocess.Popen([sys.executable, __file__, "_fsync", str(folder / f"p{n}"), str(go), str(out),
                                  str(seconds)]) for n, out in enumerate(outs)]
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not all(Path(f"{out}.ready").exists() for out in outs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {procs} fsync processes did not start")
            time.sleep(0.01)
        go.touch()
        for child in children:
            child.wait(timeout=seconds + START_TIMEOUT)
        return sum(json.loads(out.read_text())["per_second"] for out in outs)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for out in outs:
            out.unlink(missing_ok=True)
            Path(f"{out}.ready").unlink(missing_ok=True)


def _fsync_main(folder: str, go: str, out: str, seconds: str) -> None:
    """One of disk_rate's processes: ready, wait for go, then write-and-rename for `seconds`."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(f"{out}.ready").touch()
    while not os.path.exists(go):
        time.sleep(0.001)
    rate = fsync_limit(Path(folder), float(seconds))
    Path(out).write_text(json.dumps({"per_second": rate}))


def board_alone(backend: str, claimers: int, tasks: int, base: Path, dsn: str | None) -> float:
    """Claim+complete tasks per second of `claimers` processes on a board of `tasks` tasks, with no
    supervisor and no agent runtime: bench/board_bench.py's and bench/pg_bench.py's own runs."""
    if backend == "file":
        base.mkdir(parents=True, exist_ok=True)
        return file_throughput(base, claimers, tasks)["per_second"]
    from bench.pg_bench import throughput as pg_throughput  # psycopg only where PostgreSQL is measured

    assert dsn is not None, "the pg backend needs the server's DSN"
    return pg_throughput(dsn, claimers, tasks)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "_fsync":
    _fsync_main(*sys.argv[2:])
