"""What the agents' logs say: one stamped line per outcome, `logs` compose style and `--since`, with
real teams (a real `up`, the scripted LLM server) and the pure parts alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hermes_sup.agents.logline import call_line, model_line, short, stamp
from hermes_sup.kanban import Board
from hermes_sup.supervisor.cli.logs import SinceFilter, parse_since
from hermes_sup.supervisor.views import logtext

from .conftest import CLI, wait_until
from .test_supervisor import hermes, llm_workspace, make_ws

ROOT = Path(__file__).resolve().parent.parent
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


# -- pure parts -------------------------------------------------------------------------------------

def test_short_is_one_plain_line_cut_to_its_limit():
    assert short("fix\nthe\x1b[31m bug\u2028now\x9b") == "fix the [31m bug now"
    assert short("x" * 500, 10) == "x" * 9 + "…"
    assert short("exactly ten", 11) == "exactly ten"
    assert short({"path": "a\nb"}) == '{"path": "a\\nb"}'  # arguments as JSON: the newline is escaped
    huge = "y" * 10_000_000
    assert len(short(huge)) == 80


def test_call_and_model_lines_say_name_args_outcome_and_duration():
    assert call_line("t1", "tool", "read_file", {"path": "a.txt"}, "ok", 0.0123) == \
        't1 tool read_file({"path": "a.txt"}) ok 12ms'
    line = call_line("t1", "step 2", "terminal", {"cmd": "x"}, "error", 2.5, "error: exit 1\nboom")
    assert line == 't1 step 2 terminal({"cmd": "x"}) error 2.5s: error: exit 1 boom'
    record = {"task": "t1", "provider": "p", "model": "m", "tokens_in": 120, "tokens_out": 7, "latency_s": 0.8,
              "outcome": "ok", "error": None}
    assert model_line(record) == "t1 model p m 120 in / 7 out tokens 0.8s ok"
    assert model_line({**record, "outcome": "rate_limit", "error": "slow\ndown"}).endswith("rate_limit: slow down")


def test_stamp_is_utc_to_the_second_and_read_back():
    assert stamp(86400 * 365) == "1971-01-01T00:00:00Z"
    assert logtext.line_time(f"{stamp(1_800_000_000)} a: b") == 1_800_000_000
    assert logtext.line_time("Traceback (most recent call last):") is None


def test_agent_colour_is_stable_across_processes_and_never_red():
    code = "from hermes_sup.supervisor.views.logtext import agent_colour; print(agent_colour('worker-1'))"
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2", "3")}
    assert seen == {logtext.agent_colour("worker-1")}
    colours = {logtext.agent_colour(f"agent-{i}") for i in range(40)}
    assert len(colours) > 3 and not any("red" in colour for colour in colours)


def test_parse_since_takes_durations_and_iso_times():
    now = 1_800_000_000.0
    assert parse_since("10m", now) == now - 600
    assert parse_since("2h", now) == now - 7200
    assert parse_since("1.5d", now) == now - 1.5 * 86400
    assert parse_since("30s", now) == now - 30
    assert parse_since("1970-01-01T00:01:00Z", now) == 60
    assert parse_since("1970-01-01T01:01:00+01:00", now) == 60
    for bad in ("10 minutes", "", "-5m", "yesterday", "2026-13-01"):
        with pytest.raises(ValueError, match="--since wants"):
            parse_since(bad, now)


def test_since_filter_keeps_a_traceback_with_its_line():
    keep = SinceFilter(100.0)
    lines = ["old without a time", f"{stamp(50)} a: old", "  its traceback", f"{stamp(100)} a: new", "  its traceback",
             f"{stamp(150)} a: newer"]
    assert [line for line in lines if keep.keep(line)] == lines[3:]
    assert all(SinceFilter(None).keep(line) for line in lines)


def test_log_text_drops_the_agents_own_name_only():
    assert logtext.log_text("w", f"{stamp(0)} w: claimed x") == "1970-01-01T00:00:00Z claimed x"
    assert logtext.log_text("w", f"{stamp(0)} other: hi") == "1970-01-01T00:00:00Z other: hi"
    assert logtext.log_text("w", "w: plain\x1b") == "w: plain\\x1b"


# -- with real teams --------------------------------------------------------------------------------

def log_of(ws: Path, name: str) -> str:
    """The agent's log, or "" before it has one: `up` has returned once the supervisor runs, which
    may be before it started the agent (with the fork server, once the server is ready)."""
    try:
        return (ws / "runs" / name / "agent.log").read_text()
    except FileNotFoundError:
        return ""


def test_a_model_task_logs_claimed_each_model_and_tool_call_and_done(tmp_path, up):
    from .llm_server import ScriptedLLM, openai_reply

    with ScriptedLLM() as llm:
        ws = llm_workspace(tmp_path, llm)
        llm.script("openai",
                   openai_reply(tool_calls=[("write_file", {"path": "draft.txt", "content": "first\ndraft"})],
                                prompt=321, completion=12),
                   openai_reply("The draft is written.", prompt=400, completion=5))
        board = Board(ws / "kanban")
        task = board.add({"title": "write a\x1b[2J draft\nforged: done"})
        up(ws)
        wait_until(lambda: f"done {task['id']}" in log_of(ws, "thinker"), timeout=60)
        board.close()
        lines = [line for line in log_of(ws, "thinker").splitlines() if task["id"] in line]
        assert all(re.match(f"{STAMP} thinker: ", line) for line in lines), lines
        said = [line.split(": ", 1)[1] for line in lines]
        assert said[0] == f"claimed {task['id']} (write a [2J draft forged: done)"
        assert re.fullmatch(rf"{task['id']} model scripted scripted-gpt 321 in / 12 out tokens \S+ ok", said[1])
        assert re.fullmatch(rf'{task["id"]} tool write_file\(\{{"path": "draft.txt", "content": "first\\ndraft"\}}\) '
                            r"ok \S+", said[2]), said[2]
        assert re.fullmatch(rf"{task['id']} model scripted scripted-gpt 400 in / 5 out tokens \S+ ok", said[3])
        assert said[4:] == [f"done {task['id']}"]
        # `up`'s merged stream shows the same lines, one output line each, under the agent's name.
        wait_until(lambda: f"done {task['id']}" in (tmp_path / "up.log").read_text(), timeout=30)
        up_log = (tmp_path / "up.log").read_text()
        assert re.search(rf"^thinker \| {STAMP} claimed {task['id']} \(write a \[2J draft forged: done\)$",
                         up_log, re.M), up_log
        assert re.search(rf"^thinker \| {STAMP} done {task['id']}$", up_log, re.M)
        assert "\x1b" not in up_log


def test_steps_log_each_step_failed_and_cancelled(tmp_path, up):
    ws = make_ws(tmp_path, "- name: runner\n")
    board = Board(ws / "kanban")
    bad = board.add({"title": "bad", "steps": [{"tool": "wait", "args": {"seconds": 0.01}}, {"tool": "no_such_tool"}]})
    up(ws)
    wait_until(lambda: f"failed {bad['id']}" in log_of(ws, "runner"), timeout=60)
    slow = board.add({"title": "slow", "steps": [{"tool": "wait", "args": {"seconds": 120}}]})
    wait_until(lambda: f"claimed {slow['id']}" in log_of(ws, "runner"), timeout=60)
    assert hermes(ws, "task", "cancel", slow["id"]).returncode == 0
    wait_until(lambda: f"cancelled {slow['id']}" in log_of(ws, "runner"), timeout=60)
    board.close()
    said = [line.split(": ", 1)[1] for line in log_of(ws, "runner").splitlines() if re.match(f"{STAMP} runner: ", line)]
    mine = [line for line in said if bad["id"] in line]
    assert mine[0] == f"claimed {bad['id']} (bad)"
    assert re.fullmatch(rf'{bad["id"]} step 1 wait\(\{{"seconds": 0.01\}}\) ok \S+', mine[1]), mine
    assert re.fullmatch(rf"{bad['id']} step 2 no_such_tool\((\{{\}})?\) error \S+: error: .*no_such_tool.*",
                        mine[2]), mine
    assert mine[3].startswith(f"failed {bad['id']}: step 2 (no_such_tool)"), mine
    assert any(line.startswith(f"cancelled {slow['id']} (by ") for line in said), said


def test_logs_since_and_piped_output_one_line_each_without_colour(tmp_path):
    ws = make_ws(tmp_path, "- name: alpha\n- name: beta\n")
    now = time.time()
    long_text = "word " * 100
    for name, lines in {"alpha": [f"{stamp(now - 7200)} alpha: two hours ago", "  a traceback of it",
                                  f"{stamp(now - 60)} alpha: a minute ago {long_text}"],
                        "beta": ["no time at all", f"{stamp(now - 1200)} beta: twenty minutes ago",
                                 f"{stamp(now)} beta: now"]}.items():
        (ws / "runs" / name).mkdir(parents=True, exist_ok=True)
        (ws / "runs" / name / "agent.log").write_text("".join(f"{line}\n" for line in lines))
    recent = hermes(ws, "logs", "--since", "10m")
    assert recent.returncode == 0, recent.stderr
    assert recent.stdout.splitlines() == [f"alpha | {stamp(now - 60)} a minute ago {long_text}",
                                          f"beta  | {stamp(now)} now"]
    assert "\x1b" not in recent.stdout  # piped: no colour codes, no wrapping of the long line
    hour = hermes(ws, "logs", "beta", "--since", "1h")
    assert hour.stdout.splitlines() == [f"beta | {stamp(now - 1200)} twenty minutes ago", f"beta | {stamp(now)} now"]
    since_iso = hermes(ws, "logs", "alpha", "--since", stamp(now - 7200))
    assert len(since_iso.stdout.splitlines()) == 3
    limited = hermes(ws, "logs", "alpha", "--since", "3h", "-n", "1")
    assert limited.stdout.splitlines() == [f"alpha | {stamp(now - 60)} a minute ago {long_text}"]
    wrong = hermes(ws, "logs", "--since", "yesterday")
    assert wrong.returncode == 2 and "--since wants" in wrong.stderr and wrong.stdout == ""
    everything = hermes(ws, "logs")
    assert "beta  | no time at all" in everything.stdout.splitlines()


# -- rejected drops ---------------------------------------------------------------------------------

def test_rejection_lines_come_from_the_records_that_say_rejected():
    from hermes_sup.supervisor.ingestwarn import rejections

    records = [{"task": "a.json", "from": "inbox", "to": "rejected", "by": "ingest", "note": "missing title"},
               {"task": "t1", "from": "todo", "to": "doing", "by": "w", "note": ""},
               {"task": ["forged"], "to": "rejected"},
               {"task": "x" * 1000, "to": "rejected", "note": None}]
    assert rejections(records) == ["rejected a.json: missing title", f"rejected {'x' * 120}: no reason given"]


def test_recent_rejections_are_newest_first_and_a_planted_fifo_is_not_read(tmp_path):
    from hermes_sup.supervisor.ingestwarn import recent_rejections

    folder = tmp_path / "rejected"
    folder.mkdir()
    for index in range(7):
        note = folder / f"drop-{index}.json.error.txt"
        note.write_text(f"inbox/drop-{index}.json was rejected on then: reason {index}\nFix the file.\n")
        os.utime(note, (1_000_000 + index, 1_000_000 + index))
    os.mkfifo(folder / "trap.error.txt")
    latest, total = recent_rejections(folder, 3)
    assert total == 7 and [item["file"] for item in latest] == ["drop-6.json", "drop-5.json", "drop-4.json"]
    assert latest[0]["note"] == "inbox/drop-6.json was rejected on then: reason 6"
    assert recent_rejections(tmp_path / "missing") == ([], 0)


def test_a_rejected_drop_shows_at_once_in_ups_stream_and_in_board_and_board_watch(tmp_path, up):
    name = "no-title-" + "x" * 90 + ".json"  # a line longer than a terminal: never wrapped when piped
    ws = make_ws(tmp_path, "- name: runner\n")
    up(ws)
    watch = subprocess.Popen([*CLI, "-w", str(ws), "board", "--watch"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.extend(iter(watch.stdout.readline, "")), daemon=True)
        reader.start()
        wait_until(lambda: any("todo" in line for line in seen), timeout=60)  # drawn once
        drop = ws / "kanban" / "inbox" / name
        drop.write_bytes(b'{"body": "no title here"}')
        then = time.time() - 5
        os.utime(drop, (then, then))
        wait_until(lambda: f"rejected {name}: " in (tmp_path / "up.log").read_text(), timeout=60)
        assert re.search(rf"^\d\d:\d\d:\d\d rejected {re.escape(name)}: .*missing title.*$",
                         (tmp_path / "up.log").read_text(), re.M)
        wait_until(lambda: any(line.startswith(f"rejected: inbox/{name} was rejected on") for line in seen),
                   timeout=60)
    finally:
        watch.terminate()
        watch.wait(timeout=30)
    shown = hermes(ws, "board")
    assert any(line.startswith(f"rejected: inbox/{name} was rejected on") and "missing title" in line
               for line in shown.stdout.splitlines()), shown.stdout
    document = json.loads(hermes(ws, "board", "--json").stdout)
    assert document["rejected"]["total"] == 1 and document["rejected"]["latest"][0]["file"] == name


def test_event_stamps_and_rejection_lines_for_logs():
    from hermes_sup.supervisor.cli.logs import event_stamp, rejection_lines

    assert event_stamp("2026-11-22T17:58:30.123456Z", 0) == "2026-11-22T17:58:30Z"
    assert event_stamp("forged\nline", 0) == event_stamp(None, 0) == "1970-01-01T00:00:00Z"
    records = [{"at": "2026-11-22T17:58:30.1Z", "task": "a.json", "to": "rejected", "note": "missing title"},
               {"at": "2026-11-22T17:58:31.1Z", "task": "t", "to": "done"}]
    assert rejection_lines(records, 0) == ["2026-11-22T17:58:30Z rejected a.json: missing title"]


def test_logs_shows_the_boards_rejections_in_its_tail_and_while_following(tmp_path):
    ws = make_ws(tmp_path, "- name: alpha\n")

    def drop(name: str) -> None:
        path = ws / "kanban" / "inbox" / name
        path.write_bytes(b'{"body": "no title here"}')
        os.utime(path, (time.time() - 5, time.time() - 5))
        assert hermes(ws, "board").returncode == 0  # a board command ingests what waits in inbox/

    drop("first.json")
    shown = hermes(ws, "logs").stdout.splitlines()
    assert len(shown) == 1 and re.fullmatch(rf"board \| {STAMP} rejected first\.json: inbox/first\.json was "
                                            r"rejected on .*missing title.*", shown[0]), shown
    assert hermes(ws, "logs", "alpha").stdout == "", "one agent's logs are that agent's only"
    assert hermes(ws, "logs", "--since", "2099-01-01T00:00:00Z").stdout == ""
    follow = subprocess.Popen([*CLI, "-w", str(ws), "logs", "-f", "-n", "1"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        seen: list[str] = []
        threading.Thread(target=lambda: seen.extend(iter(follow.stdout.readline, "")), daemon=True).start()
        # Its tail is printed once it has marked where the events it follows begin.
        wait_until(lambda: any("rejected first.json" in line for line in seen), timeout=60)
        drop("second.json")
        wait_until(lambda: any("rejected second.json: missing title" in line for line in seen), timeout=60)
        assert sum("first.json" in line for line in seen) == 1 and len(seen) == 2, seen
    finally:
        follow.terminate()
        follow.wait(timeout=30)


def test_steps_log_blocked_with_the_question_and_released_when_the_agent_stops(tmp_path, up):
    ws = make_ws(tmp_path, "- name: runner\n")
    board = Board(ws / "kanban")
    asks = board.add({"title": "asks", "steps": [{"tool": "ask_human", "args": {"question": "which\nbranch?"}}]})
    up(ws)
    wait_until(lambda: f"blocked {asks['id']}" in log_of(ws, "runner"), timeout=60)
    slow = board.add({"title": "slow", "steps": [{"tool": "wait", "args": {"seconds": 120}}]})
    wait_until(lambda: f"claimed {slow['id']}" in log_of(ws, "runner"), timeout=60)
    assert hermes(ws, "stop", "runner").returncode == 0
    wait_until(lambda: f"released {slow['id']}" in log_of(ws, "runner"), timeout=60)
    board.close()
    said = [line.split(": ", 1)[1] for line in log_of(ws, "runner").splitlines() if re.match(f"{STAMP} runner: ", line)]
    assert f"blocked {asks['id']}: question: which branch?" in said, said
    assert any(re.fullmatch(rf"released {slow['id']}: stopping \(.+\)", line) for line in said), said


@pytest.mark.parametrize(("no_color", "coloured"), [(None, True), ("1", False)])
def test_logs_at_a_terminal_colour_the_names_unless_no_color_is_set(tmp_path, no_color, coloured):
    import pty

    ws = make_ws(tmp_path, "- name: alpha\n")
    (ws / "runs" / "alpha").mkdir(parents=True, exist_ok=True)
    (ws / "runs" / "alpha" / "agent.log").write_text(f"{stamp(time.time())} alpha: hello\n")
    env = {key: value for key, value in os.environ.items() if key not in ("NO_COLOR", "TERM")}
    env["TERM"] = "xterm"
    if no_color is not None:
        env["NO_COLOR"] = no_color
    main, other = pty.openpty()
    try:
        done = subprocess.run([*CLI, "-w", str(ws), "logs"], stdout=other, stderr=subprocess.PIPE, env=env,
                              timeout=60)
        os.close(other)
        other = -1
        seen = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: the terminal's other end is closed and everything was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(main)
        if other != -1:
            os.close(other)
    assert done.returncode == 0, done.stderr
    assert b"hello" in seen
    assert (b"\x1b[" in seen) is coloured, seen
