"""Ctrl-C and SIGTERM end a command that follows something (`logs -f`, `events -f`, `board --watch`,
...) as KeyboardInterrupt, whatever its parent left them as."""

from __future__ import annotations

import signal


def interruptible() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread. A command started by a shell in
    the background (`cmd &`, a script's job) has SIGINT ignored from its start, and Python then
    leaves it so: its Ctrl-C, or a test's, would not end it."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
