"""Per-task counts of the syscalls that cost a drain its disk time, by strace -c on a team's agents."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

from bench.scale_team import Team
from bench.scale_wait import wait_drained

# rename(2) is reached as renameat or renameat2 by some libcs, so all three are counted as "rename".
SYSCALLS = ("fsync", "fdatasync", "rename", "renameat", "renameat2", "openat", "flock")
ATTACH_WAIT = 1.0


def parse_summary(text: str) -> dict[str, int]:
    """strace -c's table to {syscall: calls} (pure)."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[0].replace(".", "").isdigit() or fields[-1] == "total":
            continue
        calls[fields[-1]] = int(fields[3])
    return calls


def syscalls_per_task(team: Team, prefix: str, count: int, out: Path, poll: float) -> dict[str, float]:
    """Drop `count` tasks with strace attached to every agent, and divide its counts by `count`."""
    staged = team.stage_backlog(prefix, count)
    args = ["strace", "-c", "-f", "-e", f"trace={','.join(SYSCALLS)}", "-o", str(out)]
    for pid in team.agent_pids():
        args += ["-p", str(pid)]
    tracer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(ATTACH_WAIT)  # attached to every agent before the first drop
        inbox = team.ws / "kanban" / "inbox"
        for path in staged:
            path.rename(inbox / path.name)
        wait_drained(lambda: team.done_count(prefix), count, poll, "the traced drain")
    finally:
        with contextlib.suppress(ProcessLookupError):
            tracer.send_signal(signal.SIGINT)  # detaches and writes its summary
        try:
            tracer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait()
    calls = parse_summary(out.read_text()) if out.exists() else {}
    renames = sum(calls.pop(name, 0) for name in ("renameat", "renameat2"))
    calls["rename"] = calls.get("rename", 0) + renames
    return {name: calls.get(name, 0) / count for name in ("fsync", "fdatasync", "rename", "openat", "flock")}
