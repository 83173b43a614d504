"""State files as a hostile agent leaves them: runs/<agent>/state.json and runs/supervisor.json with wrong
types, huge or deep values, a symlink to /dev/zero or a FIFO in their place. `status`, `status --json`,
`board` and the supervisor's own start neither crash nor hang; a delegated child is shown only while
its pid still names the process the agent started (pid and start time)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from hermes_sup.supervisor.cliargs import sane_children
from hermes_sup.supervisor.statefile import STATE_MAX, read_state

from .conftest import CLI, gone, init_workspace, stop_process, wait_until
from .test_supervisor import FAKE, ROOT, make_ws

BEAT = f"command: [{sys.executable}, {FAKE}, beat]"


def state(ws: Path) -> dict:
    """supervisor.json, read as safely as the supervisor does (the hostile one is there until replaced)."""
    found = read_state(ws / "runs" / "supervisor.json")
    return found if isinstance(found, dict) else {}


def agent(ws: Path, name: str) -> dict:
    agents = state(ws).get("agents")
    return agents.get(name) or {} if isinstance(agents, dict) else {}


def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def _huge(path: Path) -> None:
    path.write_text(json.dumps({"children": [{"pid": 1, "name": "x" * 1000}] * (STATE_MAX // 1000)}))


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _wrong_types(path: Path) -> None:
    nested: list = []
    for _ in range(900):  # as deep as json parses, in every field a reader might print
        nested = [nested]
    path.write_text(json.dumps({
        "pid": True, "pid_started": "yesterday", "started_at": nested, "workspace": {"a": nested},
        "shutting_down": nested, "children": [{"pid": os.getpid(), "pid_started": psutil.Process().create_time(),
                                               "name": nested, "task": {"id": nested}}],
        "agents": {"a": {"pid": 2**80, "pid_started": float("nan"), "state": nested, "restarts": 1e308,
                         "task": nested, "last_exit": [nested], "uptime_s": -1}},
    }))


def _numbers(path: Path) -> None:
    path.write_text('{"children": [{"pid": 1' + "0" * 5000 + ', "pid_started": 1e999, "task": NaN}], '
                    '"agents": {"a": {"pid": Infinity, "restarts": -Infinity}}}')


HOSTILE: dict[str, Callable[[Path], None]] = {
    "deep": _deep, "huge": _huge, "dev_zero": _dev_zero, "fifo": _fifo, "wrong_types": _wrong_types,
    "numbers": _numbers,
}


def cli(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A CLI command in a process of its own, bounded: a hang is a failure, not a stuck suite."""
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = make_ws(tmp_path, f"- name: a\n  {BEAT}\n")
    (ws / "runs" / "a").mkdir(parents=True, exist_ok=True)
    return ws


def _pretend_running(ws: Path) -> None:
    """supervisor.json names agent `a` as this (live) process, so `status` reads a's state.json."""
    me = psutil.Process()
    (ws / "runs" / "supervisor.json").write_text(json.dumps(
        {"agents": {"a": {"pid": me.pid, "pid_started": me.create_time(), "state": "running"}}}))


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_status_and_board_survive_a_hostile_agent_state_json(ws, kind):
    _pretend_running(ws)
    HOSTILE[kind](ws / "runs" / "a" / "state.json")
    as_json = cli(ws, "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    row = json.loads(as_json.stdout)["agents"][0]
    assert row["name"] == "a" and row["pid"] == os.getpid()
    if kind != "wrong_types":
        assert row["children"] == []
    else:  # the one well-formed child is shown, its damaged texts dropped
        assert [(c["pid"], c["name"], c["task"]) for c in row["children"]] == [(os.getpid(), None, None)]
    text = cli(ws, "status")
    assert text.returncode == 0 and "Traceback" not in text.stdout + text.stderr, text.stderr
    board = cli(ws, "board")
    assert board.returncode == 0 and "Traceback" not in board.stdout + board.stderr, board.stderr


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_status_and_board_survive_a_hostile_supervisor_json(ws, kind):
    HOSTILE[kind](ws / "runs" / "supervisor.json")
    as_json = cli(ws, "status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["running"] is False
    for row in document["agents"]:  # only the wrong-types file names an agent; nothing of it is trusted
        assert (row["pid"], row["restarts"], row["state"], row["task"]) == (None, 0, None, None)
    for args in (("status",), ("board",), ("board", "--json"), ("down",)):
        result = cli(ws, *args)
        assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, (args, result.stderr)


def test_a_state_file_is_read_only_when_it_is_a_regular_json_file_of_bounded_size(tmp_path):
    for kind, make in HOSTILE.items():
        path = tmp_path / kind
        make(path)
        if kind in ("wrong_types", "numbers"):
            continue  # JSON, whose fields are judged by sane_state and sane_children
        assert read_state(path) is None, kind
    (tmp_path / "ok").write_text('{"children": []}')
    assert read_state(tmp_path / "ok") == {"children": []}
    assert read_state(tmp_path / "missing") is None
    (tmp_path / "bad utf-8").write_bytes(b'{"a": "\xff"}')
    assert read_state(tmp_path / "bad utf-8") is None


@pytest.fixture
def sleeper() -> Iterator[psutil.Process]:
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_status_shows_a_delegated_child_only_while_its_pid_names_the_process_the_agent_started(ws, sleeper):
    _pretend_running(ws)
    path = ws / "runs" / "a" / "state.json"

    def children_shown(child: dict) -> list[int]:
        path.write_text(json.dumps({"children": [{"name": "helper", "task": "t1", **child}]}))
        result = cli(ws, "status", "--json")
        assert result.returncode == 0, result.stderr
        return [c["pid"] for c in json.loads(result.stdout)["agents"][0]["children"]]

    started = sleeper.create_time()
    assert children_shown({"pid": sleeper.pid, "pid_started": started}) == [sleeper.pid]
    # The same pid, another start time: the child exited and its pid now names another process.
    assert children_shown({"pid": sleeper.pid, "pid_started": started - 100}) == []
    assert children_shown({"pid": sleeper.pid}) == [], "a pid without its start time names nothing"
    assert sane_children({"children": [{"pid": 7, "pid_started": float("nan")}, {"pid": 7, "pid_started": 0}]}) == []


# -- the supervisor's own reading ------------------------------------------------------------------

@pytest.fixture
def up(tmp_path: Path) -> Iterator[Callable[[Path], subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(ws: Path) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"up{len(procs)}.log", "wb")  # noqa: SIM115 - the process holds it
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop_process(proc)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_supervisor_starts_whatever_supervisor_json_it_finds(ws, up, kind):
    HOSTILE[kind](ws / "runs" / "supervisor.json")
    proc = up(ws)
    wait_until(lambda: agent(ws, "a").get("state") == "running" or proc.poll() is not None, timeout=30)
    assert proc.poll() is None, (ws.parent / "up0.log").read_text()
    assert cli(ws, "down").returncode == 0
    assert proc.wait(timeout=60) == 0


def test_a_supervisor_adopts_its_agent_whatever_else_a_forged_supervisor_json_says(ws, up):
    first = up(ws)
    wait_until(lambda: agent(ws, "a").get("state") == "running", timeout=30)
    saved = state(ws)
    pid = saved["agents"]["a"]["pid"]
    os.kill(first.pid, signal.SIGKILL)  # its agent runs on, to be adopted
    first.wait(timeout=30)
    saved["agents"]["a"].update(restarts="many", started_at=["x"], task={"id": 1}, uptime_s="long")
    (ws / "runs" / "supervisor.json").write_text(json.dumps(saved))
    second = up(ws)
    wait_until(lambda: state(ws).get("pid") == second.pid or second.poll() is not None, timeout=30)
    assert second.poll() is None, (ws.parent / "up1.log").read_text()
    assert agent(ws, "a")["pid"] == pid and agent(ws, "a")["restarts"] == 0  # adopted, not restarted
    assert cli(ws, "down").returncode == 0
    assert second.wait(timeout=60) == 0
    assert gone(pid)


def test_a_change_of_tasks_alone_is_written_at_most_so_often():
    """Pure: the first task change after a quiet spell is written at once, later ones wait for the
    interval since the last write, whatever else happened."""
    from hermes_sup.supervisor.statefile import TASK_WRITE_EVERY, task_write_at

    assert task_write_at(float("-inf"), 10.0) == 10.0
    assert task_write_at(9.0, 10.0) == 10.0
    assert task_write_at(9.9, 10.0) == pytest.approx(9.9 + TASK_WRITE_EVERY)


def test_a_drain_does_not_rewrite_supervisor_json_at_each_task_and_its_last_word_is_written(tmp_path, up):
    """Each task's start and end rewrote supervisor.json in full (two writes a task, most of the
    supervisor's CPU in a drain); the writes are now bounded by time, and the last one, once the
    tasks are done, still says no agent holds a task."""
    import threading
    import time

    from hermes_sup.kanban import Board
    from hermes_sup.kanban.inotify import IN_MOVED_TO, Inotify
    from hermes_sup.supervisor.statefile import TASK_WRITE_EVERY

    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("providers:\n  none: {kind: offline}\n"
                                    "tiers: {cheap: [none], standard: [none], premium: [none]}\n"
                                    "agents:\n  - {name: w, count: 2}\n")
    up(ws)
    wait_until(lambda: all(a.get("state") == "running" for a in state(ws).get("agents", {}).values())
               and len(state(ws).get("agents", {})) == 2, timeout=60)
    tasks = 60
    board = Board(ws / "kanban")
    writes = Inotify()
    seen: list[str] = []

    agents_wrote: list[str] = []

    def count() -> None:  # read at once: the kernel merges an unread event into the next identical one
        while not writes.closed:
            for event in writes.events(None):
                if event.name == "supervisor.json":
                    seen.append(event.name)
                elif event.name == "state.json":
                    agents_wrote.append(event.folder)

    reader = threading.Thread(target=count, daemon=True)
    try:
        writes.watch_folder(str(ws / "runs"), IN_MOVED_TO)
        for name in state(ws)["agents"]:
            writes.watch_folder(str(ws / "runs" / name), IN_MOVED_TO)
        reader.start()
        began = time.monotonic()
        for n in range(tasks):
            board.add({"id": f"t{n:03d}", "title": f"t {n}",
                       "steps": [{"tool": "write_file", "args": {"path": "out.txt", "content": "x"}}]})
        wait_until(lambda: len(board.list("done").tasks) == tasks, timeout=120)
        took = time.monotonic() - began
        wait_until(lambda: all(a.get("task") is None for a in state(ws)["agents"].values()), timeout=10)
    finally:
        writes.shutdown()
        reader.join(timeout=5)
        writes.close()
        board.close()
    # Without the bound: at least one write per task start or end, 2 * tasks in all.
    assert 0 < len(seen) <= (took + 1.0) / TASK_WRITE_EVERY + 6 < 2 * tasks, (len(seen), took)
    # Nor does an agent write its state.json after each task when nothing but the heartbeat's time
    # would change (the heartbeat writes it every 5 s here, a task in progress then shown).
    assert len(agents_wrote) < tasks // 2, (len(agents_wrote), took)
