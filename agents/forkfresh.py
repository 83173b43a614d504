"""What a Python reads once, at its start or an import, read again in a forked agent from its own environment."""

from __future__ import annotations

import ctypes
import socket
import sys
import tempfile
import time

from ..kanban import liveness

# The SDKs' log switches ($OPENAI_LOG, $ANTHROPIC_LOG), read when the SDK is imported: in the server,
# whose environment holds neither.
SDK_LOGS = ("openai._utils._logs", "anthropic._utils._logs")
_PR_SET_DUMPABLE = 4


def dumpable() -> None:
    """Be dumpable again, as exec makes a process: the fork server is not (no process of the user may
    ptrace it or write its memory, which every later agent copies), and its children inherit that;
    an undumpable agent's /proc files are root's, so its marker could not be read."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


def refresh() -> None:
    """Make what the server read once this agent's own: the time zone ($TZ), the temporary folder
    ($TMPDIR), the host name and the SDKs' log switches. (`random` needs nothing: Python reseeds it in
    every child of os.fork.) Run after sys.stderr is the agent's log, where an SDK's log handler writes."""
    time.tzset()
    tempfile.tempdir = None  # tempfile keeps the folder it found first
    liveness.HOST = socket.gethostname()
    for name in SDK_LOGS:
        module = sys.modules.get(name)
        if module is not None:
            module.setup_logging()
