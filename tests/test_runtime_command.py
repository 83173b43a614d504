"""`runtime: command` (agents/clirun.py): an agent that works each task by running an agent CLI. A
small CLI that misbehaves on request (fails, floods, hangs, ignores SIGTERM, leaves a grandchild,
writes a result file) run by a real `up`: every supervision promise holds for it; then the decisions,
pure, and the config's refusals with file:line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from hermes_sup.agents.clirun import RESULT_FILE, _result, argv_problem, fill, judge, work
from hermes_sup.agents.tools import ToolContext
from hermes_sup.kanban import Board, TaskNotFound
from hermes_sup.kanban.events import event_fields
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import CLI, ROOT, init_workspace, marked_sleep, running, wait_until

FAKE_CLI = '''
import os, signal, subprocess, sys, time
prompt, task_id, workdir = sys.argv[1:4]
print(f"cli on {task_id} in {os.getcwd()} (workdir {workdir})", flush=True)
if "STUBBORN" in prompt:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "HANG-ONCE" in prompt and not os.path.exists("hung-once"):
    open("hung-once", "w").close()
    while True:
        time.sleep(1)
if "HANG" in prompt and "HANG-ONCE" not in prompt:
    while True:
        time.sleep(1)
if "GRANDCHILD" in prompt:
    subprocess.Popen(prompt.split("GRANDCHILD ")[1].split()[:2], start_new_session=True)
if "FLOOD" in prompt:
    for _ in range(800):
        sys.stdout.buffer.write(b"x" * 65536 + b"\\n")
if "RESULT" in prompt:
    with open(os.environ["HERMES_SUP_RESULT"], "w") as handle:
        handle.write("from the result file")
if "FAIL" in prompt:
    for i in range(30):
        print(f"line {i}")
    print("it went wrong")
    sys.exit(3)
print(f"answer to {task_id}: key={os.environ.get('OPENAI_API_KEY', 'none')} "
      f"given={os.environ.get('CLI_KEY', 'none')}")
'''


@pytest.fixture
def team(tmp_path, up):
    ws = tmp_path / "ws"
    init_workspace(ws)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "fake_cli.py").write_text(FAKE_CLI)
    argv = json.dumps([sys.executable, str(tmp_path / "bin" / "fake_cli.py"), "{prompt}", "{task_id}", "{workdir}"])
    (ws / "hermes.yaml").write_text(f"""\
folders: {{bin: {{path: '{tmp_path / "bin"}'}}}}
defaults:
  restart: {{policy: always, backoff: {{initial: 0.1, max: 0.5}}}}
  stop_timeout: 5
  folders: [bin]
agents:
  - name: cli
    count: 2
    roles: [work]                # an agent with roles takes role-less tasks too: every task here has one
    runtime: command
    argv: {argv}
  - name: quick
    roles: [quick]
    runtime: command
    argv: {argv}
    max_runtime: 3
    env_from: {{CLI_KEY: SUPERVISORS_CLI_KEY}}
""")
    os.environ.update(OPENAI_API_KEY="sk-SUPERVISORS-OWN", SUPERVISORS_CLI_KEY="sk-FOR-THE-CLI")
    try:
        up(ws)
    finally:
        del os.environ["OPENAI_API_KEY"], os.environ["SUPERVISORS_CLI_KEY"]
    return ws, Board(ws / "kanban")


def ended(board: Board, task_id: str) -> dict | None:
    try:
        doc = board.get(task_id)
    except TaskNotFound:
        return None
    return doc if doc["status"] in ("done", "failed", "blocked", "cancelled") else None


def test_a_cli_worker_is_done_failed_bounded_and_leaves_nothing(team):
    ws, board = team
    mark = marked_sleep()
    work = {"role": "work"}
    tasks = {"plain": {"title": "say hi", **work}, "fails": {"title": "FAIL please", "max_attempts": 1, **work},
             "result": {"title": "RESULT in a file", **work}, "floods": {"title": "FLOOD the output", **work},
             "spawns": {"title": f"GRANDCHILD {mark} stays?", **work},
             "too-long": {"title": "HANG for ever", "role": "quick", "max_attempts": 1},
             "named": {"title": "say hi with a key", "role": "quick"}}
    for task_id, fields in tasks.items():
        board.add({"id": task_id, **fields})
    docs = {task_id: wait_until(lambda t=task_id: ended(board, t), timeout=120) for task_id in tasks}
    assert docs["plain"]["status"] == "done"
    assert docs["plain"]["result"]["answer"].strip().endswith("answer to plain: key=none given=none"), \
        "no key reaches the CLI"
    given = docs["named"]["result"]["answer"].strip()
    assert given.endswith("key=none given=sk-FOR-THE-CLI"), "but the one env_from names"
    assert docs["fails"]["status"] == "failed"
    reason = docs["fails"]["history"][-1]["note"]
    assert "exited with status 3" in reason
    assert "it went wrong" in reason and "line 29" in reason and "line 5\n" not in reason, "the last lines"
    assert docs["result"]["result"]["answer"] == "from the result file"
    flood = docs["floods"]["result"]["answer"]
    assert docs["floods"]["status"] == "done" and len(flood) < 100_000 and "cut" in flood
    assert docs["spawns"]["status"] == "done"
    wait_until(lambda: not running(mark), timeout=10)
    assert docs["too-long"]["status"] == "failed"
    assert "ran longer than max_runtime (3 s)" in docs["too-long"]["history"][-1]["note"]
    wait_until(lambda: not running("Task too-long:"), timeout=10)
    assert "; runtime: command (python" in (ws / "runs" / "quick" / "agent.log").read_text()
    starts = [event_fields(json.loads(line)) or {} for line in (ws / "kanban/events.jsonl").read_text().splitlines()]
    assert {e.get("start") for e in starts if e.get("event") == "started"} == {"exec"}, \
        "a runtime: agent is exec'd, the fork server on or not"
    usage = subprocess.run([*CLI, "-w", str(ws), "usage", "--json"], capture_output=True, text=True, cwd=ROOT)
    notes = json.loads(usage.stdout)["notes"]
    assert "agent quick runs a CLI (runtime: command) that reports no tokens or cost: its runs are not in these " \
           "figures" in notes, "usage says what it cannot count"


@pytest.mark.parametrize("how", ["HANG", "STUBBORN HANG"])
def test_a_cancel_stops_the_cli_within_a_second_or_two(team, how):
    ws, board = team
    board.add({"id": "hangs", "title": f"{how} here", "role": "work"})
    wait_until(lambda: running("Task hangs:"), timeout=60)
    cancelled = time.monotonic()
    done = subprocess.run([*CLI, "-w", str(ws), "task", "cancel", "hangs"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: not running("Task hangs:"), timeout=10)
    assert time.monotonic() - cancelled < 3.0
    assert board.get("hangs")["status"] == "cancelled"


def test_a_killed_cli_agent_gives_its_task_back_and_the_next_attempt_finishes_it(team):
    ws, board = team
    board.add({"id": "once", "title": "HANG-ONCE then answer", "role": "work", "max_attempts": 2})
    wait_until(lambda: running("Task once:"), timeout=60)
    # Killed only once the CLI has left its mark: killed before, its next attempt would hang too.
    wait_until(lambda: list(ws.rglob("hung-once")), timeout=30)
    doc = board.get("once")
    assert doc["claim"], doc
    os.kill(doc["claim"]["pid"], signal.SIGKILL)
    doc = wait_until(lambda: ended(board, "once"), timeout=120)
    assert doc["status"] == "done" and "answer to once" in doc["result"]["answer"]
    assert doc["attempts"] == 2, "the killed run was an attempt; the next one finished it"
    wait_until(lambda: not running("Task once:"), timeout=10)


# -- the decisions, pure -------------------------------------------------------------------------------

def test_each_placeholder_is_one_argument_whatever_the_task_holds():
    hostile = "x'; rm -rf / #$(id) {task_id} {{"
    assert fill(["cli", "-p", "{prompt}", "--id={task_id}", "{workdir}/out", "{{literal}}"],
                {"prompt": hostile, "task_id": "t-1", "workdir": "/w"}) == \
        ["cli", "-p", hostile, "--id=t-1", "/w/out", "{literal}"]


@pytest.mark.parametrize("argv, problem", [
    ([], "non-empty list"), ("codex exec", "non-empty list"), (["codex", ""], "non-empty list"),
    (["codex", "a\0b"], "non-empty list"),
    (["codex", "{prmpt}"], "names {prmpt}; the placeholders are {prompt}, {task_id}, {workdir}"),
    (["codex", "{prompt"], "brace that is not closed"), (["{prompt}"], "start with the program itself"),
    (["codex", "{prompt.__class__}"], "names {prompt.__class__}"),
])
def test_an_argv_that_cannot_run_says_why(argv, problem):
    assert problem in argv_problem(argv)
    assert argv_problem(["codex", "exec", "{prompt}", "--cd", "{workdir}"]) == ""


def test_a_run_is_judged_by_its_exit_and_its_output():
    kwargs = {"stopped": False, "timed_out": False, "max_runtime": 60, "program": "codex"}
    assert judge(0, "the answer\n", None, **kwargs).result == {"answer": "the answer\n"}
    assert judge(0, "log", "from file", **kwargs).result == {"answer": "from file", "output": "log"}
    failed = judge(2, "\n".join(f"l{i}" for i in range(50)), None, **kwargs)
    assert failed.kind == "failed" and failed.reason.startswith("codex exited with status 2")
    assert "l49" in failed.reason and "l29" not in failed.reason
    assert judge(0, "", None, **{**kwargs, "stopped": True}).kind == "interrupted"
    assert judge(1, "oops", None, **kwargs).kind == judge(-15, "", None, **kwargs).kind == "failed"
    assert "longer than max_runtime (60 s)" in judge(None, "", None, **{**kwargs, "timed_out": True}).reason


@pytest.mark.parametrize("entry, message", [
    ("runtime: codex", "'runtime' must be one of builtin, command"),
    ("runtime: command", "'argv' must be a non-empty list"),
    ("runtime: command\n    argv: [codex, '{promt}']", "'argv' item '{promt}' names {promt}"),
    ("argv: [codex]", "'argv' is for runtime: command"),
    ("runtime: command\n    argv: [codex]\n    max_runtime: 0", "'max_runtime' must be a number of seconds > 0"),
    ("runtime: hermes", "runtime: hermes needs 'profile'"),
    ("runtime: command\n    argv: [codex]\n    env_from: {OPENAI_API_KEY: sk-123}", "'env_from' must map"),
    ("env_from: {A: B}", "'env_from' is for runtime: command"),
    ("runtime: command\n    argv: [codex]\nbudgets: {tasks: {max_cost: 1}}",
     "a runtime: command agent's spend is not measured"),
])
def test_a_runtime_that_cannot_work_is_refused_with_file_and_line(tmp_path, entry, message):
    path = tmp_path / "hermes.yaml"
    path.write_text(f"agents:\n  - name: a\n    {entry}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, skills=lambda: ())
    assert f"{path}:2: agent a: {message}" in str(info.value)


def test_doctor_says_how_a_cli_agent_is_confined_and_names_no_agent_that_runs_nothing(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("agents:\n  - name: cli\n    runtime: command\n    argv: [echo, '{prompt}']\n"
                                    "  - name: plain\n    capabilities: [fs.read]\n")
    done = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True, cwd=ROOT)
    checks = [c for c in json.loads(done.stdout)["checks"] if c["name"].startswith("sandbox")]
    assert [c["name"] for c in checks] == ["sandbox: auto (cli)"]
    assert checks[0]["level"] in ("ok", "warn") and "confined by" in checks[0]["detail"]


# -- the shell around the decisions, without a supervisor ------------------------------------------

def direct(tmp_path, argv: list[str], mode: str = "none") -> tuple[ToolContext, dict]:
    (tmp_path / "work").mkdir(exist_ok=True)
    ctx = ToolContext(scratch=tmp_path / "work", stop=threading.Event(), task={"id": "t1"},
                      settings={"sandbox": mode, "runtime": {"kind": "command", "argv": argv, "max_runtime": 30}})
    return ctx, {}


def test_a_stop_gives_the_task_back_and_never_spends_its_attempt(tmp_path):
    """A stop (down, a restart) is not the task's failure: the run is interrupted, not failed."""
    ctx, _ = direct(tmp_path, ["sleep", "30"])
    threading.Timer(0.5, ctx.stop.set).start()
    started = time.monotonic()
    assert work(ctx, "p", ()).kind == "interrupted"
    assert time.monotonic() - started < 5


def test_only_this_runs_result_file_is_its_result_and_never_through_a_link_or_a_fifo(tmp_path):
    ctx, _ = direct(tmp_path, ["sh", "-c", "echo from stdout"])
    (ctx.scratch / RESULT_FILE).write_text("stale, from an earlier attempt")
    assert work(ctx, "p", ()).result["answer"] == "from stdout\n"
    (tmp_path / "secret.txt").write_text("SECRET")
    link = ctx.scratch / "link"
    link.symlink_to(tmp_path / "secret.txt")
    assert _result(link) is None, "a link the CLI left pointing anywhere the agent can read"
    os.mkfifo(ctx.scratch / "fifo")
    started = time.monotonic()
    assert _result(ctx.scratch / "fifo") is None and time.monotonic() - started < 1
