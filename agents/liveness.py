"""The agent process's signs of life: its heartbeat, its state file and log, and its stop on a signal or
when no supervisor hears from it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

from ..kanban import ClaimLost
from ..kanban.fsio import write_json_atomic
from ..kanban.task import now_iso


def beat_every(heartbeat_timeout: float, *, working: bool) -> float:
    """Seconds between an agent's heartbeats (pure): at least four within heartbeat_timeout; every
    5 s while it works (each beat renews its claim's lease), every 10 s while it waits (20 idle
    agents' beats were most of an idle supervisor's CPU)."""
    return max(0.05, min(5.0 if working else 10.0, heartbeat_timeout / 4))


class Liveness:
    """An agent's heartbeat, state and log, and how it comes to stop (mixed into worker.Agent, whose state it uses)."""

    def request_stop(self, why: str) -> None:
        if not self.stop.is_set():
            self.why_stopping = why
            self.stop.set()
            with self._lock:
                if self._halt is not None:
                    self._halt.set()
            self.board.wake()

    def beat(self) -> None:
        with self._lock:
            task = self.current
        if self.parent_pid is not None:
            delivered = os.getppid() == self.parent_pid  # a child answers to its parent agent, not the supervisor
        else:
            delivered = self.notifier.send(WATCHDOG=1, TASK=task["id"] if task else "-") and self._owned()
        now = time.monotonic()
        if delivered:
            self._orphaned_since = None
        elif self._orphaned_since is None:
            self._orphaned_since = now
        elif now - self._orphaned_since >= self.orphan_grace:
            self.orphaned = True
            self.request_stop(f"no supervisor for {self.orphan_grace:g} s")
        self.write_state("working" if task else "idle")
        self.rotate_log()
        if task is not None:
            # If the task was taken back, the step in flight finds out when it closes the task.
            with contextlib.suppress(ClaimLost):
                self.board.renew(task["id"], task["claim"]["token"])

    def _owned(self) -> bool:
        """Whether the supervisor we heart-beat to runs this very process. While the supervisor that
        started us is alive we are its child, whatever its state file says yet (busy starting 255 other
        agents, it writes it late). Once reparented, a supervisor started after ours died binds the
        same socket: if its state does not name our pid (it runs another process for our name) our
        heartbeats reach it but keep nobody informed, and we must leave."""
        if self._spawner > 1 and os.getppid() == self._spawner:
            return True
        try:
            state = json.loads((self.workspace / "runs" / "supervisor.json").read_text())  # the supervisor's STATE_FILE
            return state["agents"][self.name]["pid"] == os.getpid()
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def rotate_log(self) -> None:
        """Rotate our own log by size: the writer rotating is the one way no line is lost or
        written to a file nobody reads. agent.log -> agent.log.1 -> ... -> agent.log.<keep>."""
        with self._log_lock:
            self._rotate_log()

    def _rotate_log(self) -> None:
        path = self.workdir / "agent.log"
        try:
            current = os.fstat(1)
            if current.st_size < self.log_max_bytes or os.stat(path).st_ino != current.st_ino:
                return
        except OSError:
            return  # stdout is not our log file (started by hand), or it is gone
        sys.stdout.flush()
        sys.stderr.flush()
        for index in range(self.log_keep - 1, 0, -1):
            older = path.with_name(f"agent.log.{index}")
            if older.exists():
                os.replace(older, path.with_name(f"agent.log.{index + 1}"))
        if self.log_keep > 0:
            os.replace(path, path.with_name("agent.log.1"))
        else:
            path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def write_state(self, status: str, *, if_changed: bool = False) -> None:
        """Write state.json; with `if_changed`, only if it would say more than a newer heartbeat
        time (after each task: the heartbeat rewrites it every few seconds anyway, and each write
        is a new file, which ext4 makes dearer the more files were removed in the last minutes)."""
        with self._lock:
            task = self.current
        said = {"name": self.name, "pid": os.getpid(), "status": status, "task": task["id"] if task else None,
                "step": self.step if task else None, "provider": self.provider, "waiting": self.waiting,
                "children": self.delegator.visible()}
        if if_changed and said == self._said:
            return
        self._said = said
        write_json_atomic(self.workdir / "state.json", {**said, "heartbeat": now_iso()}, fsync=False)

    def _heartbeat_loop(self) -> None:
        # Woken at the working pace, beating at the idle one only while idle: a task claimed during
        # an idle wait has its lease renewed within the working interval, as before idle beats slowed.
        last = time.monotonic()
        while not self.stop.wait(beat_every(self.heartbeat_timeout, working=True)):
            idle = beat_every(self.heartbeat_timeout, working=False)
            if self.current is not None or time.monotonic() - last >= idle * 0.95:
                self.beat()
                last = time.monotonic()

    def _watch_signals(self) -> None:
        # A signal handler must not take locks (Event.set does): it only writes the signal
        # number to a pipe, and this thread turns it into a stop request.
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: None)

        def wait_for_signal() -> None:
            while True:
                data = os.read(read_end, 16)
                if data:
                    self.request_stop(signal.Signals(data[-1]).name)

        threading.Thread(target=wait_for_signal, name="signals", daemon=True).start()
