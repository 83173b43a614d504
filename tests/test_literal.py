"""User text is printed as written: never parsed as rich markup or emoji codes, and its control
characters (ESC, CSI, OSC, C1, bidi overrides) never reach the terminal, in every command."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hermes_sup.kanban import Board
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.cliargs import json_text
from hermes_sup.supervisor.views import render
from rich.console import Console

from .conftest import CLI, wait_until

# Markup that crashes rich ([/var/tmp]: a closing tag with no opening one) or forges styling and
# links, an emoji code, and the escapes a terminal acts on: OSC (set the title), CSI (clear the
# screen), an 8-bit CSI, a bidi override.
MARKUP = "[/var/tmp] [bold]b[/bold] [link=http://x]l[/link] :thumbs_up:"
ESCAPES = "\x1b]0;pwned\x07 \x1b[2J \u009b31m \u202eevil"
SHOWN = "\\x1b]0;pwned\\x07 \\x1b[2J \\x9b31m \\u202eevil"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def clean(text: str) -> bool:
    return not any(raw in text for raw in RAW)


def test_visible_shows_every_control_as_an_escape():
    assert render.visible(ESCAPES) == SHOWN
    assert render.visible("a\tb\nc\rd\x00\x7f") == "a\tb\nc\\rd\\x00\\x7f"
    assert render.visible("a\tb\nc", one_line=True) == "a\\tb\\nc"
    assert render.visible("ünïcode ✓ 日本") == "ünïcode ✓ 日本"
    assert json.loads(json_text({"t": ESCAPES})) == {"t": ESCAPES} and clean(json_text({"t": ESCAPES}))


@pytest.mark.parametrize("terminal", [False, True])
def test_the_pictures_print_user_text_exactly(terminal):
    doc = {"id": "t-1", "title": f"{MARKUP} {ESCAPES}", "status": "failed", "priority": 1, "attempts": 1,
           "max_attempts": 3, "error": f"err {MARKUP} {ESCAPES}", "result": f"res {ESCAPES}", "body": ESCAPES,
           "claim": None, "history": [{"at": "now", "from": "todo", "to": "failed", "by": "[/]", "note": ESCAPES}]}
    agents = [{"name": "[/]", "pid": None, "state": "[/x]", "task": MARKUP, "last_exit": ESCAPES,
               "children": [{"name": ESCAPES, "pid": 1, "task": MARKUP}]}]
    usage = {MARKUP + ESCAPES: {"calls": 1, "failed_calls": 0, "tokens_in": 1, "tokens_cached": 0, "tokens_out": 1,
                                "cost_usd": 0.0, "unpriced_calls": 0}}
    skills = [{"name": "[/s]", "kind": "instructions", "source": "workspace", "state": "rejected",
               "error": ESCAPES, "description": MARKUP, "tools": []}]
    buffer = io.StringIO()
    console = Console(file=buffer, width=400, force_terminal=terminal, color_system="truecolor" if terminal else None)
    render.print_board(console, render.board_document([doc], [{"path": "[/p]", "reason": ESCAPES}],
                                                      {"rejected": [{"file": "[/f]", "reason": ESCAPES,
                                                                     "moved_to": "x"}]}))
    for picture in (render.task_table([doc]), render.task_detail(doc), render.status_table(agents),
                    render.usage_table("agent", usage), render.skills_table(skills)):
        console.print(picture)
    text = buffer.getvalue()
    for part in (MARKUP, SHOWN, "[/]", "[/x]", "[/p]", "[/f]", "[/s]"):
        assert part in text
    assert "\x1b]" not in text and "\x1b[2J" not in text and "\x9b" not in text and "\u202e" not in text
    assert terminal or "\x1b" not in text  # at a terminal, rich's own colours are the only escapes


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    assert CliRunner().invoke(main, ["init", str(tmp_path / "ws")]).exit_code == 0
    return tmp_path / "ws"


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide enough that no table folds the text a test looks for."""
    from hermes_sup.supervisor.cli import common as module

    for console in (module.out, module.err):
        monkeypatch.setattr(console, "width", 1000)


def cli(ws: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["-w", str(ws), *args])
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    return result.exit_code, result.output


def test_every_command_prints_hostile_tasks_agents_and_logs_literally(ws):
    board = Board(ws / "kanban")
    hostile = board.add({"title": f"{MARKUP} {ESCAPES}", "body": f"body {MARKUP}\n{ESCAPES}"})
    claimed = board.claim("[/]")
    board.complete(claimed["id"], claimed["claim"]["token"], {"answer": f"{MARKUP} {ESCAPES}"})
    board.add({"title": "held"})
    board.claim("[/]")  # held by this (live) process: it stays in doing, shown with its holder
    board.close()
    (ws / "kanban" / "inbox" / "[x].json").write_text("{" + ESCAPES)
    runs = ws / "runs"
    (runs / "worker-1").mkdir(parents=True)
    (runs / "worker-1" / "agent.log").write_text(f"log {MARKUP} {ESCAPES}\n")
    (runs / "worker-1" / "llm_calls.jsonl").write_text(json.dumps(
        {"provider": ESCAPES, "model": MARKUP, "task": "[/t]", "outcome": "ok", "tokens_in": 1, "tokens_out": 1,
         "cost_usd": None}) + "\n")
    (runs / "supervisor.json").write_text(json.dumps(
        {"pid": None, "agents": {"[/]": {"pid": None, "state": "stopped", "task": MARKUP, "last_exit": ESCAPES}}}))
    skill = ws / "skills" / "evil"
    skill.mkdir()
    (skill / "SKILL.md").write_text(f"---\nname: evil\ndescription: \"{MARKUP} \\e]0;pwned\\a\"\n---\nbody\n")
    outputs = {}
    for args in (["task", "list"], ["task", "show", hostile["id"]], ["board"], ["status"], ["logs"], ["usage"],
                 ["skills", "list"], ["task", "list", "--json"], ["board", "--json"], ["task", "show", "[/nope]"]):
        code, output = cli(ws, *args)
        assert code == (2 if "[/nope]" in args else 0), (args, output)
        assert clean(output), (args, output)
        outputs[" ".join(args)] = output
    assert f"{MARKUP} {SHOWN}" in outputs["task list"] and "[/]" in outputs["task list"]
    assert MARKUP in outputs["task show " + hostile["id"]] and SHOWN in outputs["task show " + hostile["id"]]
    assert "[/]" in outputs["task show " + hostile["id"]]
    assert MARKUP in outputs["board"] and "@[/]" in outputs["board"]  # a card shows 80 characters of a title
    assert "rejected inbox/[x].json" in outputs["task list"]
    assert "[/]" in outputs["status"] and "\\x1b]0;pwned" in outputs["status"]
    assert f"log {MARKUP} {SHOWN}" in outputs["logs"]
    assert "[/t]" in outputs["usage"] and "\\x1b]0;pwned" in outputs["usage"]
    assert MARKUP in outputs["skills list"] and "\\x1b]0;pwned" in outputs["skills list"]
    assert json.loads(outputs["board --json"])["columns"]["done"][0]["title"] == f"{MARKUP} {ESCAPES}"
    assert "error: no task '[/nope]' on the board" in outputs["task show [/nope]"]


def test_doctor_and_config_errors_print_the_users_text_literally(ws):
    (ws / "hermes.yaml").write_text('agents:\n  - name: a\n    "[/k] \\e]0;pwned\\a": 1\n')
    for args in (["doctor"], ["logs"]):
        code, output = cli(ws, *args)
        assert code in (1, 2) and "unknown agent key '[/k] \\x1b]0;pwned" in output, output
        assert clean(output)


def test_up_prints_a_claim_by_an_agent_named_markup_and_hostile_log_lines_and_keeps_running(ws, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Board(ws / "kanban") as board:
        board.add({"title": "held by a dead agent"})
        board.claim("[/]", pid=dead.pid)  # the supervisor recovers it, saying who held it
    (ws / "hermes.yaml").write_text(f"agents:\n  - name: w\n    command: [{sys.executable}, "
                                    f"{Path(__file__).parent / 'fake_agent.py'}, beat]\n")
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=stdout, stderr=stderr)
    try:
        wait_until(lambda: "w: started" in err.read_text() or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, err.read_text()
        # The claim is recovered on the supervisor's board thread, not in line with the agent's start.
        wait_until(lambda: "holder [/] (pid" in err.read_text() or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, err.read_text()
        log = ws / "runs" / "w" / "agent.log"
        wait_until(log.exists, timeout=30)
        with open(log, "a") as handle:
            handle.write(f"{MARKUP} {ESCAPES}\n")
        wait_until(lambda: SHOWN in out.read_text(), timeout=30)
        assert f"w | {MARKUP} {SHOWN}" in out.read_text() and proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert clean(out.read_text()) and clean(err.read_text()), (out.read_text(), err.read_text())


def test_a_control_character_in_hermes_yaml_is_refused_with_its_line(tmp_path):
    from hermes_sup.supervisor.config.workspace import ConfigError, load_config

    path = tmp_path / "hermes.yaml"
    path.write_text("agents:\n  - name: a\n    identity: \"x\x1b]0;pwned\"\n")
    with pytest.raises(ConfigError, match=r"hermes\.yaml:3: invalid YAML: character 0x001b is not allowed"):
        load_config(path)


def test_up_stops_even_when_an_agent_log_was_replaced_by_a_fifo(ws, tmp_path):
    (ws / "hermes.yaml").write_text(f"agents:\n  - name: w\n    command: [{sys.executable}, "
                                    f"{Path(__file__).parent / 'fake_agent.py'}, beat]\n")
    err = tmp_path / "up.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        state = ws / "runs" / "supervisor.json"
        wait_until(lambda: state.exists() and json.loads(state.read_text())["agents"]["w"]["state"] == "running",
                   timeout=30)
        log = ws / "runs" / "w" / "agent.log"
        log.unlink()
        os.mkfifo(log)  # reading it blocks until someone writes
        proc.terminate()
        assert proc.wait(timeout=30) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
