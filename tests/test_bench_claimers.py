"""bench/claimers.py, the board-alone peers' claimers: however a measurement ends, none is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.claimers import run

from .conftest import ROOT, gone, wait_until


def _pids(folder: Path) -> list[int]:
    return [int(p.name) for p in folder.iterdir()]


def _prepare(folder: str, index: int, mode: str) -> Callable[[], int]:
    Path(folder, str(os.getpid())).touch()
    if index == 0 and mode == "fail":
        raise ValueError("no board here")
    if index == 0 and mode == "stall":
        time.sleep(3600)
    return lambda: index


def test_claimers_are_released_together_and_their_results_gathered(tmp_path: Path) -> None:
    elapsed, results = run(_prepare, [(str(tmp_path), n, "ok") for n in range(4)])
    assert sorted(results) == [0, 1, 2, 3] and elapsed >= 0
    pids = _pids(tmp_path)
    assert len(pids) == 4 and all(gone(pid) for pid in pids)


@pytest.mark.parametrize("mode, says", [("fail", "ValueError: no board here"), ("stall", "only 3 of 4 claimers")])
def test_a_claimer_that_fails_or_stalls_ends_the_measurement_and_none_is_left(tmp_path: Path, mode: str,
                                                                              says: str) -> None:
    with pytest.raises(RuntimeError, match=says):
        run(_prepare, [(str(tmp_path), n, mode) for n in range(4)], stall=1.0)
    pids = _pids(tmp_path)
    assert len(pids) == 4 and all(gone(pid) for pid in pids), pids


def test_claimers_die_with_a_killed_bench(tmp_path: Path) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from tests.test_bench_claimers import _prepare; "
            "from bench.claimers import run; run(_prepare, [(sys.argv[2], n, 'stall') for n in range(3)])")
    bench = subprocess.Popen([sys.executable, "-c", code, str(ROOT), str(tmp_path)], cwd=ROOT)
    try:
        wait_until(lambda: len(_pids(tmp_path)) == 3, timeout=30)
    finally:
        bench.send_signal(signal.SIGKILL)
        bench.wait(timeout=30)
    pids = _pids(tmp_path)
    wait_until(lambda: all(gone(pid) for pid in pids), timeout=10)
