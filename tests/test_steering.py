"""Steering a team: `stop`/`start` one agent, `ps`, `up --detach` on a running team, `task wait`,
`task comment`, and tasks named by a unique prefix of their id (with "did you mean" for a typo)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hermes_sup.kanban import Board
from hermes_sup.kanban.prefix import UnknownTaskId, resolve_id, resolve_task_id
from hermes_sup.kanban.task import MAX_BYTES
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.cli import steer as cli_steer
from hermes_sup.supervisor.steer import agent_groups, held_from, targets
from hermes_sup.supervisor.views import render

from .conftest import CLI, gone, init_workspace, supervisor_state, wait_until

FAKE = Path(__file__).resolve().parent / "fake_agent.py"
ROOT = Path(__file__).resolve().parent.parent


def hermes(ws: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def make_ws(tmp_path: Path, agents: str) -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("defaults:\n  stop_timeout: 5\n  heartbeat_timeout: 30\nagents:\n"
                                    + "".join(f"  {line}\n" for line in agents.splitlines()))
    return ws


def agent(ws: Path, name: str) -> dict:
    return supervisor_state(ws).get("agents", {}).get(name, {})


# -- pure parts ---------------------------------------------------------------------------------------

IDS = ["fix-login", "fix-logout", "write-report", "review-report", "deploy"]


def test_an_exact_id_or_a_unique_prefix_names_its_task():
    assert resolve_id(IDS, "deploy") == "deploy"
    assert resolve_id(IDS, "wr") == "write-report"
    assert resolve_id(IDS, "fix-logo") == "fix-logout"
    assert resolve_id(["fix", "fix-more"], "fix") == "fix", "an exact id wins over the longer ids it starts"


def test_an_ambiguous_prefix_lists_the_ids_it_starts():
    with pytest.raises(UnknownTaskId) as caught:
        resolve_id(IDS, "fix-log")
    assert caught.value.ambiguous and caught.value.candidates == ["fix-login", "fix-logout"]
    assert "'fix-log' is the start of 2 task ids: fix-login, fix-logout; give more of it" in str(caught.value)
    many = [f"t-{n:02}" for n in range(25)]
    with pytest.raises(UnknownTaskId, match=r"25 task ids: t-00, .*t-09 and 15 more"):
        resolve_id(many, "t")


def test_a_typo_gets_did_you_mean_and_nothing_close_gets_none():
    with pytest.raises(UnknownTaskId) as caught:
        resolve_id(IDS, "wirte-report")
    assert not caught.value.ambiguous and caught.value.candidates[0] == "write-report"
    assert str(caught.value).startswith("no task 'wirte-report' on the board; did you mean write-report")
    with pytest.raises(UnknownTaskId) as nothing:
        resolve_id(IDS, "zzzz")
    assert str(nothing.value) == "no task 'zzzz' on the board" and nothing.value.candidates == []


def test_an_empty_or_huge_id_names_nothing_and_is_echoed_short():
    with pytest.raises(UnknownTaskId, match="must not be empty"):
        resolve_id(["only-one"], "")  # the prefix of every id would pick the only task
    with pytest.raises(UnknownTaskId) as caught:
        resolve_id(IDS, "x" * 100_000)
    assert len(str(caught.value)) < 200


def test_a_name_means_that_agent_or_every_instance_of_a_counted_one():
    config = {"agents": [{"name": "worker", "count": 3}, {"name": "solo"}, {"name": "pair", "count": 2}]}
    groups = agent_groups(config)
    assert groups == {"worker": ["worker-1", "worker-2", "worker-3"], "pair": ["pair-1", "pair-2"]}
    present = ["worker-1", "worker-2", "worker-3", "solo", "pair-1"]  # pair-2 left out by --agents
    assert targets("worker-2", present, groups) == ["worker-2"]
    assert targets("worker", present, groups) == ["worker-1", "worker-2", "worker-3"]
    assert targets("pair", present, groups) == ["pair-1"]
    assert targets("nobody", present, groups) is None and targets(["solo"], present, groups) is None


def test_held_agents_are_read_back_only_if_the_team_still_has_them():
    assert held_from({"held": ["a", "gone", 3, None]}, {"a", "b"}) == {"a"}
    assert held_from({"held": "a"}, {"a"}) == set() and held_from({}, {"a"}) == set()


def test_wait_exit_codes_and_outcome_lines():
    assert [cli_steer.wait_exit(s) for s in ("done", "failed", "cancelled", "blocked", "todo", "doing")] == \
        [0, 1, 1, 3, None, None]
    assert cli_steer.outcome_line({"id": "t", "status": "blocked", "question": "Which?"}) == "t: blocked: Which?"
    assert cli_steer.outcome_line({"id": "t", "status": "failed", "error": "boom"}) == "t: failed: boom"


def test_status_shows_an_agent_stopped_by_hand():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render.status_table([{"name": "w-1", "state": "stopped", "held": True},
                                       {"name": "w-2", "state": "stopped", "held": False}]))
    text = console.export_text()
    assert "stopped (by hand)" in text and text.count("(by hand)") == 1


# -- task wait on the board's events (in process, a real board and watcher) ----------------------------

def _move_once_waiting(board: Board, board_root: Path, task_id: str, to: str) -> tuple[threading.Thread, list[float]]:
    """Move the task from another Board (as another process would) once the waiter has read it and
    gone to wait on its board's change signal: the waiter says so itself (its signal's wait is
    wrapped to report the call before it waits), so under any load the move comes after the read,
    and the wake-up is what is measured. The list gets the moment of the move."""
    waiting = threading.Event()
    real_wait = board.signal.wait

    def wait(seen: int, timeout: float) -> bool:
        waiting.set()
        return real_wait(seen, timeout)

    board.signal.wait = wait  # type: ignore[method-assign]
    moved_at: list[float] = []

    def move() -> None:
        if not waiting.wait(60):
            return  # the waiter never waited: the test's own assertions say so
        with Board(board_root) as other:
            moved_at.append(time.monotonic())
            other.move(task_id, to)

    thread = threading.Thread(target=move)
    thread.start()
    return thread, moved_at


def test_wait_wakes_on_the_watchers_event_not_on_its_recheck_timer(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_steer, "RECHECK_WATCHED", 60.0)
    with Board(tmp_path / "kanban") as board:
        doc = board.add({"title": "waited on"})
        board.start_watching()
        assert board.watcher.mode == "inotify"
        mover, moved_at = _move_once_waiting(board, tmp_path / "kanban", doc["id"], "blocked")
        ended, code = cli_steer.wait_for_end(board, doc["id"], timeout=50)
        woke = time.monotonic()
        mover.join(30)
    assert moved_at, "the task was moved only once its waiter waited"
    assert (ended["status"], code) == ("blocked", 3)
    assert woke - moved_at[0] < 20, "woken by the move's event, not by a 60 s recheck"


def test_wait_polls_without_events_and_gives_up_at_its_timeout(tmp_path):
    with Board(tmp_path / "kanban") as board:
        doc = board.add({"title": "waited on"})
        board.watcher.start(force_polling=True, why="a test without events")
        began = time.monotonic()
        still, code = cli_steer.wait_for_end(board, doc["id"], timeout=0.5)
        assert (still["status"], code) == ("todo", 124) and 0.5 <= time.monotonic() - began < 10
        mover, moved_at = _move_once_waiting(board, tmp_path / "kanban", doc["id"], "done")
        ended, code = cli_steer.wait_for_end(board, doc["id"], timeout=30)
        mover.join(30)
    assert moved_at, "the task was moved only once its waiter waited"
    assert (ended["status"], code) == ("done", 0)


# -- task comment, and ids on the command line ------------------------------------------------------------

def test_comment_is_capped_refuses_empty_text_and_takes_a_prefix(tmp_path):
    runner = CliRunner()
    ws = tmp_path / "ws"
    assert runner.invoke(main, ["init", str(ws)]).exit_code == 0
    with Board(ws / "kanban") as board:
        doc = board.add({"title": "commented", "id": "commented-task"})
    added = runner.invoke(main, ["-w", str(ws), "task", "comment", "comm", "looks [b]fine[/b]", "--json"])
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["comments"][-1]["text"] == "looks [b]fine[/b]"
    too_big = runner.invoke(main, ["-w", str(ws), "task", "comment", doc["id"], "x" * (MAX_BYTES + 1), "--json"])
    assert too_big.exit_code == 2 and "limit for a comment is 1048576 bytes" in json.loads(too_big.stdout)["error"]
    empty = runner.invoke(main, ["-w", str(ws), "task", "comment", doc["id"], "  "])
    assert empty.exit_code == 2 and "must not be empty" in empty.output
    with Board(ws / "kanban") as board:
        assert [c["text"] for c in board.get(doc["id"])["comments"]] == ["looks [b]fine[/b]"], "nothing else kept"


def test_a_prefix_of_a_task_moving_during_the_scan_is_still_found(tmp_path, monkeypatch):
    """A task moving between two folders is, for an instant, in neither as a lock-free scan visits
    them in turn: the file board's task_ids sees the move (the board's generation changed) and scans
    again, so a prefix still names the task."""
    from hermes_sup.kanban import reads

    with Board(tmp_path / "kanban") as board, Board(tmp_path / "kanban") as mover:
        board.add({"title": "moving", "id": "moving-task"})
        real, scans = reads.ids, []

        def scan_while_it_moves(root: Path) -> set[str]:
            scans.append(root)
            if len(scans) == 1:
                mover.move("moving-task", "blocked")  # the first scan ran while the task was between folders
                return set()
            return real(root)

        monkeypatch.setattr(reads, "ids", scan_while_it_moves)
        assert resolve_task_id(board, "mov") == "moving-task"
        assert len(scans) == 2


# -- end to end, with a real `up` --------------------------------------------------------------------------

def test_stop_and_start_one_agent_held_across_reload_and_a_new_up(tmp_path, up):
    beat = f"command: [{sys.executable}, {FAKE}, beat]"
    ws = make_ws(tmp_path, f"- name: worker\n  count: 2\n  {beat}\n- name: solo\n  {beat}\n")
    first = up(ws)
    names = ("worker-1", "worker-2", "solo")
    wait_until(lambda: all(agent(ws, n).get("state") == "running" for n in names), timeout=30)
    pid = agent(ws, "worker-1")["pid"]

    stopped = hermes(ws, "stop", "worker-1")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "worker-1: stopping; stays stopped until `hermes-sup start worker-1`" in stopped.stdout
    wait_until(lambda: agent(ws, "worker-1").get("state") == "stopped", timeout=30)
    assert gone(pid)
    status = json.loads(hermes(ws, "status", "--json").stdout)
    rows = {row["name"]: row for row in status["agents"]}
    assert rows["worker-1"]["state"] == "stopped" and rows["worker-1"]["held"] is True
    assert rows["worker-1"]["restarts"] == 0 and rows["worker-2"]["state"] == "running"
    assert "stopped (by hand)" in hermes(ws, "ps").stdout
    refused = hermes(ws, "restart", "worker-1")
    assert refused.returncode == 1 and "stays stopped until `hermes-sup start worker-1`" in refused.stderr
    assert hermes(ws, "stop", "nobody").returncode == 2

    # reload restarts what changed, but a held agent stays stopped
    yaml = (ws / "hermes.yaml").read_text()
    (ws / "hermes.yaml").write_text(yaml.replace("count: 2\n", "count: 2\n    env: {X: '1'}\n"))
    reloaded = hermes(ws, "reload")
    assert reloaded.returncode == 0, reloaded.stderr
    wait_until(lambda: agent(ws, "worker-2").get("restarts") == 1 and agent(ws, "worker-2").get("state") == "running",
               timeout=30)
    assert agent(ws, "worker-1")["state"] == "stopped" and agent(ws, "worker-1")["pid"] is None

    # a new supervisor keeps it stopped too
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=60)
    second = up(ws)
    wait_until(lambda: agent(ws, "worker-2").get("state") == "running" and agent(ws, "solo").get("state") == "running",
               timeout=30)
    assert agent(ws, "worker-1")["state"] == "stopped" and agent(ws, "worker-1")["held"] is True

    started = hermes(ws, "start", "worker-1", "--json")
    assert started.returncode == 0 and json.loads(started.stdout)["agents"] == ["worker-1"], started.stderr
    wait_until(lambda: agent(ws, "worker-1").get("state") == "running", timeout=30)
    assert agent(ws, "worker-1")["restarts"] == 0 and agent(ws, "worker-1")["held"] is False, "not counted"

    # the name of a counted agent stops every instance; start brings them all back
    assert hermes(ws, "stop", "worker").returncode == 0
    wait_until(lambda: all(agent(ws, n).get("state") == "stopped" for n in ("worker-1", "worker-2")), timeout=30)
    assert agent(ws, "solo")["state"] == "running"
    assert hermes(ws, "start", "worker").returncode == 0
    wait_until(lambda: all(agent(ws, n).get("state") == "running" for n in ("worker-1", "worker-2")), timeout=30)
    assert supervisor_state(ws)["held"] == [] and second.poll() is None


def test_an_agent_still_stopping_when_its_supervisor_died_is_not_adopted_by_the_next(tmp_path, up):
    ws = make_ws(tmp_path, f"- name: stubborn\n  stop_timeout: 5\n  command: [{sys.executable}, {FAKE}, ignore-term]\n")
    first = up(ws)
    wait_until(lambda: agent(ws, "stubborn").get("state") == "running", timeout=30)
    pid = agent(ws, "stubborn")["pid"]
    assert hermes(ws, "stop", "stubborn").returncode == 0
    # It ignores SIGTERM: until its SIGKILL is due it is stopping, and held on disk.
    wait_until(lambda: supervisor_state(ws).get("held") == ["stubborn"], timeout=5)
    first.kill()
    first.wait(timeout=10)
    assert not gone(pid)
    up(ws)
    wait_until(lambda: gone(pid), timeout=30)
    wait_until(lambda: agent(ws, "stubborn").get("held") is True, timeout=30)
    assert agent(ws, "stubborn")["state"] == "stopped" and agent(ws, "stubborn")["pid"] is None


def test_a_start_while_the_agent_is_still_stopping_starts_it_once_it_is_gone(tmp_path, up):
    # The agent stops only when the test lets it (fake_agent's held-stop), so `start` comes while it
    # is stopping under any load; with a SIGKILL 2 s after the stop, a slow machine's CLI came after.
    signals = tmp_path / "signals"
    signals.mkdir()
    ws = make_ws(tmp_path, f"- name: stubborn\n  stop_timeout: 60\n"
                           f"  command: [{sys.executable}, {FAKE}, held-stop, {signals}]\n")
    up(ws)
    wait_until(lambda: agent(ws, "stubborn").get("state") == "running", timeout=30)
    pid = agent(ws, "stubborn")["pid"]
    assert hermes(ws, "stop", "stubborn").returncode == 0
    wait_until((signals / f"stopping-{pid}").exists, timeout=30)  # it has the SIGTERM, and stays
    started = hermes(ws, "start", "stubborn")
    assert started.returncode == 0 and "starting once its old process has stopped" in started.stdout, started.stderr
    assert not gone(pid)
    (signals / f"release-{pid}").touch()  # its shutdown ends
    wait_until(lambda: gone(pid), timeout=30)
    wait_until(lambda: agent(ws, "stubborn").get("state") == "running" and agent(ws, "stubborn")["pid"] != pid,
               timeout=30)
    assert agent(ws, "stubborn")["restarts"] == 0 and agent(ws, "stubborn")["held"] is False
    (signals / f"release-{agent(ws, 'stubborn')['pid']}").touch()  # the new one stops at once at the end


def test_ps_is_status_and_up_detach_on_a_running_team_says_so(tmp_path, up):
    ws = make_ws(tmp_path, f"- name: solo\n  command: [{sys.executable}, {FAKE}, beat]\n")
    proc = up(ws)
    wait_until(lambda: agent(ws, "solo").get("state") == "running", timeout=30)
    ps, status = json.loads(hermes(ws, "ps", "--json").stdout), json.loads(hermes(ws, "status", "--json").stdout)
    for document in (ps, status):
        for row in document["agents"]:
            row.pop("cpu_percent"), row.pop("rss_mb"), row.pop("uptime_s")  # live samples
    assert ps == status
    again = hermes(ws, "up", "--detach")
    assert again.returncode == 0, again.stderr
    assert f"hermes-sup is already running in {ws} (pid {proc.pid})" in again.stdout
    assert agent(ws, "solo")["restarts"] == 0 and proc.poll() is None


def test_up_detach_succeeds_with_an_agent_held_by_a_previous_run(tmp_path):
    beat = f"command: [{sys.executable}, {FAKE}, beat]"
    ws = make_ws(tmp_path, f"- name: busy\n  {beat}\n- name: idle\n  {beat}\n")
    (ws / "runs" / "supervisor.json").write_text(json.dumps({"held": ["idle"], "agents": {}}))
    try:
        detached = hermes(ws, "up", "--detach")
        assert detached.returncode == 0, detached.stdout + detached.stderr
        assert "stopped (by hand)" in detached.stdout
        assert agent(ws, "busy")["state"] == "running" and agent(ws, "idle")["pid"] is None
    finally:
        assert hermes(ws, "down").returncode == 0


def test_task_wait_exits_by_how_the_task_ended_and_ids_take_prefixes(tmp_path, up):
    ws = make_ws(tmp_path, "- name: runner\n")
    up(ws)
    wait_until(lambda: agent(ws, "runner").get("state") == "running", timeout=30)
    board = Board(ws / "kanban")
    try:
        # One agent works them in priority order; every waiter starts before its task ends.
        board.add({"title": "first", "id": "alpha-done", "priority": 9,
                   "steps": [{"tool": "wait", "args": {"seconds": 2}}]})
        board.add({"title": "second", "id": "bravo-fails", "priority": 8, "max_attempts": 1,
                   "steps": [{"tool": "read_file", "args": {"path": "missing.txt"}}]})
        board.add({"title": "third", "id": "charlie-asks", "priority": 7,
                   "steps": [{"tool": "ask_human", "args": {"question": "Which colour?"}}]})
        board.add({"title": "fourth", "id": "delta-long", "priority": 6,
                   "steps": [{"tool": "wait", "args": {"seconds": 300}}]})
        waiters = {name: subprocess.Popen([*CLI, "-w", str(ws), "task", "wait", prefix, "--json"], cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for name, prefix in (("done", "alp"), ("failed", "bravo"), ("blocked", "ch"))}
        ended = {}
        for name, proc in waiters.items():
            out, errors = proc.communicate(timeout=90)
            ended[name] = (proc.returncode, json.loads(out)["status"]) if out else (proc.returncode, errors)
        assert ended == {"done": (0, "done"), "failed": (1, "failed"), "blocked": (3, "blocked")}

        wait_until(lambda: board.get("delta-long")["status"] == "doing", timeout=60)
        timed = hermes(ws, "task", "wait", "delta", "--timeout", "1")
        assert timed.returncode == 124 and "delta-long: still doing after 1 s" in timed.stderr
        waiter = subprocess.Popen([*CLI, "-w", str(ws), "task", "wait", "delta-long"], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        commented = hermes(ws, "task", "comment", "delta", "stop this one")
        assert commented.returncode == 0 and "delta-long: comment added (1 in all)" in commented.stdout
        cancelled = hermes(ws, "task", "cancel", "delt")
        assert cancelled.returncode == 0 and "delta-long: doing -> cancelled" in cancelled.stdout
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == 1 and out.startswith("delta-long: cancelled")

        shown = hermes(ws, "task", "show", "bravo", "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == "bravo-fails"
        typo = hermes(ws, "task", "show", "bravo-fials")
        assert typo.returncode == 2, typo.stderr
        assert f"no task 'bravo-fials' on the board {ws / 'kanban'}; did you mean bravo-fails?" in typo.stderr
        both = hermes(ws, "task", "retry", "", "--json")
        assert both.returncode == 2 and "must not be empty" in json.loads(both.stdout)["error"]
        board.add({"title": "fifth", "id": "alpha-two"})
        ambiguous = hermes(ws, "task", "move", "alpha", "cancelled")
        assert ambiguous.returncode == 2 and "2 task ids: alpha-done, alpha-two" in ambiguous.stderr
        assert board.get("alpha-two")["status"] == "todo", "an ambiguous prefix changed nothing"
        unknown = hermes(ws, "task", "wait", "zulu", "--timeout", "5")
        assert unknown.returncode == 2 and "no task 'zulu'" in unknown.stderr
    finally:
        board.close()


def test_wait_notes_a_stopped_team_only_when_the_task_has_yet_to_end(tmp_path):
    # In a run of docs/how-to/watch-and-steer.md (then the README),
    # `task wait` on a task already done said "waiting for a change by hand" and
    # returned at once: the note is for a wait that depends on someone else, not for this.
    ws = tmp_path / "ws"
    assert CliRunner().invoke(main, ["init", str(ws)]).exit_code == 0
    with Board(ws / "kanban") as board:
        finished = board.add({"title": "finished", "id": "finished"})
        board.move(finished["id"], "done")
        board.add({"title": "pending", "id": "pending"})
    done = subprocess.run([*CLI, "-w", str(ws), "task", "wait", "finished"], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "finished: done", "")
    waited = subprocess.run([*CLI, "-w", str(ws), "task", "wait", "pending", "--timeout", "0.2"],
                            capture_output=True, text=True, timeout=60)
    assert waited.returncode == 124 and "hermes-sup is not running in" in waited.stderr
