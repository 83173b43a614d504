"""What exited agents and previous supervisors left (supervisor/leftovers.py): the session of an old pid
goes, unless the kernel handed that very pid to the replacement; a start without descriptors goes on."""

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


STARVED_TAKE_OVER = r"""
import errno, json, os, resource, sys
from pathlib import Path
from types import SimpleNamespace
from hermes_sup.supervisor.leftovers import Leftovers

said = []
sup = SimpleNamespace(children={}, held=set(), ws=SimpleNamespace(root=Path(sys.argv[1])), say=said.append)
leftovers = Leftovers(sup)
fillers = []
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    while True:  # every descriptor taken: no scan of /proc can open a thing
        fillers.append(os.open("/dev/null", os.O_RDONLY))
except OSError as exc:
    assert exc.errno == errno.EMFILE, exc
adopted = leftovers.take_over({"agents": {}})
starved = leftovers.sweep_at is not None
for fd in fillers:
    os.close(fd)
leftovers.sweep_strays()  # as the supervisor's loop does once sweep_at is due
print(json.dumps({"adopted": sorted(adopted), "starved": starved, "said": said, "due": leftovers.sweep_at}))
"""


def test_a_supervisor_starting_without_descriptors_goes_on_and_stops_the_leftovers_once_it_can(tmp_path: Path) -> None:
    """The look at start for what a previous supervisor left (take_over) raised when /proc could not be
    read for want of descriptors, and the supervisor exited; it goes on as after an agent's exit: said
    once, and the leftover stopped at the first sweep that can read /proc."""
    import json
    import sys

    from hermes_sup.supervisor.procs import MARKER_ENV, Marker, marker_value, workspace_key

    marker = Marker(workspace_key(tmp_path), "a", "a-previous-supervisors-agent")
    leftover = subprocess.Popen(["sleep", "60"], env={**os.environ, MARKER_ENV: marker_value(marker)})
    try:
        done = subprocess.run([sys.executable, "-c", STARVED_TAKE_OVER, str(tmp_path)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["adopted"] == [] and seen["starved"], seen
        assert leftover.wait(timeout=10) == -signal.SIGKILL, "the sweep that could read /proc stopped it"
        assert seen["due"] is None, seen
        assert [line.split(" (")[0] for line in seen["said"]] == [
            "supervisor: cannot read /proc", "supervisor: reading /proc works again"], seen["said"]
    finally:
        leftover.kill()
        leftover.wait()
