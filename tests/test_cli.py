"""The command line as a user and a script meet it: outputs, --json documents, exit codes."""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hermes_sup.agents.routing import resolve_auto
from hermes_sup.kanban import Board
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.config.workspace import ConfigError, find_workspace, load_config

from .conftest import CLI, gone, wait_until


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    result = CliRunner().invoke(main, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    return tmp_path / "ws"


def invoke(ws: Path, *args: str):
    return CliRunner().invoke(main, ["-w", str(ws), *args])


def run(ws: Path, *args: str) -> tuple[int, str]:
    result = invoke(ws, *args)
    return result.exit_code, result.output


def run_json(ws: Path, *args: str) -> dict:
    result = invoke(ws, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_init_scaffolds_and_is_idempotent(tmp_path):
    runner = CliRunner()
    first = runner.invoke(main, ["init", str(tmp_path / "w"), "--json"])
    assert first.exit_code == 0
    created = json.loads(first.output)["created"]
    assert "hermes.yaml" in created and "kanban/inbox/" in created and "runs/" in created and "skills/" in created
    load_config(tmp_path / "w" / "hermes.yaml")
    again = runner.invoke(main, ["init", str(tmp_path / "w"), "--json"])
    assert json.loads(again.output)["created"] == []


def test_task_lifecycle_through_the_cli(ws):
    code, output = run(ws, "task", "add", "Write the report", "--priority", "3", "--body", "two pages")
    assert code == 0
    task_id = output.strip()
    doc = run_json(ws, "task", "show", task_id)
    assert (doc["title"], doc["priority"], doc["body"], doc["status"]) == ("Write the report", 3, "two pages", "todo")
    dep = run_json(ws, "task", "add", "Review it", "--depends-on", task_id, "--role", "review")
    assert dep["depends_on"] == [task_id] and dep["role"] == "review"
    listing = run_json(ws, "task", "list")
    assert [t["id"] for t in listing["tasks"]] == [task_id, dep["id"]]
    assert run_json(ws, "task", "list", "--status", "done")["tasks"] == []
    assert run_json(ws, "task", "cancel", task_id)["status"] == "cancelled"
    assert run_json(ws, "task", "retry", task_id)["status"] == "todo"
    moved = run_json(ws, "task", "move", task_id, "blocked", "--note", "waiting for data")
    assert moved["status"] == "blocked" and moved["history"][-1]["note"] == "waiting for data"
    code, output = run(ws, "task", "show", task_id)
    assert code == 0 and "waiting for data" in output and "history" in output


def test_steps_are_accepted_as_json(ws):
    doc = run_json(ws, "task", "add", "Plan", "--steps", '[{"tool": "write_file", "args": {"path": "a"}}]')
    assert doc["steps"] == [{"tool": "write_file", "args": {"path": "a"}}]
    code, output = run(ws, "task", "add", "Plan", "--steps", "[{oops")
    assert code == 2 and "--steps: invalid JSON" in output


def test_errors_are_messages_with_exit_codes_not_tracebacks(ws):
    code, output = run(ws, "task", "show", "no-such-task")
    assert code == 2 and "no task 'no-such-task'" in output and "Traceback" not in output
    result = invoke(ws, "task", "show", "no-such-task", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"error": f"no task 'no-such-task' on the board {ws / 'kanban'}",
                                         "exit_code": 2}
    code, output = run(ws, "task", "add", "x", "--id", "Bad Id")
    assert code == 2 and "is not a safe file name" in output  # a usage error (issue 29), no board failure
    code, output = run(ws, "task", "retry", run_json(ws, "task", "add", "y")["id"])
    assert code == 1 and "retry takes a blocked, failed or cancelled task" in output
    code, output = run(ws, "task", "move", "x", "doing")
    assert code == 2  # not a choice: a usage error


def test_board_ingests_pending_drops_and_counts(ws):
    (ws / "kanban" / "inbox" / "a.md").write_text("# Dropped task\nbody\n")
    (ws / "kanban" / "inbox" / "b.json").write_text("{not json")
    board = run_json(ws, "board")
    assert board["counts"]["todo"] == 1
    assert board["columns"]["todo"][0]["title"] == "Dropped task"
    assert board["ingest"]["rejected"][0]["file"] == "inbox/b.json"
    code, output = run(ws, "board")
    assert code == 0 and "todo 1" in output and "Dropped task" in output


def test_board_leaves_the_cyclic_collector_as_it_found_it(ws):
    # board pauses it while it lists (see board_cmd); a caller in the same process keeps its own.
    Board(ws / "kanban").add({"title": "a task"})
    assert gc.isenabled()
    for args in (("board",), ("board", "--json")):
        assert run(ws, *args)[0] == 0
        assert gc.isenabled()


def test_board_reports_a_damaged_task_and_keeps_the_rest(ws):
    keep = run_json(ws, "task", "add", "keep")
    bad = run_json(ws, "task", "add", "bad")
    (ws / "kanban" / "todo" / f"{bad['id']}.json").write_text('{"id": "trunc')
    board = run_json(ws, "board")
    assert [t["id"] for t in board["columns"]["todo"]] == [keep["id"]]
    assert board["damaged"][0]["path"] == f"todo/{bad['id']}.json"
    assert (ws / "kanban" / "rejected" / f"todo--{bad['id']}.json").exists()


def test_workspace_is_found_upward_and_from_the_environment(ws, tmp_path, monkeypatch):
    deep = ws / "runs" / "a" / "b"
    deep.mkdir(parents=True)
    assert find_workspace(cwd=deep).root == ws
    monkeypatch.setenv("HERMES_SUP_WORKSPACE", str(ws))
    assert find_workspace(cwd=tmp_path).root == ws
    monkeypatch.delenv("HERMES_SUP_WORKSPACE")
    with pytest.raises(ConfigError, match=r"no hermes\.yaml here or in any parent folder"):
        find_workspace(cwd=tmp_path)
    code, output = run(tmp_path / "nowhere", "board")
    assert code == 2 and "not a workspace" in output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("agents:\n  - name: a\n    count: zero\n",
         "hermes.yaml:2: agent a: 'count' must be a whole number from 1 to 64"),
        ("agents:\n  - name: a\n  - name: a\n", "hermes.yaml:3: agent name 'a' is used twice"),
        ("agents:\n  - name: a\n    rolez: [x]\n", "hermes.yaml:2: unknown agent key 'rolez'"),
        ("agents: [\n", "hermes.yaml:2: invalid YAML"),
        ("agentz: []\n", "hermes.yaml:1: unknown key 'agentz'"),
        ("agents:\n  - name: w\n    count: 2\n  - name: w-1\n", "hermes.yaml:4: agent name 'w-1' is used twice"),
    ],
)
def test_config_errors_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "hermes.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)


def test_doctor_reports_and_fails_on_a_broken_config(ws):
    report = run_json(ws, "doctor")
    names = {c["name"]: c for c in report["checks"]}
    assert names["config"]["level"] == "ok" and names["watcher"]["level"] == "ok"
    # the agents as status and logs name them (the scaffold's one entry is `worker` with count: 2)
    assert names["config"]["detail"] == f"{ws / 'hermes.yaml'} (2 agents: worker-1, worker-2)"
    assert names["filesystem"]["level"] == "ok" and "inotify limits" in names
    (ws / "hermes.yaml").write_text("agents: [\n")
    result = invoke(ws, "doctor", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["status"] == "error" and "hermes.yaml:2" in report["checks"][0]["detail"]


def test_the_installed_console_script_runs(ws):
    exe = Path(sys.executable).with_name("hermes-sup")
    command = [str(exe)] if exe.exists() else [*CLI]
    done = subprocess.run([*command, "-w", str(ws), "task", "add", "from a shell", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["title"] == "from a shell"
    bad = subprocess.run([*command, "-w", str(ws), "task", "show", "nope"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "no task 'nope'" in bad.stderr and bad.stdout == ""


def test_up_runs_the_team_which_does_a_dropped_task_and_stops_on_sigterm(ws):
    exe = Path(sys.executable).with_name("hermes-sup")
    command = [str(exe)] if exe.exists() else [*CLI]
    keyless = {k: v for k, v in os.environ.items()
               if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY")}
    proc = subprocess.Popen([*command, "-w", str(ws), "up"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=keyless)
    try:
        state = ws / "runs" / "supervisor.json"
        wait_until(lambda: state.exists() and all(
            a["state"] == "running" for a in json.loads(state.read_text())["agents"].values()), timeout=30)
        agents = json.loads(state.read_text())["agents"]
        assert sorted(agents) == ["worker-1", "worker-2"]
        (ws / "kanban" / "inbox" / "think.txt").write_text("A task that needs an LLM\n")
        step = {"tool": "write_file", "args": {"path": "note.txt", "content": "hi"}}
        drop = {"title": "write a note", "steps": [step]}
        (ws / "kanban" / "inbox" / "note.json").write_text(json.dumps(drop))
        done = wait_until(lambda: [n for n in os.listdir(ws / "kanban" / "done") if n.endswith(".json")], timeout=30)
        doc = json.loads((ws / "kanban" / "done" / done[0]).read_text())
        assert (ws / "runs" / "tasks" / doc["id"] / "work" / "note.txt").read_text() == "hi"
        # No API key and no local server here: the task that needs an LLM waits in todo, saying why.
        def waiting():
            return [json.loads(p.read_text()) for p in (ws / "kanban" / "todo").glob("*.json")]

        wait_until(lambda: waiting() and waiting()[0].get("waiting"), timeout=30)
        parked = waiting()
        assert [d["title"] for d in parked] == ["A task that needs an LLM"] and parked[0]["attempts"] == 0
        assert parked[0]["waiting"] == "no LLM provider available"
        assert run_json(ws, "board")["columns"]["todo"][0]["waiting"] == "no LLM provider available"
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        for info in agents.values():
            assert gone(info["pid"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_doctor_shows_what_auto_found_and_never_a_key(ws, monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    # No local server probing here: the machine running the tests may have one.
    monkeypatch.setattr("hermes_sup.supervisor.config.doctor.resolve_auto", functools.partial(resolve_auto, ports=()))
    checks = {c["name"]: c for c in run_json(ws, "doctor")["checks"]}
    assert checks["provider auto"]["level"] == "warn" and checks["provider auto"]["detail"].startswith("offline")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-very-secret-value")
    result = invoke(ws, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["provider auto"]["detail"].startswith("auto:anthropic")
    assert "very-secret" not in result.output


def test_board_watch_redraws_on_change_events_and_draws_a_burst_once_settled(ws):
    import queue
    import threading

    from hermes_sup.kanban import Board
    from hermes_sup.supervisor.cli.board import SAFETY_RESCAN

    proc = subprocess.Popen([*CLI, "-w", str(ws), "board", "--watch", "--json"],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        assert json.loads(lines.get(timeout=30))["counts"]["todo"] == 0
        board = Board(ws / "kanban")
        board.add({"title": "first"})
        # Well inside the safety rescan: the change event drew it, not a timer.
        drawn = json.loads(lines.get(timeout=SAFETY_RESCAN / 2))
        assert drawn["counts"]["todo"] == 1 and drawn["columns"]["todo"][0]["title"] == "first"
        for index in range(30):
            (ws / "kanban" / "inbox" / f"drop-{index}.md").write_text(f"# drop {index}\n")
        counts = []
        while not counts or counts[-1] < 31:
            counts.append(json.loads(lines.get(timeout=SAFETY_RESCAN / 2))["counts"]["todo"])
        assert len(counts) < 10, f"a burst of 30 drops was drawn {len(counts)} times: {counts}"
        assert lines.empty()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0, "SIGTERM ends the watch like Ctrl-C"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("agents: []\n", "hermes.yaml:1: no agents"),
        ("agents:\n  - name: a\nagents:\n  - name: b\n", "hermes.yaml:3: invalid YAML: duplicate key 'agents'"),
        ("agents:\n  - name: a\n    count: 10000\n", "hermes.yaml:2: agent a: 'count' must be a whole number from 1"),
        ("agents:\n  - name: ../../x\n", "hermes.yaml:2: agent name '../../x' must be"),
        ("agents:\n  - name: a\n    skills: [nope]\n", "hermes.yaml:2: agent a: skills: no skill named 'nope'"),
        # YAML reads an unquoted off/no/on/yes as a boolean: the refusal says so and how to quote it.
        ("providers:\n  off: {kind: offline}\nagents:\n  - name: a\n",
         "a provider's name is false (YAML reads an unquoted off, no, false, on, yes or true"),
        ("providers:\n  'off': {kind: offline}\ntiers: {cheap: [off]}\nagents:\n  - name: a\n",
         "tier cheap: must be a list of provider names (YAML reads an unquoted off"),
        ("providers:\n  'no': {kind: offline}\nagents:\n  - name: a\n    providers: [no]\n",
         "put such a name in quotes, 'off'"),
    ],
)
def test_up_refuses_a_bad_team_at_once_and_starts_nothing(ws, text, message):
    (ws / "hermes.yaml").write_text(text)
    done = subprocess.run([*CLI, "-w", str(ws), "up", "--detach"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (ws / "runs" / "supervisor.json").exists() and not (ws / "runs" / "supervisor.log").exists()


def test_task_answer_then_show_prints_the_question_answered_and_the_comments(ws):
    from hermes_sup.kanban import Board

    board = Board(ws / "kanban")
    board.add({"id": "ask", "title": "Ask a person"})
    token = board.claim("worker-1")["claim"]["token"]
    board.block("ask", token, "needs a person", question="Colour?")
    board.comment("ask", "see [b]x[/b]", by="reviewer")
    code, output = run(ws, "task", "answer", "ask", "blue")
    assert code == 0, output
    code, output = run(ws, "task", "show", "ask")
    assert code == 0
    # (short texts: the panel is 80 columns wide here, and a wrapped line would not be found)
    assert "comments" in output and "reviewer: see [b]x[/b]" in output
    assert "cli (answer to: Colour?): blue" in output


def test_answering_a_task_that_asked_nothing_names_only_commands_that_exist(ws):
    from hermes_sup.kanban import Board

    board = Board(ws / "kanban")
    board.add({"id": "plain", "title": "Nothing asked"})
    code, output = run(ws, "task", "answer", "plain", "hi")
    assert code == 1 and output.strip() == "error: task plain is todo and waits on no question"
    board.move("plain", "blocked", note="stuck")
    code, output = run(ws, "task", "answer", "plain", "hi")
    assert code == 1 and "waits on no question; `hermes-sup task retry plain` puts it back in todo" in output
    assert "task comment" not in output  # not a command (yet): never suggested


@pytest.mark.parametrize("args", [("task", "list", "--status", "bogus"), ("task", "add", "x", "--priority", "1e99"),
                                  ("skills", "history"), ("down", "--timeout", "nan")])
def test_a_usage_error_under_json_is_one_json_document_on_stdout(ws, args):
    result = invoke(ws, *args, "--json")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["exit_code"] == 2 and document["error"]
    assert "Usage:" in result.stderr  # people still get click's usage message
    plain = invoke(ws, *args)
    assert plain.exit_code == 2 and plain.stdout == ""  # without --json, stdout stays empty


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_logs_follow_prints_new_lines_and_ends_cleanly_on_ctrl_c_or_sigterm(ws, stop):
    import queue
    import threading

    log = ws / "runs" / "worker-1" / "agent.log"
    log.parent.mkdir()
    log.write_text("worker-1: ready\n")
    proc = subprocess.Popen([*CLI, "-w", str(ws), "logs", "worker-1", "-f"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=30) == "worker-1 | worker-1: ready\n"
        with log.open("a") as handle:
            handle.write("worker-1: working on x\n")
        assert lines.get(timeout=30) == "worker-1 | worker-1: working on x\n"
        proc.send_signal(stop)
        assert proc.wait(timeout=30) == 0
        assert "Aborted" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_task_show_prints_a_models_answer_as_its_lines_and_steps_one_a_line(ws):
    from hermes_sup.kanban import Board
    from hermes_sup.supervisor.views.render import result_text

    board = Board(ws / "kanban")
    board.add({"id": "guide", "title": "Write the guide"})
    token = board.claim("worker-1")["claim"]["token"]
    board.complete("guide", token, {"answer": "# Guide\nStep [b]one[/b]\x1b[2J\n\tdone"})
    code, output = run(ws, "task", "show", "guide")
    assert code == 0
    lines = [line.strip("│ ") for line in output.splitlines()]
    assert lines[lines.index("result:") + 1:][:3] == ["# Guide", "Step [b]one[/b]\\x1b[2J", "done"]
    assert "{'answer'" not in output and "\\n" not in output
    assert result_text({"steps": ["wrote a.txt", {"rows": 5}]}) == 'step 1: wrote a.txt\nstep 2: {"rows": 5}'
    assert result_text({"answer": "x", "extra": 1}) == '{"answer": "x", "extra": 1}'
    assert result_text("plain") == "plain" and result_text(None) == "null"


def test_skills_history_of_a_skill_that_does_not_exist_says_so(ws):
    code, output = run(ws, "skills", "history", "data_tool")
    assert code == 1 and "no skill named 'data_tool'; skills: " in output and "data_tools" in output
    code, output = run(ws, "skills", "history", "data_tools")  # a bundled skill never replaced
    assert code == 0 and "skill data_tools has no earlier versions" in output


@pytest.mark.parametrize("names", ["", " , "])
def test_up_with_agents_naming_no_agent_is_refused_and_starts_nothing(ws, names):
    try:
        done = subprocess.run([*CLI, "-w", str(ws), "up", "--detach", "--agents", names], capture_output=True,
                              text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
        assert done.returncode == 2 and "--agents names no agent; agents: worker-1, worker-2" in done.stderr
        assert not (ws / "runs" / "supervisor.json").exists()
    finally:  # had it started the team, stop it
        subprocess.run([*CLI, "-w", str(ws), "down", "--timeout", "5"], capture_output=True, timeout=120,
                       cwd=Path(__file__).resolve().parent.parent)


def test_init_scaffolds_where_every_command_looks_for_the_workspace(tmp_path, monkeypatch):
    from hermes_sup.supervisor.cli.setup import init_root

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    runner = CliRunner()
    done = runner.invoke(main, ["-w", str(tmp_path / "by-w"), "init"])
    assert done.exit_code == 0 and (tmp_path / "by-w" / "hermes.yaml").is_file(), done.output
    assert f"next: cd {tmp_path / 'by-w'} && hermes-sup up" in done.output.replace("\n", "")
    done = runner.invoke(main, ["init"], env={"HERMES_SUP_WORKSPACE": str(tmp_path / "by-env")})
    assert done.exit_code == 0 and (tmp_path / "by-env" / "hermes.yaml").is_file(), done.output
    assert not (elsewhere / "hermes.yaml").exists()
    done = runner.invoke(main, ["-w", str(tmp_path / "a"), "init", str(tmp_path / "b")])
    assert done.exit_code == 2 and "name two folders" in done.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # DIRECTORY wins over the environment; relative paths are taken from the current folder
    assert init_root(Path("x"), None, "/env", Path("/cwd")) == Path("/cwd/x")
    assert init_root(Path("x"), Path("/cwd/x"), None, Path("/cwd")) == Path("/cwd/x")
    assert init_root(None, None, "", Path("/cwd")) == Path("/cwd")


def test_piped_output_is_never_hard_wrapped(tmp_path):
    # A script reading `init`'s output (or a log file of it) must see each message on one line, however
    # long the path: rich folds at 80 columns when stdout is not a terminal unless told otherwise.
    root = tmp_path / ("deep" * 30) / "ws"
    done = subprocess.run([*CLI, "-w", str(root), "init"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"workspace ready in {root}: created hermes.yaml")
    assert lines[1].startswith(f"next: cd {root} && hermes-sup up")


def test_doctor_judges_the_machines_limits_against_the_team_and_names_what_raises_them():
    """A 256-agent team on this machine's defaults (128 inotify instances, a heartbeat queue of 10):
    each limit too low is named with the setting that raises it; a small team passes them all."""
    from hermes_sup.supervisor.config.doctor import machine_checks

    inotify = {"max_user_instances": 128, "max_user_watches": 192536}
    machine = {"nofile": 1024, "dgram_qlen": 10, "available_mb": 8000}
    checks = {c["name"]: c for c in machine_checks(256, inotify, folders=12, machine=machine)}
    assert checks["limits: inotify instances"]["level"] == "warn"
    assert "sysctl -w fs.inotify.max_user_instances=258" in checks["limits: inotify instances"]["detail"]
    assert checks["limits: inotify watches"]["level"] == "ok"
    assert "ulimit -n 1088" in checks["limits: open files"]["detail"], "1,024, the usual default, is too few"
    assert checks["limits: heartbeat queue"]["level"] == "warn"
    assert "net.unix.max_dgram_qlen=256" in checks["limits: heartbeat queue"]["detail"]
    assert checks["limits: memory"]["level"] == "warn" and "17,920" in checks["limits: memory"]["detail"]
    small = machine_checks(3, inotify, folders=12, machine=machine)
    assert [c["level"] for c in small] == ["ok"] * 5
    assert machine_checks(0, inotify, folders=12, machine=machine) == []
    unknown = machine_checks(3, {}, folders=12, machine={"nofile": None, "dgram_qlen": None, "available_mb": None})
    assert unknown == []


@pytest.mark.parametrize("args", [["task", "add", ""], ["task", "add", "x", "--id", "My_Task"],
                                  ["task", "add", "   "]])
def test_task_fields_no_board_would_take_are_a_usage_error_before_the_board_opens(ws, args):
    result = CliRunner().invoke(main, ["-w", str(ws), *args, "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit_code"] == 2
    assert Board(ws / "kanban").list().tasks == [], "nothing was added"


def test_the_workspace_may_be_given_after_the_command_too(ws, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no workspace here: only -w can name it
    monkeypatch.delenv("HERMES_SUP_WORKSPACE", raising=False)
    added = CliRunner().invoke(main, ["task", "add", "after", "-w", str(ws), "--json"])
    assert added.exit_code == 0, added.output
    listed = CliRunner().invoke(main, ["task", "list", "--json", "--workspace", str(ws)])
    assert [t["title"] for t in json.loads(listed.stdout)["tasks"]] == ["after"]
    # after the command it wins over one given before it, as the later of two options does
    board = CliRunner().invoke(main, ["-w", str(tmp_path / "nowhere"), "board", "-w", str(ws), "--json"])
    assert board.exit_code == 0 and json.loads(board.stdout)["counts"]["todo"] == 1


def test_a_table_piped_to_another_program_is_one_line_a_row(ws):
    title = "A very long title that goes on " * 6
    doc = run_json(ws, "task", "add", title)
    code, output = run(ws, "task", "list")  # CliRunner's output is no terminal: as `task list | cat`
    assert code == 0
    [row] = [line for line in output.splitlines() if doc["id"] in line]
    assert title.strip() in row
