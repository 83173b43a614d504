"""`logs [AGENT] [-f] [-n N] [--since DURATION|TIME]`: the agents' logs, compose style.

Registered on the command line's group when cli.py imports this module (at its end).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import stat
import sys
import time
from pathlib import Path

import click
from rich.text import Text

from ...kanban.events import EventTail
from ...kanban.fsio import read_complete_lines
from ..config.workspace import load_config
from ..ingestwarn import recent_rejections, rejections
from ..interrupt import interruptible
from ..spec import build_specs
from ..views import logtext, render
from .common import Failure, command, err, handled, is_regular, literal, workspace_of

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
BOARD = "board"  # the name the board's rejections go under in `logs` without AGENT
_EVENT_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def event_stamp(at: object, now: float) -> str:
    """An event's time (`at`, as the board writes it) as a log line's stamp; `now` for one that is
    not a time (anyone who can write the log can write it) (pure given `now`)."""
    found = _EVENT_AT.match(at) if isinstance(at, str) else None
    return f"{found.group()}Z" if found else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def rejection_lines(records: list[dict[str, object]], now: float) -> list[str]:
    """The stamped lines `logs` shows for the board's rejection events among `records` (pure given `now`)."""
    return [f"{event_stamp(record.get('at'), now)} {line}" for record in records for line in rejections([record])]


def parse_since(text: str, now: float) -> float:
    """The epoch time `--since` names: a duration back from `now` (90s, 10m, 2h, 1d) or an ISO time
    (2026-11-22T17:00:00Z, with an offset, or without one: local time) (pure given `now`)."""
    value = text.strip()
    found = _DURATION.fullmatch(value)
    if found:
        return now - float(found.group(1)) * _UNIT[found.group(2)]
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since wants a duration (30s, 10m, 2h, 1d) or an ISO time "
                         f"(2026-11-22T17:00:00Z), not {value!r}") from None
    return when.timestamp()  # a naive time is the local time, as a person types it


class SinceFilter:
    """Which lines of one log are at or after `since`: a stamped line by its time, an unstamped one
    (a traceback) with the line before it; lines before the first stamp are of no known time and left
    out (pure)."""

    def __init__(self, since: float | None) -> None:
        self.since = since
        self.keeping = since is None

    def keep(self, line: str) -> bool:
        if self.since is None:
            return True
        written = logtext.line_time(line)
        if written is not None:
            self.keeping = written >= self.since
        return self.keeping


TAIL_BLOCK = 1 << 16


def last_lines(path: Path, count: int | None) -> tuple[list[bytes], int] | None:
    """The last `count` lines of a log (all with None) and its size, read backwards from its end (a
    log can be large); None if it is not there. A FIFO or a device in its place (/dev/zero never
    ends) is refused without reading it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Failure(f"{path} is not a regular file; not reading it")
        data, start = b"", info.st_size
        while start > 0 and (count is None or data.count(b"\n") <= count):
            step = min(TAIL_BLOCK, start)
            start -= step
            handle.seek(start)
            data = handle.read(step) + data
    lines = data.splitlines()
    return (lines if count is None else lines[-count:] if count else []), info.st_size


class Printer:
    """Prints agents' log lines, one output line each (never wrapped: click writes them whole), the
    name coloured per agent at a terminal (not under NO_COLOR) and plain when piped or written to a file."""

    def __init__(self, names: list[str], since: float | None) -> None:
        self.width = max((len(name) for name in names), default=0)
        self.colour = logtext.colour_wanted(sys.stdout)
        self.filters = {name: SinceFilter(since) for name in names}

    def print(self, name: str, raw: bytes | str) -> None:
        line = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        if not self.filters[name].keep(line):
            return
        prefix = render.visible(f"{name:<{self.width}}")
        if self.colour:
            prefix = click.style(prefix, fg=logtext.agent_colour(name))
        click.echo(f"{prefix} | {logtext.log_text(name, line)}")


@command()
@click.argument("agent", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C stops).")
@click.option("-n", "lines", type=click.IntRange(0, 10**9), default=20, show_default=True,
              help="Lines of each log (with --since and no -n: all since then).")
@click.option("--since", metavar="DURATION|TIME", help="Only lines written at or after it: 10m, 2h, 1d, an ISO time.")
@click.pass_context
@handled
def logs(ctx: click.Context, agent: str | None, follow: bool, lines: int, since: str | None) -> None:
    """The agents' logs (or one agent's), prefixed by name, each line with the time it was written;
    without AGENT also the drops the board rejected, under `board`."""
    ws = workspace_of(ctx)
    try:
        after = parse_since(since, time.time()) if since is not None else None
    except ValueError as exc:
        raise Failure(str(exc), 2) from None
    count: int | None = lines
    if after is not None and ctx.get_parameter_source("lines") is click.core.ParameterSource.DEFAULT:
        count = None
    names = [spec.name for spec in build_specs(load_config(ws.config_path), ws.root)]
    if agent is not None and agent not in names:
        raise Failure(f"no agent named {agent!r}; agents: {', '.join(names)}", 2)
    chosen = [agent] if agent else names
    board = agent is None and BOARD not in names
    printer = Printer([*chosen, *([BOARD] if board else [])], after)
    offsets = {}
    for name in list(chosen):
        path = ws.runs_path / name / "agent.log"
        try:
            found = last_lines(path, count)
        except Failure as exc:
            err.print(Text.assemble(("note:", "yellow"), " ", literal(str(exc))))
            chosen.remove(name)
            continue
        if found is None:
            continue
        tail, offsets[name] = found
        for line in tail:
            printer.print(name, line)
    events = None
    if board:
        # Marked before the notes are read: a rejection in between is shown twice rather than never.
        events = EventTail(ws.board_path / "events.jsonl")
        events.seek_end()
        notes, _total = recent_rejections(ws.board_path / "rejected", 1000 if count is None else count)
        for item in reversed(notes):  # oldest first, as a log reads
            printer.print(BOARD, f"{item['at']} rejected {item['file']}: {item['note']}")
    if follow:
        follow_logs(ws.runs_path, chosen, offsets, printer, events)


def follow_logs(runs: Path, chosen: list[str], offsets: dict[str, int], printer: Printer,
                events: EventTail | None) -> None:
    """Print the lines the agents add until Ctrl-C or SIGTERM, which end it as its help says (exit
    0), not as an abort (click's "Aborted!", exit 1), the same as `board --watch`."""
    interruptible()
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(0.2)
            for name in chosen:
                if not is_regular(runs / name / "agent.log"):
                    continue
                new_lines, offsets[name] = read_complete_lines(runs / name / "agent.log", offsets.get(name, 0))
                for line in new_lines:
                    printer.print(name, line)
            if events is not None and is_regular(events.path):
                for line in rejection_lines(events.read_new(), time.time()):
                    printer.print(BOARD, line)
