"""The foreground `up`'s display of what the agents write to their logs, woken by inotify."""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from ...kanban.fsio import read_complete_lines
from ...kanban.inotify import (
    IN_CREATE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
)
from ..views import logtext
from .common import is_regular, visible

LOG_NAME = "agent.log"
POLL_EVERY = 0.2  # seconds between looks at the logs where inotify cannot be had
ALL = None  # every agent's log


def to_read(events: Iterable[tuple[int, int, str]], logs: Mapping[int, str], folders: set[int]) -> set[str] | None:
    """Whose logs an inotify read says were written: a set of names, or ALL when the watches must be
    made again first (a log made, rotated or gone; a folder above made or replaced; the queue
    overflowed) (pure). `logs`: each agent's log watch, or its folder's while it has no log yet."""
    names: set[str] = set()
    for wd, mask, name in events:
        if mask & (IN_Q_OVERFLOW | IN_IGNORED | IN_MOVE_SELF | IN_DELETE_SELF) or wd in folders:
            return ALL
        if wd in logs and (name == LOG_NAME or (not name and mask & IN_MODIFY)):
            if name:  # the log made in the agent's folder: its own watch replaces the folder's
                return ALL
            names.add(logs[wd])
    return names


class LogTail:
    """Prints what the agents write to their logs, prefixed by name (foreground `up` only; a display,
    not how crashes are found). It sleeps until inotify says a log was written: an idle team costs
    it nothing. Each log is watched itself (its folder, where the heartbeat rewrites state.json,
    only until the log is made), and the folders above for an agent's folder made later."""

    def __init__(self, children: dict[str, Any], console: Console, runs: Path) -> None:
        self.children = children  # the supervisor's: a reload adds and removes agents in it
        self.console = console
        self.runs = runs
        self.offsets: dict[str, int] = {}
        self._logs: dict[int, str] = {}
        self._stop = threading.Event()
        self._wake_read, self._wake_write = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="log-tail", daemon=True)

    def start(self) -> None:
        for name, child in self.children.items():
            with contextlib.suppress(OSError):
                self.offsets[name] = (child.spec.workdir / LOG_NAME).stat().st_size
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_write, b"!")
        self._thread.join(timeout=2)
        self._drain(ALL)
        if not self._thread.is_alive():
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _run(self) -> None:
        try:
            watch = Inotify()
        except OSError:
            while not self._stop.wait(POLL_EVERY):
                self._drain(ALL)
            return
        try:
            self._follow(watch)
        finally:
            watch.close()

    def _follow(self, watch: Inotify) -> None:
        folders = self._watch(watch)
        self._drain(ALL)
        while not self._stop.is_set():
            ready, _, _ = select.select([watch.fd, self._wake_read], [], [])
            if self._wake_read in ready:
                return
            names = to_read(watch.read(), self._logs, folders)
            if names is ALL:
                folders = self._watch(watch)
            if names is ALL or names:
                self._drain(names)

    def _watch(self, watch: Inotify) -> set[int]:
        """Watch each agent's log (or its folder until it has one: a reload's new agent, a log rotated
        just now), and the folders above them for an agent's folder made (its first start) or
        supervisor.json replaced (a reload); the watches of the folders above, returned."""
        folders: set[int] = set()
        for folder in (self.runs.parent, self.runs):
            with contextlib.suppress(OSError):
                folders.add(watch.add(folder, IN_CREATE | IN_MOVED_TO))
        logs: dict[int, str] = {}
        for name, child in list(self.children.items()):
            try:
                logs[watch.add(child.spec.workdir / LOG_NAME, IN_MODIFY | IN_MOVE_SELF | IN_DELETE_SELF,
                               folder=False)] = name
            except OSError:
                with contextlib.suppress(OSError):
                    logs[watch.add(child.spec.workdir, IN_CREATE | IN_MOVED_TO)] = name
        for wd in set(self._logs) - set(logs) - folders:  # a rotated log's old file, a folder with a log now
            watch.remove(wd)
        self._logs = logs
        return folders

    def _drain(self, names: set[str] | None) -> None:
        width = max((len(name) for name in self.children), default=0)
        for name, child in list(self.children.items()):
            if names is not ALL and name not in names:
                continue
            log = child.spec.workdir / LOG_NAME
            if not is_regular(log):
                continue
            try:
                lines, self.offsets[name] = read_complete_lines(log, self.offsets.get(name, 0))
            except OSError:  # out of descriptors, say: shown at the next look, never the end of the display
                continue
            for line in lines:
                self.console.print(Text.assemble((visible(f"{name:<{width}}"), logtext.agent_colour(name)), " | ",
                                                 logtext.log_text(name, line.decode("utf-8", "replace"))),
                                   highlight=False, soft_wrap=True)  # a log line stays one line
