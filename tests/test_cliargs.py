"""The command line's numbers, JSON and text arguments as an attacker or a slip of the keyboard gives
them: a usage error (exit 2) with a clear message, never a traceback, a NaN deadline or a hang."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hermes_sup.supervisor.cli import main

from .conftest import CLI


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    assert CliRunner().invoke(main, ["init", str(tmp_path / "ws")]).exit_code == 0
    return tmp_path / "ws"


def usage_error(ws: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["-w", str(ws), *args])
    assert result.exit_code == 2, (args, result.output, result.exception)
    assert "Traceback" not in result.output and not isinstance(result.exception, (RecursionError, UnicodeError))
    return result.output


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "1e9", "ten"])
def test_down_timeout_must_be_finite_seconds_in_range(ws, value):
    output = usage_error(ws, "down", "--timeout", value)
    assert "Invalid value for '--timeout'" in output and "is not a number of seconds" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--priority", str(10**10)], "Invalid value for '--priority'"),
        (["--priority", str(-(10**10))], "Invalid value for '--priority'"),
        (["--priority", "9" * 5000], "Invalid value for '--priority'"),
        (["--max-attempts", str(10**6)], "Invalid value for '--max-attempts'"),
        (["--steps", "[" * 100_000 + "]" * 100_000], "--steps: the data is nested more than 64 levels deep"),
        (["--steps", json.dumps([{"tool": "t", "args": {"a": "[" * 63 + "1" + "]" * 63}}]).replace('"[', "[").replace(
            ']"', "]")], "--steps: the data is nested more than 64 levels deep"),
        (["--steps", json.dumps([{"tool": "t", "args": {"a": "x" * (1 << 20)}}])], "--steps is longer than 1,048,576"),
        (["--steps", "[{oops"], "--steps: invalid JSON"),
        (["--body", "caf\udce9"], "body: the argument is not UTF-8 text"),
        (["--depends-on", "a", "--depends-on", "\udcff"], "depends_on: the argument is not UTF-8 text"),
    ],
)
def test_task_add_arguments_are_bounded(ws, args, message):
    output = usage_error(ws, "task", "add", "t", *args)
    assert message in output, output
    assert CliRunner().invoke(main, ["-w", str(ws), "task", "list", "--json"]).output.count('"id"') == 0


def test_a_title_that_is_not_utf8_is_a_usage_error_also_as_json(ws):
    result = CliRunner().invoke(main, ["-w", str(ws), "task", "add", "caf\udce9", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"error": "TITLE: the argument is not UTF-8 text", "exit_code": 2}


def test_other_numbers_are_bounded(ws):
    assert "Invalid value for '-n'" in usage_error(ws, "logs", "-n", str(10**12))
    assert "Invalid value for '[VERSION]'" in usage_error(ws, "skills", "rollback", "x", str(10**12))


def test_up_with_an_empty_agents_list_is_refused_at_once(ws):
    done = subprocess.run([*CLI, "-w", str(ws), "up", "--detach", "--agents", " , "], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and "--agents names no agent; agents: worker-1, worker-2" in done.stderr, done.stderr
    assert not (ws / "runs" / "supervisor.json").exists()


@pytest.mark.parametrize("state", [
    {"pid": "x"}, {"pid": 1, "pid_started": "x"}, {"agents": [1]}, {"agents": {"a": 1}},
    {"agents": {"a": {"pid": "12", "pid_started": [], "restarts": "many", "task": {"x": 1}}}}, [1, 2], "text",
])
def test_a_damaged_or_forged_state_file_never_crashes_status_down_or_restart(ws, state):
    (ws / "runs" / "supervisor.json").write_text(json.dumps(state))
    for args, code in ((["status"], 0), (["status", "--json"], 0), (["down"], 0), (["restart", "a"], 1)):
        result = CliRunner().invoke(main, ["-w", str(ws), *args])
        assert result.exit_code == code and not isinstance(result.exception, (TypeError, AttributeError)), \
            (args, result.output, result.exception)


def test_down_never_signals_a_process_that_is_not_the_supervisor(ws):
    import psutil

    victim = subprocess.Popen(["sleep", "60"])
    try:
        started = psutil.Process(victim.pid).create_time()
        (ws / "runs" / "supervisor.json").write_text(json.dumps({"pid": victim.pid, "pid_started": started}))
        result = CliRunner().invoke(main, ["-w", str(ws), "down", "--timeout", "1"])
        assert result.exit_code == 1, result.output
        assert f"pid {victim.pid} in {ws / 'runs' / 'supervisor.json'} is not hermes-sup up" in result.output
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_logs_reads_the_tail_of_a_large_log_and_refuses_a_fifo(ws):
    log = ws / "runs" / "worker-1" / "agent.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {index}\n" for index in range(200_000)))  # about 2.3 MB, many blocks
    result = CliRunner().invoke(main, ["-w", str(ws), "logs", "worker-1", "-n", "3"])
    assert result.exit_code == 0 and result.output == "".join(
        f"worker-1 | line {index}\n" for index in (199_997, 199_998, 199_999)), result.output
    result = CliRunner().invoke(main, ["-w", str(ws), "logs", "worker-1", "-n", "1000000"])
    assert result.output.count("\n") == 200_000 and result.output.startswith("worker-1 | line 0\n")
    fifo = ws / "runs" / "worker-2" / "agent.log"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)  # reading it would block until someone writes
    done = subprocess.run([*CLI, "-w", str(ws), "logs"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert f"note: {fifo} is not a regular file; not reading it" in done.stderr
    assert "worker-1 | line 199999\n" in done.stdout


def test_usage_counts_a_damaged_record_without_crashing_or_pricing_it(ws):
    log = ws / "runs" / "worker-1" / "llm_calls.jsonl"
    log.parent.mkdir(parents=True)
    records = [{"outcome": "ok", "tokens_in": "abc", "cost_usd": "x"}, {"outcome": "ok", "tokens_out": 1e400},
               {"outcome": "ok", "cost_usd": float("nan")}, {"outcome": "ok", "tokens_in": 5, "cost_usd": 0.5}]
    log.write_text("".join(json.dumps(record) + "\n" for record in records))
    result = CliRunner().invoke(main, ["-w", str(ws), "usage", "--json"])
    assert result.exit_code == 0, result.exception
    total = json.loads(result.stdout)["total"]
    assert (total["calls"], total["tokens_in"], total["tokens_out"], total["cost_usd"], total["unpriced_calls"]) == \
        (4, 5, 0, 0.5, 3)
    result = CliRunner().invoke(main, ["-w", str(ws), "usage"])
    assert result.exit_code == 0 and "total: 4 calls" in result.output and "nan" not in result.output


def test_a_skill_name_cannot_lead_out_of_skills(ws, tmp_path):
    from hermes_sup.agents.skills import Skills
    from hermes_sup.agents.tools import ToolError

    (ws / "skills" / ".history").mkdir(parents=True)
    (ws / "evil").mkdir()
    (ws / "evil" / "1.py").write_text("print('planted')\n")
    for args in (["skills", "rollback", "../../evil"], ["skills", "history", "../../evil"]):
        result = CliRunner().invoke(main, ["-w", str(ws), *args])
        assert result.exit_code == 2 and "'../../evil' is not a skill name" in result.output, result.output
    with pytest.raises(ToolError, match="must match"):  # what skill_manage's rollback calls
        Skills(ws).rollback("../../evil", by="agent")
    assert not (tmp_path / "evil.py").exists()


@pytest.mark.parametrize(("answer", "message"), [
    (b'{"ok": false, "message": 5}\n', "error: 5"),
    (b"[1]\n", "answered something that is not a reply"),
    (b"\x00garbage\n", "answered something that is not a reply"),
    (b"[" * 100_000 + b"\n", "answered something that is not a reply"),
])
def test_a_strange_answer_on_the_control_socket_is_an_error_message(ws, answer, message):
    import socket
    import threading

    import psutil

    me = psutil.Process()
    (ws / "runs" / "supervisor.json").write_text(json.dumps({"pid": me.pid, "pid_started": me.create_time()}))
    (ws / "runs" / "sockets").mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(ws / "runs" / "sockets" / "control.sock"))
        server.listen(1)

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(answer)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        result = CliRunner().invoke(main, ["-w", str(ws), "restart", "a"])
        thread.join(timeout=10)
    assert result.exit_code == 1 and message in result.output, (result.output, result.exception)


@pytest.mark.parametrize("children", [5, {"a": 1}, [{"pid": "x"}, {"pid": 2**80}, {"pid": -3}, "child"]])
def test_status_survives_a_damaged_state_json_of_a_running_agent(ws, children):
    import psutil

    me = psutil.Process()  # stands in for a running agent: its pid and start time match
    (ws / "runs" / "supervisor.json").write_text(json.dumps(
        {"agents": {"a": {"pid": me.pid, "pid_started": me.create_time(), "state": "running"}}}))
    (ws / "runs" / "a").mkdir()
    (ws / "runs" / "a" / "state.json").write_text(json.dumps({"children": children}))
    result = CliRunner().invoke(main, ["-w", str(ws), "status", "--json"])
    assert result.exit_code == 0, result.exception
    assert json.loads(result.stdout)["agents"][0]["children"] == []


def test_an_answer_trickled_on_the_control_socket_does_not_hold_status(ws):
    import socket
    import threading
    import time

    import psutil

    me = psutil.Process()
    (ws / "runs" / "supervisor.json").write_text(json.dumps({"pid": me.pid, "pid_started": me.create_time()}))
    done = threading.Event()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        (ws / "runs" / "sockets").mkdir(mode=0o700)
        server.bind(str(ws / "runs" / "sockets" / "control.sock"))
        server.listen(1)

        def serve() -> None:  # one byte of an endless answer every 0.1 s, for up to 60 s
            conn, _ = server.accept()
            with conn:
                conn.settimeout(1)
                for _ in range(600):
                    if done.wait(0.1):
                        return
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        return

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        began = time.monotonic()
        result = CliRunner().invoke(main, ["-w", str(ws), "status", "--json"])
        took = time.monotonic() - began
        done.set()
        thread.join(timeout=10)
    assert took < 20, f"status waited {took:.0f} s for a trickled answer"  # its own limit is 5 s
    assert result.exit_code == 1 and "did not come in time" in result.output, (result.output, result.exception)


def test_up_detach_waits_as_long_as_agents_keep_coming_up_and_no_longer():
    """256 agents on 2 cores took more than the fixed 60 s `up --detach` waited: it now waits while one
    more agent starts or becomes ready at least once a minute, and gives up after a minute of none."""
    from hermes_sup.supervisor.cli.run import Stall, ready_progress

    stall = Stall(60.0, now=0.0)
    agents = {f"a{i}": {"state": "starting", "pid": None} for i in range(256)}
    for i, name in enumerate(agents):  # one more agent ready every 50 s: over three and a half hours
        agents[name] = {"state": "running", "pid": 1000 + i}
        assert not stall.stalled(ready_progress(agents), now=50.0 * (i + 1))
    assert not stall.stalled(ready_progress(agents), now=50.0 * 256 + 60.0)
    assert stall.stalled(ready_progress(agents), now=50.0 * 256 + 60.1), "a minute of nothing is a stall"
    assert ready_progress({"a": {"state": "starting", "pid": 5}, "b": {"state": "backoff"}}) == (1, 1)
