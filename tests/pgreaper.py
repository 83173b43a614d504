"""Stops the suite's throw-away PostgreSQL server when the test run that started it is gone, however
it went (a SIGKILLed or SIGTERMed pytest runs no finalizer): run as `python pgreaper.py BASE` with
its standard input the read end of a pipe only the test run holds open; end of file means the run
has ended, and the server's postmaster (BASE/data/postmaster.pid) is stopped as `pg_ctl -m
immediate` stops it (SIGQUIT, then SIGKILL), and BASE removed."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path


def postmaster(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def gone(pid: int) -> bool:
    """Whether `pid` runs no more: exited, or a zombie that whoever adopted it has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def main() -> None:
    base = Path(sys.argv[1])
    while sys.stdin.buffer.read(65536):  # nothing is ever written: this returns at the run's end
        pass
    pid = postmaster(base / "data")
    if pid is not None and pid > 1:
        for sig, wait in ((signal.SIGQUIT, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while not gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if gone(pid):
                break
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
