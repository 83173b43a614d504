"""`events`: the board's transitions as one stream with a cursor (the byte offset after each line of
events.jsonl) that a reader killed at any moment resumes from with `--since`, missing none and
printing none twice; hostile lines in the log are skipped without a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.events import MAX_EVENT_LINE, CursorError, check_cursor, decode_event, parse_cursor, read_since
from hermes_sup.kanban.waiting import LOG_SETTLE
from hermes_sup.supervisor.cli.events import event_line

from .conftest import CLI, init_workspace, supervisor_state, wait_until

ROOT = Path(__file__).resolve().parent.parent


def hermes(ws: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def make_ws(tmp_path: Path, agents: str = "") -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    if agents:
        (ws / "hermes.yaml").write_text("defaults:\n  stop_timeout: 5\n  heartbeat_timeout: 30\nagents:\n"
                                        + "".join(f"  {line}\n" for line in agents.splitlines()))
    return ws


class Stream:
    """A running `events` process whose complete stdout lines are collected by a thread."""

    def __init__(self, ws: Path, *args: str) -> None:
        self.proc = subprocess.Popen([*CLI, "-w", str(ws), "events", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.partial = ""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            chunk = self.proc.stdout.readline()
            if not chunk:
                return
            if chunk.endswith("\n"):
                self.lines.append(chunk[:-1])
            else:
                self.partial = chunk  # cut by a kill: never a whole event

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]

    def end(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self._thread.join(timeout=30)
        return code


def log_records(board: Board) -> list[dict]:
    return [record for _, record in read_since(board.events_path, 0, max_events=10**6).events]


# -- reading by cursor, on files ----------------------------------------------------------------------

def test_a_cursor_is_the_offset_after_a_line_and_since_returns_exactly_what_follows(tmp_path):
    log = tmp_path / "events.jsonl"
    lines = [json.dumps({"at": f"t{n}", "task": f"task-{n}", "from": None, "to": "todo", "by": "cli", "note": ""})
             for n in range(5)]
    log.write_text("".join(line + "\n" for line in lines))
    everything = read_since(log, 0)
    ends = [end for end, _ in everything.events]
    assert ends == [sum(len(line) + 1 for line in lines[:n + 1]) for n in range(5)]
    assert everything.cursor == ends[-1] == log.stat().st_size and everything.bad == 0
    for n, end in enumerate(ends):
        check_cursor(log, end)
        assert [r["task"] for _, r in read_since(log, end).events] == [f"task-{k}" for k in range(n + 1, 5)]
    with pytest.raises(CursorError, match="not at the end of a line"):
        check_cursor(log, ends[1] - 3)
    with pytest.raises(CursorError, match="past the end"):
        check_cursor(log, ends[-1] + 1)
    with pytest.raises(CursorError, match="past the end"):
        check_cursor(tmp_path / "none.jsonl", 7)
    check_cursor(tmp_path / "none.jsonl", 0)
    for bad in ("-1", "abc", "1e3", "٣", "9" * 30, ""):
        with pytest.raises(CursorError):
            parse_cursor(bad)
    assert parse_cursor("0") == 0 and parse_cursor("123") == 123


def test_a_half_written_last_line_waits_for_its_newline(tmp_path):
    log = tmp_path / "events.jsonl"
    whole = json.dumps({"at": "t", "task": "a", "from": None, "to": "todo", "by": "cli", "note": ""}) + "\n"
    log.write_text(whole + whole[:20])
    first = read_since(log, 0)
    assert len(first.events) == 1 and first.cursor == len(whole)
    with log.open("a") as handle:
        handle.write(whole[20:])
    second = read_since(log, first.cursor)
    assert [end for end, _ in second.events] == [2 * len(whole)]


def test_hostile_lines_are_skipped_and_counted_without_a_crash(tmp_path):
    log = tmp_path / "events.jsonl"
    good = json.dumps({"at": "t", "task": "ok", "from": "todo", "to": "doing", "by": "w", "note": "n",
                       "cursor": 1, "extra": "dropped"}) + "\n"
    hostile = [
        b"not json at all\n",
        b"[" * 200_000 + b"\n",                        # deep nesting: a RecursionError in json
        b'{"task": "' + b"x" * (MAX_EVENT_LINE + 10) + b'"}\n',  # huge
        b"[1, 2, 3]\n", b'{"task": 5}\n', b"\xff\xfe\n", b"\n",
        b'{"task": "x", "note": ' + b"[" * 900 + b"]" * 900 + b"}\n",  # parses, but is no event
    ]
    log.write_bytes(good.encode() + b"".join(hostile) + good.encode())
    result = read_since(log, 0)
    assert [r["task"] for _, r in result.events] == ["ok", "ok"]
    assert result.bad == 7 and result.cursor == log.stat().st_size
    assert result.events[0][1] == {"kind": "board", "at": "t", "task": "ok", "from": "todo", "to": "doing", "by": "w",
                                   "note": "n"}
    assert decode_event(b"{}") is None


def test_a_huge_line_still_being_written_is_not_skipped_early(tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"x" * (MAX_EVENT_LINE + 100))  # no newline yet
    first = read_since(log, 0)
    assert first.events == [] and first.cursor == 0
    with log.open("ab") as handle:
        handle.write(b"\n" + json.dumps({"task": "after"}).encode() + b"\n")
    second = read_since(log, 0)
    assert [r["task"] for _, r in second.events] == ["after"] and second.bad == 1


def test_event_line_prints_user_text_literally():
    line = event_line({"at": "t", "task": "a\x1b[31mred", "from": None, "to": "todo", "by": "cli\n",
                       "note": "[bold]x[/bold]\u202e"})
    assert "\x1b" not in line and "\\x1b[31m" in line and "\n" not in line
    assert "[bold]x[/bold]\\u202e" in line and "- -> todo" in line


# -- the command ------------------------------------------------------------------------------------

def test_events_prints_resumes_and_refuses_a_bad_cursor(tmp_path):
    ws = make_ws(tmp_path)
    board = Board(ws / "kanban")
    try:
        board.add({"title": "one", "id": "one"})
        board.add({"title": "two \x1b[2J", "id": "two"})
        board.move("one", "cancelled")
    finally:
        board.close()
    plain = hermes(ws, "events")
    assert plain.returncode == 0, plain.stderr
    assert [line.split("  ")[1:3] for line in plain.stdout.splitlines()] == [
        ["one", "- -> todo"], ["two", "- -> todo"], ["one", "todo -> cancelled"]]
    listed = hermes(ws, "events", "--json")
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["to"] for r in records] == ["todo", "todo", "cancelled"]
    after = hermes(ws, "events", "--json", "--since", str(records[0]["cursor"]))
    assert [json.loads(line) for line in after.stdout.splitlines()] == records[1:]
    assert hermes(ws, "events", "--since", str(records[-1]["cursor"])).stdout == ""
    for bad in (str(records[0]["cursor"] - 1), str(records[-1]["cursor"] + 1), "x"):
        refused = hermes(ws, "events", "--json", "--since", bad)
        assert refused.returncode == 2 and json.loads(refused.stdout)["exit_code"] == 2, refused
        assert hermes(ws, "events", "--since", bad).returncode == 2


def test_the_command_skips_hostile_lines_with_a_note_and_prints_the_rest(tmp_path):
    ws = make_ws(tmp_path)
    board = Board(ws / "kanban")
    try:
        board.add({"title": "one", "id": "one"})
        with board.events_path.open("ab") as handle:
            handle.write(b"garbage\n" + b"[" * 100_000 + b"\n" + b'{"task": "' + b"y" * (3 << 20) + b'"}\n'
                         + b'{"task": "x", "note": ' + b"[" * 900 + b"]" * 900 + b"}\n" + b"1" * 10_000 + b"\n")
        board.add({"title": "two", "id": "two"})
    finally:
        board.close()
    for args in (("--json",), ()):
        shown = hermes(ws, "events", *args)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        assert "5 unreadable line(s) in events.jsonl skipped" in shown.stderr
        assert len(shown.stdout.splitlines()) == 2 and "two" in shown.stdout.splitlines()[1]


def test_a_killed_reader_resumes_with_since_and_misses_none_and_repeats_none(tmp_path):
    ws = make_ws(tmp_path)
    board = Board(ws / "kanban")
    try:
        for n in range(10):
            board.add({"title": f"before {n}", "id": f"before-{n}"})
        reader = Stream(ws, "-f", "--json")
        wait_until(lambda: len(reader.lines) >= 10, timeout=60)
        # Transitions go on while it is killed, so the kill lands wherever it lands.
        writer = threading.Thread(target=lambda: [board.add({"title": f"t{n}", "id": f"during-{n}"})
                                                  for n in range(30)])
        writer.start()
        wait_until(lambda: len(reader.lines) >= 15, timeout=60)
        reader.end(signal.SIGKILL)
        writer.join(timeout=60)
        seen = reader.records()
        for n in range(100):  # 100 transitions while nobody reads
            if n % 2:
                board.move(f"task-{n - 1}", "cancelled")
            else:
                board.add({"title": f"after {n}", "id": f"task-{n}"})
        resumed = Stream(ws, "-f", "--json", "--since", str(seen[-1]["cursor"]))
        total = len(log_records(board))
        wait_until(lambda: len(seen) + len(resumed.lines) >= total, timeout=60)
        board.add({"title": "live", "id": "live-one"})  # and it keeps following
        wait_until(lambda: resumed.lines and json.loads(resumed.lines[-1])["task"] == "live-one", timeout=60)
        assert resumed.end() == 0
    finally:
        board.close()
    streamed = seen + resumed.records()
    cursors = [r.pop("cursor") for r in streamed]
    assert cursors == sorted(set(cursors)), "none twice"
    assert streamed == log_records(board), "none missed, in the log's order"
    assert len(streamed) == 10 + 30 + 100 + 1


def test_a_log_replaced_by_hand_under_a_follower_is_read_from_its_start(tmp_path):
    ws = make_ws(tmp_path)
    board = Board(ws / "kanban")
    try:
        board.add({"title": "one", "id": "one"})
        stream = Stream(ws, "-f", "--json")
        wait_until(lambda: len(stream.lines) == 1, timeout=60)
        # A longer log in its place: the old cursor would land in the middle of one of its lines.
        fresh = "".join(json.dumps({"at": "t", "task": f"new-{n}", "from": None, "to": "todo", "by": "me",
                                    "note": "x" * n}) + "\n" for n in range(3))
        (ws / "kanban" / "events.new").write_text(fresh)
        (ws / "kanban" / "events.new").rename(board.events_path)
        board.add({"title": "two", "id": "two"})  # appended to the new log, and a wake-up
        wait_until(lambda: stream.lines and json.loads(stream.lines[-1])["task"] == "two", timeout=60)
        assert stream.end() == 0
    finally:
        board.close()
    assert [r["task"] for r in stream.records()] == ["one", "new-0", "new-1", "new-2", "two"]
    assert stream.proc.stderr is not None and "was replaced (by hand?)" in stream.proc.stderr.read()


def test_a_reader_that_goes_away_ends_the_stream_quietly(tmp_path):
    ws = make_ws(tmp_path)
    board = Board(ws / "kanban")
    try:
        board.add({"title": "one", "id": "one"})
        proc = subprocess.Popen([*CLI, "-w", str(ws), "events", "-f"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None and "one" in proc.stdout.readline()
        proc.stdout.close()  # as `events -f | head -1` does
        for n in range(3):  # writes that find the pipe closed (the first may still fit in it)
            board.add({"title": f"more {n}", "id": f"more-{n}"})
        _, errors = proc.communicate(timeout=60)
    finally:
        board.close()
    assert proc.returncode == 0 and errors == "", errors


def test_follow_shows_a_running_team_at_work_and_a_late_half_line_only_once_complete(tmp_path, up):
    ws = make_ws(tmp_path, "- name: runner\n")
    up(ws)
    wait_until(lambda: supervisor_state(ws).get("agents", {}).get("runner", {}).get("state") == "running",
               timeout=30)
    stream = Stream(ws, "-f")
    board = Board(ws / "kanban")
    try:
        board.add({"title": "work", "id": "some-work", "steps": [{"tool": "wait", "args": {"seconds": 0.1}}]})
        wait_until(lambda: any("some-work  doing -> done" in line for line in stream.lines), timeout=90)
        moves = [line.split("  ")[2] for line in stream.lines if "  some-work  " in line]
        assert moves[0] == "- -> todo" and "todo -> doing" in moves and moves[-1] == "doing -> done", moves
        board_lines = [line for line in stream.lines if line.split("  ")[1] != "supervisor"]
        assert board_lines and all(" by " in line for line in board_lines)
        assert any(line.split("  ")[1:3] == ["supervisor", "started"] and "runner: started (pid " in line
                   for line in stream.lines), stream.lines
        # A torn line (its writer killed) is closed by the next append: skipped, never printed.
        torn = json.dumps({"at": "t", "task": "torn-one", "from": None, "to": "todo", "by": "me", "note": ""})
        with board.events_path.open("a") as handle:
            handle.write(torn[:25])
        board.add({"title": "wake", "id": "wake-up"})
        wait_until(lambda: any("wake-up" in line for line in stream.lines), timeout=60)
        assert not any("torn" in line for line in stream.lines)
        # A line still being written is printed once it is complete, whole and once.
        late = json.dumps({"at": "t", "task": "by-hand", "from": None, "to": "todo", "by": "me", "note": "x"})
        with board.events_path.open("a") as handle:
            handle.write(late[:25])
            handle.flush()
            read_before = reader_bytes(stream.proc.pid)
            # It has looked at the half line once it read past what it had (its own polls do).
            wait_until(lambda: reader_bytes(stream.proc.pid) >= read_before + 25, timeout=30)
            handle.write(late[25:] + "\n")
        wait_until(lambda: any("by-hand" in line for line in stream.lines), timeout=60)
        assert [line for line in stream.lines if "by-hand" in line] == ["t  by-hand  - -> todo  by me  x"]
    finally:
        board.close()
    assert stream.end() == 0
    assert stream.proc.stderr is not None and "1 unreadable line(s)" in stream.proc.stderr.read()


def reader_bytes(pid: int) -> int:
    """Bytes a process has read so far (all its reads, files and pipes alike)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/PID/io")


def test_a_follower_of_the_log_is_woken_by_its_appends_and_a_burst_of_them_wakes_it_a_few_times(tmp_path):
    """The log's watch bumps its signal for the log's own appends, not for other files of the board's
    folder; a burst of appends is gathered (each task appends three lines, and a follower woken for
    each, the supervisor's among them, went through every one)."""
    board = Board(tmp_path / "kanban")
    signal = board.signal
    bumps: list[bool] = []
    bump = signal.bump

    def counted(full: bool = False) -> None:  # the watch's wake-ups, counted as the watch makes them
        bumps.append(full)
        bump(full=full)
    signal.bump = counted
    board.events_path.touch()
    stop = board.watch_events()
    assert stop is not None
    try:
        for _write in range(20):
            (tmp_path / "kanban" / "notes.txt").write_text("not the log")
        assert not signal.wait(signal.generation, 0.3) and not bumps, "a write beside the log woke its follower"
        with open(board.events_path, "a") as log:
            log.write("{}\n")
        wait_until(lambda: bumps, timeout=5)
        bumps.clear()
        started = time.monotonic()
        with open(board.events_path, "a") as log:
            for _line in range(300):
                log.write("{}\n")
                log.flush()
                os.fsync(log.fileno())  # each append takes a while, as the board's own do
        wait_until(lambda: bumps, timeout=5)
        took = time.monotonic() - started
        assert len(bumps) <= took / LOG_SETTLE + 2, f"300 appends in {took:.3f} s woke the follower {len(bumps)} times"
    finally:
        stop()
        board.close()
