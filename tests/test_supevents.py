"""The supervisor's events in the board's stream: what each line it says means (pure), the lock-free
append beside the board's own, and with a real supervisor: a SIGKILLed agent shows as exited and
restarting in `events -f`, the operator's stop/start and a refused reload are there, and a reader
killed mid-stream resumes with --since over both kinds, missing none and repeating none."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from hermes_sup.kanban import Board
from hermes_sup.kanban.events import append_record, decode_event, read_since
from hermes_sup.supervisor.cli.events import event_line
from hermes_sup.supervisor.policy import describe_exit
from hermes_sup.supervisor.supevents import command_event, note

from .conftest import supervisor_state, wait_until
from .test_events import Stream, hermes, log_records, make_ws

FAKE = Path(__file__).resolve().parent / "fake_agent.py"
AT = "2026-01-01T00:00:00Z"


# -- what the supervisor records (pure) ------------------------------------------------------------------

def test_a_line_with_no_event_of_its_own_is_a_note_about_the_agent_it_starts_with():
    assert note("w: cannot use its cgroup (EPERM); process group only", {"w-1", "w"}, AT) == {
        "at": AT, "kind": "supervisor", "event": "note", "agent": "w",
        "note": "w: cannot use its cgroup (EPERM); process group only"}
    assert note("stranger: started (pid 1)", {"w"}, AT)["agent"] is None
    assert note("supervisor: stopped", {"w"}, AT)["agent"] is None
    assert len(note("w: " + "x" * 5000, {"w"}, AT)["note"]) == 2000


def test_operator_commands_are_events_with_their_answer():
    assert command_event({"cmd": "stop", "agent": "w"}, {"ok": True, "message": "w: stopping"}, AT) == {
        "at": AT, "kind": "supervisor", "event": "operator_stop", "agent": "w", "note": "w: stopping"}
    assert command_event({"cmd": "start", "agent": 5}, {"ok": False, "message": "no"}, AT)["event"] == \
        "operator_start_refused"
    assert command_event({"cmd": "reload"}, {"ok": False, "message": "refused"}, AT)["event"] == "reload_refused"
    assert command_event({"cmd": "status"}, {"ok": True}, AT) is None


def test_decode_keeps_the_known_fields_of_each_kind_and_refuses_odd_shapes():
    sup = {"at": AT, "kind": "supervisor", "event": "exited", "agent": "w", "signal": "SIGKILL", "pid": 5,
           "note": "w: killed", "extra": {"deep": 1}}
    assert decode_event(json.dumps(sup).encode()) == {k: v for k, v in sup.items() if k != "extra"}
    for bad in ({**sup, "kind": "other"}, {**sup, "event": None}, {**sup, "pid": "5"}, {**sup, "pid": True},
                {**sup, "note": ["x"]}, {"kind": "supervisor", "at": AT}):
        assert decode_event(json.dumps(bad).encode()) is None, bad
    assert decode_event(b'{"kind": "board", "task": "t", "to": "todo"}')["kind"] == "board"
    line = event_line({**sup, "note": "w: \x1b[31mred\x1b[0m"})
    assert line.startswith(f"{AT}  supervisor  exited  w: ") and "\x1b" not in line


def test_appends_without_the_lock_land_whole_between_the_boards_and_close_a_torn_line(tmp_path):
    board = Board(tmp_path / "kanban")
    try:
        board.add({"title": "first", "id": "first"})
        with board.events_path.open("a") as handle:
            handle.write('{"task": "torn')  # a writer killed mid-line
        append_record(board.events_path, {"at": AT, "kind": "supervisor", "event": "note", "note": "after torn"})
        writers = [threading.Thread(target=lambda n=n: [append_record(
            board.events_path, {"at": AT, "kind": "supervisor", "event": "note", "note": f"{n}-{i}" + "x" * 3000})
            for i in range(100)]) for n in range(3)]
        adder = threading.Thread(target=lambda: [board.add({"title": f"t{i}", "id": f"t-{i}"}) for i in range(100)])
        for thread in (*writers, adder):
            thread.start()
        for thread in (*writers, adder):
            thread.join(timeout=120)
        result = read_since(board.events_path, 0, max_events=10**6)
    finally:
        board.close()
    assert result.bad == 1  # the torn line only
    notes = [r["note"] for _, r in result.events if r["kind"] == "supervisor"]
    assert notes[0] == "after torn" and len(notes) == 301
    assert len([r for _, r in result.events if r["kind"] == "board"]) == 101
    cursors = [cursor for cursor, _ in result.events]
    assert cursors == sorted(set(cursors))


# -- with a real supervisor ---------------------------------------------------------------------------

def beat_team(tmp_path: Path, names: tuple[str, ...] = ("a", "b")) -> Path:
    return make_ws(tmp_path, "".join(f"- name: {name}\n  command: [{sys.executable}, {FAKE}, beat]\n"
                                     for name in names))


def running(ws: Path, name: str) -> dict:
    info = supervisor_state(ws).get("agents", {}).get(name, {})
    return info if info.get("state") == "running" else {}


def sup_records(stream: Stream) -> list[dict]:
    return [r for r in stream.records() if r["kind"] == "supervisor"]


def test_an_agent_killed_shows_as_exited_and_restarting_and_the_operator_and_reload_too(tmp_path, up):
    ws = beat_team(tmp_path)
    up(ws)
    wait_until(lambda: running(ws, "a") and running(ws, "b"), timeout=60)
    stream = Stream(ws, "-f", "--json")
    text = Stream(ws, "-f")
    try:
        wait_until(lambda: sum(r["event"] == "started" for r in sup_records(stream)) == 2, timeout=60)
        pid = running(ws, "a")["pid"]
        subprocess.run(["kill", "-9", str(pid)], check=True)
        wait_until(lambda: any(r["event"] == "started" and r["agent"] == "a" and r["pid"] != pid
                               for r in sup_records(stream)), timeout=60)
        after = [r for r in sup_records(stream) if r["agent"] == "a"][1:]
        assert [r["event"] for r in after[:3]] == ["exited", "restarting", "started"], after
        assert after[0]["signal"] == "SIGKILL" and after[1]["delay"] == 0.0
        assert hermes(ws, "stop", "b").returncode == 0
        assert hermes(ws, "start", "b").returncode == 0
        (ws / "hermes.yaml").write_text((ws / "hermes.yaml").read_text() + "bogus: 1\n")
        assert hermes(ws, "reload").returncode != 0
        wait_until(lambda: [r["event"] for r in sup_records(stream)][-1:] == ["reload_refused"], timeout=60)
        events = [(r["event"], r["agent"]) for r in sup_records(stream)]
        stop_at = events.index(("operator_stop", "b"))
        assert ("exited", "b") in events[stop_at:] and ("operator_start", "b") in events[stop_at:]
        assert "restarting" not in [e for e, a in events[stop_at:] if a == "b"]  # stopped by hand: no restart
        refused = sup_records(stream)[-1]
        assert "bogus" in refused["note"] and "hermes.yaml:" in refused["note"]
        wait_until(lambda: any("  supervisor  reload_refused  " in line for line in text.lines), timeout=60)
        assert any(line.endswith(f"supervisor  exited  a: {describe_exit(-9)}; restart in 0.00 s")
                   for line in text.lines), text.lines
    finally:
        assert stream.end() == 0 and text.end() == 0


def test_a_killed_reader_resumes_over_both_kinds_missing_none_and_repeating_none(tmp_path, up):
    ws = beat_team(tmp_path, ("a",))
    up(ws)
    wait_until(lambda: running(ws, "a"), timeout=60)
    board = Board(ws / "kanban")
    try:
        reader = Stream(ws, "-f", "--json")
        wait_until(lambda: sup_records(reader), timeout=60)
        board.add({"title": "one", "id": "one"})
        wait_until(lambda: any(r.get("task") == "one" for r in reader.records()), timeout=60)
        reader.end(signal.SIGKILL)
        seen = reader.records()
        for n in range(100):  # 100 board transitions while nobody reads, and the supervisor's events among them
            board.add({"title": f"t{n}", "id": f"task-{n}"})
            if n % 25 == 0:
                assert hermes(ws, "restart", "a").returncode == 0
        resumed = Stream(ws, "-f", "--json", "--since", str(seen[-1]["cursor"]))
        wait_until(lambda: sum(r["event"] == "started" for r in sup_records(resumed)) == 4, timeout=60)
        total = len(log_records(board))
        wait_until(lambda: len(seen) + len(resumed.lines) >= total, timeout=60)
        assert resumed.end() == 0
    finally:
        board.close()
    streamed = seen + resumed.records()
    cursors = [r.pop("cursor") for r in streamed]
    assert cursors == sorted(set(cursors)), "none twice"
    assert streamed == log_records(board), "none missed, in the log's order"
    kinds = [r["kind"] for r in streamed]
    assert kinds.count("board") == 101 and kinds.count("supervisor") >= 1 + 4 * 4  # started; per restart: 4
    assert [r["event"] for r in resumed.records() if r["kind"] == "supervisor"].count("operator_restart") == 4


def test_an_append_that_moves_no_task_file_reaches_a_follower_at_once(tmp_path):
    """The supervisor's events move no task file: the follower is woken by the append itself, not by
    its once-a-second read of the log (each append lands just after it read, so that read is a
    second away)."""
    ws = make_ws(tmp_path)
    log = ws / "kanban" / "events.jsonl"
    append_record(log, {"at": AT, "kind": "supervisor", "event": "note", "note": "first"})
    stream = Stream(ws, "-f", "--json")
    delays = []
    try:
        wait_until(lambda: len(stream.lines) == 1, timeout=60)
        for n in range(5):
            started = time.monotonic()
            append_record(log, {"at": AT, "kind": "supervisor", "event": "note", "note": f"n{n}"})
            wait_until(lambda n=n: len(stream.lines) == n + 2, timeout=60, interval=0.002)
            delays.append(time.monotonic() - started)
    finally:
        assert stream.end() == 0
    assert statistics.median(delays) < 0.5, delays
