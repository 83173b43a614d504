"""The foreground `up`'s tail of the agents' logs: woken by each log written, never by the heartbeat's
state.json, through a rotation and for an agent a reload adds."""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace

from hermes_sup.kanban.fsio import write_json_atomic
from hermes_sup.supervisor.cli.logtail import LogTail
from rich.console import Console

from .conftest import wait_until


def agent(runs: Path, name: str) -> SimpleNamespace:
    return SimpleNamespace(spec=SimpleNamespace(workdir=runs / name))


def append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def test_the_tail_wakes_for_log_lines_only_follows_a_rotation_and_a_new_agent(tmp_path):
    runs = tmp_path / "runs"
    (runs / "one").mkdir(parents=True)
    (runs / "one" / "agent.log").write_text("before the start\n")
    children = {"one": agent(runs, "one")}
    shown = io.StringIO()
    tail = LogTail(children, Console(file=shown, width=200), runs)
    drains: list[object] = []
    drain = tail._drain
    tail._drain = lambda names: (drains.append(names), drain(names))[1]  # type: ignore[method-assign]
    tail.start()
    try:
        wait_until(lambda: drains)  # the first look, once the watches are made
        # The heartbeat rewrites state.json beside the log every few seconds: no reason to look.
        for beat in range(20):
            write_json_atomic(runs / "one" / "state.json", {"beat": beat}, fsync=False)
        append(runs / "one" / "agent.log", "first line\n")
        wait_until(lambda: "one | first line" in shown.getvalue())
        assert "before the start" not in shown.getvalue()  # written before `up`: not shown again
        assert drains == [None, {"one"}]  # the first look (every log), then the one written
        # Rotated by the agent (agent.log -> agent.log.1, a new agent.log): followed to the new file.
        os.replace(runs / "one" / "agent.log", runs / "one" / "agent.log.1")
        append(runs / "one" / "agent.log", "after the rotation\n")
        wait_until(lambda: "one | after the rotation" in shown.getvalue())
        # An agent a reload added: its folder and log made later, in the children the tail was given.
        children["two"] = agent(runs, "two")
        (runs / "two").mkdir()
        append(runs / "two" / "agent.log", "hello from two\n")
        wait_until(lambda: "two | hello from two" in shown.getvalue())
        append(runs / "one" / "agent.log", "still one\n")
        wait_until(lambda: "one | still one" in shown.getvalue())
    finally:
        tail.stop()
