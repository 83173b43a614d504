"""What an exited agent left is swept after its replacement started (supervisor/leftovers.py): the
session of the old pid goes, unless the kernel handed that very pid to the replacement."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

from hermes_sup.supervisor.child import Child
from hermes_sup.supervisor.leftovers import Leftovers


def session_leader() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_the_old_session_goes_but_a_replacement_holding_the_same_pid_stays(tmp_path: Path) -> None:
    replacement, leftover = session_leader(), session_leader()
    child = Child(spec=None, proc=replacement, pidfd=os.pidfd_open(replacement.pid))  # type: ignore[arg-type]
    sup = SimpleNamespace(children={"a": child}, ws=SimpleNamespace(root=tmp_path), say=print)
    try:
        # The replacement runs as the pid its predecessor had: that pid is now its own session.
        Leftovers(sup).kill_leftovers(replacement.pid)  # type: ignore[arg-type]
        assert replacement.poll() is None, "the new agent was killed as its predecessor's leftover"
        Leftovers(sup).kill_leftovers(leftover.pid)  # type: ignore[arg-type]
        assert leftover.wait(timeout=10) == -signal.SIGKILL
    finally:
        for proc in (replacement, leftover):
            proc.kill()
            proc.wait()
        os.close(child.pidfd)  # type: ignore[arg-type]
