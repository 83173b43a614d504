"""`runtime: hermes` (agents/hermesrun.py) against the real Hermes Agent CLI (hermes-agent from PyPI,
installed by `make test` in .venv-hermes at the releases of constraints-hermes.txt), on a profile of
its own pointed at the suite's scripted model server: a Hermes worker and a built-in one share the
board; Hermes' own kanban tools block the task on a question and comment on it; its usage reaches
`hermes-sup usage`; a SIGKILLed Hermes costs an attempt, not the task; a cancel ends it at once. Then
the decisions, pure, and the config's refusals."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hermes_sup.agents.clirun import Run
from hermes_sup.agents.hermesrun import judge, read_bridge, usage_record
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import CLI, ROOT, init_workspace, running, wait_until
from .llm_server import ScriptedLLM, openai_reply
from .test_runtime_command import ended
from .test_telemetry import receiver  # noqa: F401 - the fixture: an OTLP receiver decoding what it gets

KEY = "sk-hermes-worker-0123456789"


def hermes_program() -> str:
    """The Hermes CLI `make test` installed; a run without make skips, a missing one under make fails."""
    given = os.environ.get("HERMES_SUP_HERMES")
    program = given or str(ROOT / ".venv-hermes" / "bin" / "hermes")
    if not os.access(program, os.X_OK):
        if given:
            pytest.fail(f"HERMES_SUP_HERMES names {given}, which is not there: make hermes-agent installs it")
        pytest.skip("Hermes Agent's CLI is not installed: make hermes-agent (make test does)")
    return program


def responder(api: str, body: dict) -> dict:
    """Answers by what the conversation holds, as the model a Hermes worker talks to."""
    messages = body.get("messages") or []
    text = json.dumps(messages)
    last = messages[-1] if messages else {}
    if "SLOW-ZQ" in text and last.get("role") != "tool":
        return {**openai_reply("slow answer"), "delay": 60}
    if "ASK-ZQ" in text:
        tools = [m for m in messages if m.get("role") == "tool"]
        if not tools:
            hermes_id = re.search(r"t_[0-9a-f]{8}", text)
            return openai_reply(None, [("kanban_comment", {"task_id": hermes_id.group(0) if hermes_id else "",
                                                           "body": "read the brief; one thing is unclear"})])
        if len(tools) == 1:
            reply = openai_reply(None, [("kanban_block", {"reason": "Which region should the report cover?"})])
            # An id of its own: Hermes drops a call whose id an earlier one had, and the model would loop.
            reply["json"]["choices"][0]["message"]["tool_calls"][0]["id"] = "call_block"
            return reply
        return openai_reply("blocked on a question")
    if "LOOP-ZQ" in text:
        return openai_reply("plain answer from the built-in loop")
    return openai_reply("hello from hermes", prompt=321, completion=12)


@pytest.fixture
def team(tmp_path, up, receiver):  # noqa: F811
    program = hermes_program()
    llm = ScriptedLLM(responder).__enter__()
    profile = tmp_path / "hermes-home" / "profiles" / "worker"
    profile.mkdir(parents=True)
    (profile / "config.yaml").write_text(f"""\
model:
  default: scripted
  provider: local
  context_length: 131072
providers:
  local:
    name: local
    base_url: {llm.url}/v1
    key_env: WORKER_MODEL_KEY
    default_model: scripted
security:
  tirith_enabled: false
  allow_lazy_installs: false
""")
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(f"""\
providers:
  scripted: {{kind: openai, base_url: "{llm.url}/v1", model: scripted-gpt, api_key_env: SCRIPTED_KEY}}
tiers: {{cheap: [scripted], standard: [scripted], premium: [scripted]}}
telemetry: {{otlp_endpoint: "{receiver.url}"}}
defaults:
  restart: {{policy: always, backoff: {{initial: 0.1, max: 0.5}}}}
  stop_timeout: 5
agents:
  - name: herm
    roles: [hermes]
    runtime: hermes
    profile: worker
    hermes_home: {tmp_path / "hermes-home"}
    program: {program}
    capabilities: [network]
    env_from: {{WORKER_MODEL_KEY: SUPERVISORS_WORKER_KEY}}
  - name: plain
    roles: [plain]
""")
    (ws / ".env").write_text("SCRIPTED_KEY=sk-scripted\n")
    os.environ["SUPERVISORS_WORKER_KEY"] = KEY
    try:
        up(ws)
    finally:
        del os.environ["SUPERVISORS_WORKER_KEY"]
    yield ws, Board(ws / "kanban"), llm, profile
    llm.__exit__(None, None, None)


def test_a_hermes_worker_and_a_built_in_one_share_the_board(team, receiver):  # noqa: F811
    ws, board, llm, profile = team
    board.add({"id": "greet", "title": "Say hello to the team", "role": "hermes"})
    board.add({"id": "brief", "title": "ASK-ZQ about the report", "role": "hermes"})
    board.add({"id": "local", "title": "a LOOP-ZQ task", "role": "plain"})
    docs = {task_id: wait_until(lambda t=task_id: ended(board, t), timeout=150)
            for task_id in ("greet", "brief", "local")}
    assert docs["greet"]["status"] == "done", docs["greet"]
    assert docs["greet"]["result"]["answer"].strip() == "hello from hermes"
    assert docs["greet"]["history"][-1]["by"] == "herm", docs["greet"]["history"]
    assert docs["local"]["status"] == "done" and docs["local"]["history"][-1]["by"] == "plain"
    assert docs["local"]["result"]["answer"] == "plain answer from the built-in loop"
    # Hermes' own kanban_block and kanban_comment, through the bridge, on this board:
    brief = docs["brief"]
    assert brief["status"] == "blocked", brief
    assert brief["question"] == "Which region should the report cover?"
    assert any(c["text"] == "read the brief; one thing is unclear" and c["by"] == "herm"
               for c in brief.get("comments") or []), brief.get("comments")
    # The worker's key came from env_from, to the model and nowhere in hermes.yaml:
    hermes_calls = [r for r in llm.requests if "Say hello to the team" in json.dumps(r["body"])]
    assert hermes_calls and all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in hermes_calls)
    assert KEY not in (ws / "hermes.yaml").read_text()
    assert (profile / "state.db").exists(), "Hermes ran on its own profile"
    usage = subprocess.run([*CLI, "-w", str(ws), "usage", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert usage.returncode == 0, usage.stderr
    herm = json.loads(usage.stdout)["agents"]["herm"]
    assert herm["tokens_in"] >= 321 and herm["tokens_out"] >= 12, herm
    assert herm["unpriced_calls"] >= 1, "Hermes knew no price for the scripted model: unpriced, never free"
    log = (ws / "runs" / "herm" / "agent.log").read_text()
    assert "; runtime: hermes (profile worker" in log
    # Its tool calls, read from Hermes' own session store: a span each under the attempt's, in its trace,
    # timed by the store's rows within the run; none for the run that called no tool.
    attempts = {s["attributes"]["hermes.task.id"]: s for s in wait_until(
        lambda: len(receiver.named("task ")) >= 3 and receiver.named("task "), timeout=30)}

    def tools_of(task_id: str) -> list[dict]:
        return sorted((s for s in receiver.named("execute_tool ") if s["parent"] == attempts[task_id]["id"]),
                      key=lambda s: s["start"])

    tools = wait_until(lambda: len(tools_of("brief")) == 2 and tools_of("brief"), timeout=30)
    assert [s["attributes"]["gen_ai.tool.name"] for s in tools] == ["kanban_comment", "kanban_block"]
    assert [s["attributes"]["hermes.tool.outcome"] for s in tools] == ["ok", "ok"]
    assert all(s["attributes"]["hermes.runtime"] == "hermes" and s["attributes"]["hermes.timing"] == "store"
               and s["attributes"]["gen_ai.tool.call.id"] and s["trace"] == attempts["brief"]["trace"]
               and attempts["brief"]["start"] < s["start"] <= s["end"] < attempts["brief"]["end"] for s in tools)
    assert tools[0]["end"] <= tools[1]["start"], "the block was asked for once the comment was answered"
    assert not any("gen_ai.tool.call.arguments" in s["attributes"] for s in tools), "content: false"
    assert tools_of("greet") == [] and len([s for s in receiver.named("chat ")
                                            if s["parent"] == attempts["greet"]["id"]]) == 1
    assert "tool calls are not all traced" not in log


def test_a_sigkilled_hermes_costs_an_attempt_and_a_cancel_ends_it_at_once(team):
    ws, board, llm, _ = team
    board.add({"id": "slow", "title": "SLOW-ZQ work", "role": "hermes", "max_attempts": 3})
    wait_until(lambda: running("Task slow:"), timeout=90)
    wait_until(lambda: any("SLOW-ZQ" in json.dumps(r["body"]) for r in llm.requests), timeout=90)
    # Read once the model has the request (Hermes waits on its answer for 60 s); a process of the run
    # may still end between the read and its kill (on a loaded machine one did): what was killed counts.
    killed = 0
    for pid in running("Task slow:"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    assert killed, "the run waiting on the model was there to kill"
    doc = wait_until(lambda: board.get("slow")["attempts"] >= 2 and board.get("slow")["status"] == "doing"
                     and board.get("slow"), timeout=90)
    assert "hermes exited with status" in doc["history"][-2]["note"] or any(
        "hermes exited with status" in (h.get("note") or "") for h in doc["history"]), doc["history"]
    wait_until(lambda: running("Task slow:"), timeout=90)
    done = subprocess.run([*CLI, "-w", str(ws), "task", "cancel", "slow"], capture_output=True, text=True, cwd=ROOT)
    cancelled = time.monotonic()  # once the board holds the cancel: the CLI's own start is no part of the promise
    assert done.returncode == 0, done.stderr
    wait_until(lambda: not running("Task slow:"), timeout=10)
    assert time.monotonic() - cancelled < 4.0
    assert board.get("slow")["status"] == "cancelled"


# -- the decisions, pure -------------------------------------------------------------------------------

def ran(returncode: int | None = 0, output: str = "answer\n", **kw) -> Run:
    return Run(returncode, output, kw.get("stopped", False), kw.get("timed_out", False), 1.5)


def test_a_hermes_run_is_judged_by_its_board_and_usage_file_not_its_exit_alone():
    assert judge(ran(), {"completed": True, "failed": False}, None, max_runtime=60).kind == "done"
    failed = judge(ran(0, "HTTP 400: bad request\n"), {"completed": False, "failed": True}, None, max_runtime=60)
    assert failed.kind == "failed" and "HTTP 400" in failed.reason, "-z exits 0 when the model failed"
    blocked = judge(ran(), None, {"status": "blocked", "reason": "Which one?"}, max_runtime=60)
    assert (blocked.kind, blocked.reason) == ("blocked", "Which one?")
    done = judge(ran(), None, {"status": "done", "summary": "wrote the report"}, max_runtime=60)
    assert done.result["answer"] == "wrote the report" and done.result["output"] == "answer\n"
    assert judge(ran(-9, ""), None, None, max_runtime=60).reason == "hermes exited with status -9 and printed nothing"
    assert judge(ran(stopped=True), None, None, max_runtime=60).kind == "interrupted"
    assert "max_runtime (60 s)" in judge(ran(timed_out=True), None, None, max_runtime=60).reason
    assert judge(ran(0, "  \n"), None, None, max_runtime=60).kind == "failed"


def test_a_usage_file_of_odd_values_gives_counts_and_never_a_free_unknown_cost():
    record = usage_record("t", "worker", {"input_tokens": 10, "output_tokens": "9", "cache_read_tokens": -1,
                                          "estimated_cost_usd": 0.0, "cost_status": "unknown", "api_calls": True},
                          2.0, False)
    assert (record["tokens_in"], record["tokens_out"], record["tokens_cached"], record["calls"]) == (10, 0, 0, 0)
    assert record["cost_usd"] is None, "an unknown cost is unpriced, not $0"
    priced = usage_record("t", "worker", {"estimated_cost_usd": 0.25, "cost_status": "estimated"}, 2.0, True)
    assert priced["cost_usd"] == 0.25 and priced["outcome"] == "error" and priced["provider"] == "hermes:worker"


def test_a_bridge_file_the_cli_made_hostile_is_read_as_nothing(tmp_path):
    import sqlite3

    db = tmp_path / "k.db"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE t0 (x); CREATE VIEW tasks AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL "
                       "SELECT n+1 FROM r) SELECT n AS id, 'done' AS status, NULL AS result FROM r;"
                       "CREATE TABLE task_runs (id, task_id, outcome, summary); CREATE TABLE task_comments "
                       "(id, task_id, body); CREATE TABLE task_events (id, task_id, kind, payload);")
    conn.close()
    started = time.monotonic()
    assert read_bridge(db, "t_1", 1) == (None, [])
    assert time.monotonic() - started < 5
    (tmp_path / "link.db").symlink_to(db)
    assert read_bridge(tmp_path / "link.db", "t_1", 1) == (None, [])
    os.mkfifo(tmp_path / "fifo.db")
    assert read_bridge(tmp_path / "fifo.db", "t_1", 1) == (None, [])


def config_error(tmp_path: Path, agent: str, extra: str = "") -> str:
    (tmp_path / "hermes.yaml").write_text(f"{extra}agents:\n  - {agent}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "hermes.yaml")
    return str(caught.value)


def test_a_hermes_agent_is_refused_with_file_and_line_when_it_cannot_run(tmp_path):
    home = tmp_path / "home"
    (home / "profiles" / "worker").mkdir(parents=True)
    base = f"{{name: h, runtime: hermes, hermes_home: '{home}', capabilities: [network]"
    assert "needs 'profile'" in config_error(tmp_path, base + "}")
    assert "hermes.yaml:2" in config_error(tmp_path, base + "}")
    assert "profile folder" in config_error(tmp_path, base + ", profile: nobody}")
    assert "'network' capability" in config_error(
        tmp_path, f"{{name: h, runtime: hermes, hermes_home: '{home}', profile: worker}}")
    assert "'argv' is for runtime: command" in config_error(tmp_path, base + ", profile: worker, argv: [x]}")
    assert "'profile' is for runtime: hermes" in config_error(tmp_path, "{name: c, runtime: command, argv: [x], "
                                                                        "profile: worker}")
    twice = f"agents:\n  - {base}, profile: worker}}\n  - {base.replace('name: h,', 'name: h3,')}, profile: worker}}\n"
    (tmp_path / "hermes.yaml").write_text(twice)
    with pytest.raises(ConfigError, match="is agent h's too"):
        load_config(tmp_path / "hermes.yaml")
    (home / "profiles" / "worker" / "deeper").mkdir()
    nested = base.replace("name: h,", "name: h4,") + f", profile: '{home}/profiles/worker/deeper'}}"
    (tmp_path / "hermes.yaml").write_text(f"agents:\n  - {base}, profile: worker}}\n  - {nested}\n")
    with pytest.raises(ConfigError, match="are one inside the other"):
        load_config(tmp_path / "hermes.yaml")
    (tmp_path / "hermes.yaml").write_text(f"agents:\n  - {base}, profile: '{tmp_path}'}}\n")
    with pytest.raises(ConfigError, match="holds this workspace"):
        load_config(tmp_path / "hermes.yaml")
    other = base.replace("name: h,", "name: h2,")
    (tmp_path / "hermes.yaml").write_text(f"agents:\n  - {base}, profile: worker}}\n  - {other}, profile: default}}\n")
    config = load_config(tmp_path / "hermes.yaml")
    assert [a["profile"] for a in config["agents"]] == ["worker", "default"]
    from hermes_sup.supervisor.config.runtimes import profile_dir

    assert profile_dir(config["agents"][0]) == home / "profiles" / "worker"
    assert profile_dir(config["agents"][1]) == home, "default: the home itself, as Hermes has it"
    assert profile_dir({"profile": "w"}, {"HERMES_HOME": "/h"}) == Path("/h/profiles/w")
    assert profile_dir({"profile": "w"}, {"HOME": "/u"}) == Path("/u/.hermes/profiles/w")


def test_the_bridge_is_read_back_and_tasks_made_there_are_named_not_dropped(tmp_path):
    import sqlite3

    db = tmp_path / "k.db"
    conn = sqlite3.connect(db)
    conn.executescript("""
        CREATE TABLE tasks (id TEXT, title TEXT, status TEXT, result TEXT);
        CREATE TABLE task_runs (id INTEGER, task_id TEXT, outcome TEXT, summary TEXT);
        CREATE TABLE task_comments (id INTEGER, task_id TEXT, author TEXT, body TEXT);
        CREATE TABLE task_events (id INTEGER, task_id TEXT, kind TEXT, payload TEXT);
        INSERT INTO tasks VALUES ('t_1', 'ours', 'done', NULL), ('t_2', 'Write the tests', 'ready', NULL);
        INSERT INTO task_runs VALUES (1, 't_1', 'completed', 'wrote it'), (2, 't_1', 'completed', 'another run');
        INSERT INTO task_comments VALUES (1, 't_1', 'w', 'first'), (2, 't_2', 'w', 'not ours'), (3, 't_1', 'w', '  ');
    """)
    conn.commit()
    conn.close()
    state, comments = read_bridge(db, "t_1", 1)
    assert state == {"status": "done", "result": None, "summary": "wrote it", "reason": "wrote it"}
    assert comments[0] == "first" and len(comments) == 2
    assert comments[1].startswith("Hermes created 1 task(s) on its own board, not carried") and \
        comments[1].endswith("Write the tests")


# -- what the confined CLI may leave behind (an attacker's review found each) -------------------------

FAKE_HERMES = """#!{python}
import os, sys
usage = sys.argv[sys.argv.index("--usage-file") + 1]
home = os.environ["HERMES_HOME"]
try:
    with open(os.path.join(home, "profiles", "worker", "config.yaml"), "a") as handle:
        handle.write("# planted by the default profile's run\\n")
    print("planted")
except OSError as exc:
    print("could not plant:", exc.strerror)
db = os.environ.get("HERMES_KANBAN_DB")
if db and "FIFO" in sys.argv[2]:
    os.mkfifo(db + "-journal")
open(usage, "w").write('{{"completed": true, "failed": false, "input_tokens": 5}}')
"""


def fake_hermes(tmp_path: Path, mode: str):
    """A stand-in for the hermes program (the real one's Python, so the bridge is made for real) that
    does what a hostile run could: write into the home's other profiles, plant a FIFO by the bridge."""
    import sys
    import threading

    from hermes_sup.agents import hermesrun, sandbox
    from hermes_sup.agents.tools import ToolContext

    from .test_sandbox import needs

    needs(mode)
    real = hermes_program()
    program = tmp_path / "cli" / "bin" / "hermes"  # its installation, cli/, shown read-only
    program.parent.mkdir(parents=True)
    program.write_text(FAKE_HERMES.format(python=hermesrun.python_of(real) or sys.executable))
    program.chmod(0o755)
    home = tmp_path / "home"
    (home / "profiles" / "worker").mkdir(parents=True)
    (home / "profiles" / "worker" / "config.yaml").write_text("model: x\n")
    ctx = ToolContext(scratch=tmp_path / "work", stop=threading.Event(), task={"id": "t1", "title": "t"},
                      agent="h", settings={"sandbox": mode, "runtime": {
                          "kind": "hermes", "profile": "default", "profile_dir": str(home), "program": str(program),
                          "max_runtime": 60}})
    assert sandbox.how(mode)[0] == mode
    return ctx, home


def test_the_default_profiles_run_cannot_write_the_other_profiles(tmp_path):
    from hermes_sup.agents.hermesrun import work

    ctx, home = fake_hermes(tmp_path, "bubblewrap")
    outcome = work(ctx, "NOTHING to do", ["network"])
    assert outcome.verdict.kind == "done", outcome.verdict
    assert "could not plant" in outcome.verdict.result["answer"]
    assert (home / "profiles" / "worker" / "config.yaml").read_text() == "model: x\n"


def test_under_landlock_the_default_profile_with_others_beside_it_is_refused(tmp_path):
    from hermes_sup.agents.hermesrun import work

    ctx, home = fake_hermes(tmp_path, "landlock")
    outcome = work(ctx, "NOTHING to do", ["network"])
    assert outcome.verdict.kind == "failed" and "cannot keep from its runs" in outcome.verdict.reason
    assert (home / "profiles" / "worker" / "config.yaml").read_text() == "model: x\n"


def test_a_fifo_left_by_the_bridge_board_never_holds_the_agent(tmp_path):
    import threading

    from hermes_sup.agents.hermesrun import work

    ctx, _ = fake_hermes(tmp_path, "bubblewrap")
    outcomes = []
    worker = threading.Thread(target=lambda: outcomes.append(work(ctx, "FIFO please", ["network"])), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the agent blocked in open() on the FIFO the run left at the -journal"
    assert outcomes[0].verdict.kind == "done"


def test_a_program_that_is_a_fifo_is_no_python_script(tmp_path):
    import threading

    from hermes_sup.agents.hermesrun import python_of

    os.mkfifo(tmp_path / "hermes")
    found = []
    reader = threading.Thread(target=lambda: found.append(python_of(str(tmp_path / "hermes"))), daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive() and found == [None]


# -- what a mutation check found unguarded -------------------------------------------------------------

def test_the_cli_inside_its_writable_profile_folder_is_refused_at_load_and_at_run(tmp_path):
    from hermes_sup.agents.hermesrun import work

    from .test_sandbox import needs

    home = tmp_path / "home"
    inside = home / "hermes-agent" / "venv" / "bin"  # where Hermes' own installer puts it: ~/.hermes/hermes-agent
    inside.mkdir(parents=True)
    program = inside / "hermes"
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o755)
    (tmp_path / "hermes.yaml").write_text(f"agents:\n  - {{name: h, runtime: hermes, hermes_home: '{home}', "
                                          f"profile: default, program: '{program}', capabilities: [network]}}\n")
    with pytest.raises(ConfigError, match=r"hermes.yaml:2: .*is inside the profile folder"):
        load_config(tmp_path / "hermes.yaml")
    needs("bubblewrap")
    import threading

    from hermes_sup.agents.tools import ToolContext

    ctx = ToolContext(scratch=tmp_path / "work", stop=threading.Event(), task={"id": "t1"}, agent="h",
                      settings={"sandbox": "bubblewrap", "runtime": {
                          "kind": "hermes", "profile": "default", "profile_dir": str(home), "program": str(program)}})
    outcome = work(ctx, "p", ["network"])
    assert outcome.verdict.kind == "failed" and "is inside the profile folder" in outcome.verdict.reason


def test_links_and_oversized_files_the_cli_left_are_read_as_nothing(tmp_path):
    from hermes_sup.agents.hermesrun import open_hostile, private_copy, read_json

    good = tmp_path / "usage.json"
    good.write_text('{"completed": true, "input_tokens": 5}')
    (tmp_path / "link.json").symlink_to(good)
    assert read_json(good, 1000) == {"completed": True, "input_tokens": 5}
    assert read_json(tmp_path / "link.json", 1000) is None, "a link is not followed"
    assert read_json(good, 10) is None, "over its bound"
    import sqlite3

    db = tmp_path / "real.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE tasks (id)")
    (tmp_path / "linked.db").symlink_to(db)
    with private_copy(tmp_path / "linked.db", 1 << 20) as copy:
        assert copy is None
    with private_copy(db, 10) as copy:
        assert copy is None, "over its bound"
    with private_copy(db, 1 << 20) as copy:
        assert copy is not None and copy != db
        conn = open_hostile(copy, ("tasks",), seconds=0.0)
        with pytest.raises(sqlite3.OperationalError):  # the deadline holds from the first query on
            conn.execute("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r")
        conn.close()


def test_a_run_is_judged_by_its_own_run_and_files_only():
    assert judge(ran(), {"completed": False}, None, max_runtime=60).kind == "failed"
    done = judge(ran(), None, {"status": "done", "summary": "the summary", "result": "the result"}, max_runtime=60)
    assert done.result["answer"] == "the summary"
    assert usage_record("t", "p", {"estimated_cost_usd": 0.5}, 1.0, False)["cost_usd"] is None, "no cost_status"
    assert usage_record("t", "p", {"estimated_cost_usd": -1, "cost_status": "estimated"}, 1.0, False)["cost_usd"] \
        is None


def test_the_bridge_reads_its_own_runs_summary_and_cuts_a_long_question(tmp_path):
    import sqlite3

    db = tmp_path / "k.db"
    with sqlite3.connect(db) as conn:
        conn.executescript("""
            CREATE TABLE tasks (id TEXT, title TEXT, status TEXT, result TEXT);
            CREATE TABLE task_runs (id INTEGER, task_id TEXT, outcome TEXT, summary TEXT);
            CREATE TABLE task_comments (id INTEGER, task_id TEXT, author TEXT, body TEXT);
            CREATE TABLE task_events (id INTEGER, task_id TEXT, kind TEXT, payload TEXT);
            INSERT INTO tasks VALUES ('t_1', 'ours', 'blocked', NULL);
            INSERT INTO task_runs VALUES (1, 't_1', 'blocked', 'ours'), (7, 't_1', 'completed', 'another run');
        """)
        conn.execute("INSERT INTO task_events VALUES (1, 't_1', 'blocked', ?)", (json.dumps({"reason": "q" * 5000}),))
    state, _ = read_bridge(db, "t_1", 1)
    assert state["summary"] == "ours" and len(state["reason"]) == 4000


def test_a_stale_usage_file_and_a_stopped_run_leave_no_record(tmp_path):
    """An earlier attempt's usage file saying failed does not fail this one; a stopped run's usage is
    not recorded (its task goes back)."""
    import threading

    from hermes_sup.agents.hermesrun import USAGE_FILE, work
    from hermes_sup.agents.tools import ToolContext

    from .test_sandbox import needs

    needs("bubblewrap")
    cli = tmp_path / "cli" / "bin"
    cli.mkdir(parents=True)
    program = cli / "hermes"
    program.write_text("#!/bin/sh\nsleep \"${SLEEP:-0}\"\necho answered\n")
    program.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    (work_dir / USAGE_FILE).write_text('{"failed": true}')
    ctx = ToolContext(scratch=work_dir, stop=threading.Event(), task={"id": "t1"}, agent="h",
                      settings={"sandbox": "bubblewrap", "runtime": {
                          "kind": "hermes", "profile": "default", "profile_dir": str(home), "program": str(program)}})
    outcome = work(ctx, "p", ["network"])
    assert outcome.verdict.kind == "done" and outcome.usage is None, outcome


def test_a_relative_profile_is_the_workspaces_and_odd_names_are_refused(tmp_path, monkeypatch):
    (tmp_path / "profiles" / "mine").mkdir(parents=True)
    (tmp_path / "hermes.yaml").write_text("agents:\n  - {name: h, runtime: hermes, profile: profiles/mine, "
                                          "capabilities: [network]}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the supervisor's folder: the workspace's
    from hermes_sup.supervisor.config.runtimes import profile_dir

    assert profile_dir(load_config(tmp_path / "hermes.yaml")["agents"][0]) == tmp_path / "profiles" / "mine"
    for bad in ("'..'", "''", "5"):
        (tmp_path / "hermes.yaml").write_text(f"agents:\n  - {{name: h, runtime: hermes, profile: {bad}, "
                                              "capabilities: [network]}\n")
        with pytest.raises(ConfigError, match="needs 'profile'"):
            load_config(tmp_path / "hermes.yaml")


def test_hermes_runs_are_spend_a_budget_holds(tmp_path, up):
    """A Hermes run's cost is known when it ends (its usage file; priced by hermes.yaml's prices when
    they name its model): a run starts only while no cap is reached, and its cost is settled after,
    so the cap is overshot by no more than the runs in flight, and the next task waits, saying why.
    The CLI here is a stand-in that writes the usage file a real run does (its shape is the real
    one's: test_a_hermes_worker_and_a_built_in_one_share_the_board)."""
    import subprocess

    cli = tmp_path / "cli" / "bin"
    cli.mkdir(parents=True)
    program = cli / "hermes"
    program.write_text('#!/bin/sh\nwhile [ "$1" != "--usage-file" ]; do shift; done\n'
                       'printf \'{"completed": true, "failed": false, "model": "priced-model", "input_tokens": '
                       '100000, "output_tokens": 0, "api_calls": 1}\' > "$2"\necho answered\n')
    program.chmod(0o755)
    home = tmp_path / "hermes-home"
    home.mkdir()
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(f"""\
budgets: {{team: {{per_day: 0.5}}}}
prices: {{priced-model: {{input: 3.0, output: 15.0}}}}
agents:
  - {{name: herm, runtime: hermes, profile: default, hermes_home: '{home}', program: '{program}',
     capabilities: [network], sandbox: none}}
""")
    board = Board(ws / "kanban")
    for task_id in ("one", "two", "three"):
        board.add({"id": task_id, "title": f"task {task_id}", "priority": {"one": 3, "two": 2, "three": 1}[task_id]})
    up(ws)
    wait_until(lambda: board.get("one")["status"] == "done" and board.get("two")["status"] == "done", timeout=90)
    waiting = wait_until(lambda: "budget reached" in (board.get("three").get("waiting") or "")
                         and board.get("three"), timeout=60)
    assert waiting["status"] == "todo", "two runs of $0.30 spent $0.60: the third waits for the next day"
    usage = json.loads(subprocess.run([*CLI, "-w", str(ws), "usage", "--json"], capture_output=True, text=True,
                                      cwd=ROOT).stdout)
    assert usage["total"]["cost_usd"] == 0.6 and usage["budgets"][0]["spent"] == 0.6, usage
