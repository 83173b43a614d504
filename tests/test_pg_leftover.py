"""A test run SIGKILLed while the suite's throw-away PostgreSQL server runs leaves no server behind
(tests/pgreaper.py stops it once the run is gone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, wait_until
from .pgserver import SKIP_ENV

INNER = '''
import os
import time
from pathlib import Path

from tests.pgserver import pg_server  # noqa: F401 - the fixture


def test_hold(pg_server):  # noqa: F811
    Path(os.environ["PG_MARK"]).write_text(str(pg_server.data))
    time.sleep(300)
'''


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is no server: it runs nothing, and whoever reaps it is not this test.
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(os.environ.get(SKIP_ENV, "").lower() == "skip", reason=f"{SKIP_ENV}=skip")
def test_a_sigkilled_test_run_leaves_no_postgresql_behind(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    mark = tmp_path / "mark"
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                           cwd=ROOT, env={**os.environ, "PG_MARK": str(mark)}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: mark.exists() and mark.read_text(), timeout=90)
        data = Path(mark.read_text())
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        assert alive(postmaster)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    wait_until(lambda: not alive(postmaster), timeout=30)
    wait_until(lambda: not data.parent.exists(), timeout=10)
