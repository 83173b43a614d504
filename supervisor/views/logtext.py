"""Agents' log lines as terminal text: a colour per agent (at a terminal, not under NO_COLOR), each line shown
literally without the name it repeats, and the time it was stamped."""

from __future__ import annotations

import calendar
import os
import re
import time
import zlib
from typing import Any

from .render import visible

AGENT_COLOURS = ("cyan", "yellow", "green", "magenta", "blue",
                 "bright_cyan", "bright_yellow", "bright_green", "bright_magenta", "bright_blue")
_STAMPED = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) (.*)", re.DOTALL)


def colour_wanted(stream: Any) -> bool:
    """Whether to colour what goes to `stream`: a terminal, unless NO_COLOR is set (no-color.org) or the
    terminal is dumb; what is piped or written to a file stays plain."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed, or no file at all
        return False
    return bool(tty) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def agent_colour(name: str) -> str:
    """The colour of an agent's prefix: the same for the same name, in every command (pure)."""
    return AGENT_COLOURS[zlib.crc32(name.encode("utf-8", "replace")) % len(AGENT_COLOURS)]


def log_text(name: str, line: str) -> str:
    """An agent's log line as `logs` and `up` show it after its name: the agent's own "NAME: " after
    the time is dropped (the prefix says it), controls made visible, on one line (pure)."""
    found = _STAMPED.fullmatch(line)
    if found and found.group(2).startswith(f"{name}: "):
        line = f"{found.group(1)} {found.group(2)[len(name) + 2:]}"
    return visible(line, one_line=True)


def line_time(line: str) -> float | None:
    """The time (epoch seconds) an agent wrote a stamped log line; None for a line without one (a
    traceback, a line from before stamps) (pure)."""
    found = _STAMPED.match(line)
    if not found:
        return None
    return float(calendar.timegm(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%SZ")))
