"""Why a task is not moving, as `board`, `task show` and `task add` show it: real commands, a real
board, and (last test) a real team whose only provider is unreachable."""

from __future__ import annotations

import io
import json
import socket
import subprocess
from pathlib import Path

from hermes_sup.kanban import Board
from hermes_sup.supervisor import team
from hermes_sup.supervisor.config.workspace import Workspace
from hermes_sup.supervisor.views import render
from rich.console import Console

from .conftest import CLI, ROOT, init_workspace, supervisor_state, wait_until

UNREACHABLE = "provider local down until 2026-11-22T18:00:00Z (unreachable)"


def hermes(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def make_ws(tmp_path: Path, team: str) -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n" + team)
    return ws


TEAM = "agents:\n  - name: coder\n    roles: [code]\n"


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_task_add_warns_about_a_task_no_agent_could_ever_claim_and_adds_it_all_the_same(tmp_path):
    ws = make_ws(tmp_path, TEAM)
    added = hermes(ws, "task", "add", "needs nope", "--depends-on", "nope", "--id", "x")
    assert added.returncode == 0 and added.stdout == "x\n"
    assert added.stderr.strip() == "warning: x: no agent can ever claim it: it depends on nope, not on the board"
    as_json = hermes(ws, "task", "add", "design it", "--role", "design", "--id", "y", "--json")
    doc = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and doc["id"] == "y" and doc["status"] == "todo"
    assert doc["warnings"] == ["y: no agent can ever claim it: no agent has the role design (roles of the team: code)"]
    ghost = json.loads(hermes(ws, "task", "add", "for a ghost", "--assignee", "ghost", "--json").stdout)
    assert len(ghost["warnings"]) == 1 and "its assignee ghost is no agent of the team" in ghost["warnings"][0]
    fine = hermes(ws, "task", "add", "code it", "--role", "code", "--depends-on", "x", "--json")
    assert fine.returncode == 0 and json.loads(fine.stdout)["warnings"] == [] and fine.stderr == ""
    assert {d["id"] for d in Board(ws / "kanban").list("todo").tasks} >= {"x", "y"}


def test_board_and_task_show_say_the_structural_reason_not_a_note_an_agent_left(tmp_path):
    ws = make_ws(tmp_path, TEAM)
    board = Board(ws / "kanban")
    board.add({"id": "x", "title": "needs nope", "depends_on": ["nope"]})
    board.add({"id": "y", "title": "design", "role": "design"})
    board.add({"id": "z", "title": "plain", "role": "code"})
    board.mark_waiting(UNREACHABLE)  # what agents wrote on every task before: it must not be what is shown
    columns = json.loads(hermes(ws, "board", "--json").stdout)["columns"]
    why = {item["id"]: (item["waiting_kind"], item["waiting"]) for item in columns["todo"]}
    assert why["x"] == ("dependency_missing", "it depends on nope, not on the board")
    assert why["y"] == ("no_role", "no agent has the role design (roles of the team: code)")
    assert why["z"] == ("not_running", "the team is not running (start it with `hermes-sup up`)")
    shown = json.loads(hermes(ws, "task", "show", "x", "--json").stdout)
    assert (shown["waiting_kind"], shown["waiting"]) == why["x"]
    text = hermes(ws, "task", "show", "x").stdout
    assert "waiting: it depends on nope, not on the board" in text and "unreachable" not in text
    picture = " ".join(hermes(ws, "board").stdout.split())  # the cards wrap in their columns
    assert "unreachable" not in picture and "no agent has the role" in picture


def test_a_dropped_task_no_agent_could_claim_is_ingested_with_a_warning_on_the_board(tmp_path):
    ws = make_ws(tmp_path, TEAM)
    (ws / "kanban" / "inbox" / "drop.yaml").write_text("id: dropped\ntitle: dropped\nrole: nobody\n")
    shown = hermes(ws, "board")
    assert shown.returncode == 0 and "ingested dropped" in shown.stdout
    assert "warning dropped: no agent can ever claim it: no agent has the role nobody" in " ".join(shown.stdout.split())
    assert Board(ws / "kanban").get("dropped")["status"] == "todo"
    (ws / "kanban" / "inbox" / "again.yaml").write_text("id: again\ntitle: again\nassignee: ghost\n")
    document = json.loads(hermes(ws, "board", "--json").stdout)
    assert document["ingest"]["ingested"] == ["again"] and len(document["warnings"]) == 1
    assert document["warnings"][0].startswith("again: no agent can ever claim it: its assignee ghost")


def test_with_an_unreachable_provider_only_the_tasks_the_agent_could_take_say_so(tmp_path, up):
    ws = make_ws(tmp_path, f"providers:\n  local: {{kind: openai, base_url: '{closed_port_url()}/v1', model: m}}\n"
                           "tiers: {cheap: [local], standard: [local], premium: [local]}\n" + TEAM)
    board = Board(ws / "kanban")
    board.add({"id": "x", "title": "needs nope", "depends_on": ["nope"]})
    board.add({"id": "y", "title": "design", "role": "design"})
    board.add({"id": "z", "title": "plain"})
    up(ws)
    wait_until(lambda: (board.get("z").get("waiting") or "").startswith("provider local down until "), timeout=60)
    wait_until(lambda: supervisor_state(ws)["agents"]["coder"]["state"] == "running", timeout=30)
    agent_state = ws / "runs" / "coder" / "state.json"
    wait_until(lambda: json.loads(agent_state.read_text())["waiting"].startswith("provider local down until "),
               timeout=30)
    # The agent marks again after each look; the tasks it could not take are never marked.
    assert "waiting" not in board.get("x") and "waiting" not in board.get("y")
    columns = json.loads(hermes(ws, "board", "--json").stdout)["columns"]
    why = {item["id"]: (item["waiting_kind"], item["waiting"]) for item in columns["todo"]}
    assert why["x"] == ("dependency_missing", "it depends on nope, not on the board")
    assert why["y"][0] == "no_role"
    assert why["z"][0] == "provider_cooldown" and why["z"][1].startswith("provider local down until ")
    shown = json.loads(hermes(ws, "task", "show", "z", "--json").stdout)
    assert shown["waiting_kind"] == "provider_cooldown"
    hermes(ws, "down")


def test_the_supervisor_logs_a_warning_at_once_for_a_dropped_task_no_agent_could_claim(tmp_path, up):
    ws = make_ws(tmp_path, TEAM)
    up(ws)
    wait_until(lambda: supervisor_state(ws)["agents"]["coder"]["state"] == "running", timeout=30)
    inbox = ws / "kanban" / "inbox"
    (inbox / "fine.yaml").write_text("id: fine\ntitle: fine\nrole: code\n")
    (inbox / "lost.yaml").write_text("id: lost\ntitle: lost\nrole: nobody\ndepends_on: [fine]\n")
    log = tmp_path / "up.log"
    expected = ("ingest: warning: lost: no agent can ever claim it: no agent has the role nobody "
                "(roles of the team: code)")
    # Within half the ingest warnings' 30 s recheck: the append that ingested the drop woke them.
    wait_until(lambda: expected in " ".join(log.read_text().split()), timeout=15)
    assert Board(ws / "kanban").get("lost")["status"] == "todo", "ingested all the same"
    assert "warning: fine" not in log.read_text()
    hermes(ws, "down")


def test_only_ingest_events_name_tasks_to_judge():
    from hermes_sup.supervisor.ingestwarn import ingested

    records = [{"task": "a", "from": "inbox", "to": "todo", "by": "ingest"},
               {"task": "b.json", "from": "inbox", "to": "rejected", "by": "ingest"},
               {"task": "c", "from": None, "to": "todo", "by": "cli"},
               {"task": "../../etc", "from": "inbox", "to": "todo", "by": "ingest"},
               {"task": ["x"], "from": "inbox", "to": "todo", "by": "ingest"}]
    assert ingested(records) == ["a"]


def test_a_warning_prints_the_role_it_names_literally(tmp_path):
    ws = make_ws(tmp_path, TEAM)
    added = hermes(ws, "task", "add", "hostile", "--role", "\x1b]8;;http://x\x07[bold]r", "--id", "h")
    assert added.returncode == 0 and "\x1b" not in added.stderr and "\x07" not in added.stderr
    assert "no agent has the role \\x1b]8;;http://x\\x07[bold]r" in added.stderr
    picture = hermes(ws, "board").stdout
    assert "\x1b" not in picture and "\\x1b" in picture


def test_board_says_why_for_the_cards_it_shows_and_prints_what_the_whole_board_would(tmp_path):
    ws = make_ws(tmp_path, TEAM)
    board = Board(ws / "kanban")
    # 12 waiting tasks, each for its own reason (a role no agent has, a dependency missing or not
    # done, the team not running), and 10 blocked: more in each column than the picture shows.
    for n in range(12):
        board.add({"id": f"t-{n:02d}", "title": f"task {n}", "priority": n % 4,
                   "role": "design" if n % 3 == 0 else "code",
                   "depends_on": [f"gone-{n}"] if n % 3 == 1 else [f"t-{n - 1:02d}"] if n % 3 == 2 else []})
    for n in range(10):
        board.add({"id": f"b-{n:02d}", "title": f"asks {n}", "role": "code", "priority": 9})
        claimed = board.claim("coder", roles=["code"])
        board.block(claimed["id"], claimed["claim"]["token"], "stuck", question=f"which one, {n}?")
    listing = board.list()
    whole = render.board_document(listing.tasks, listing.damaged, {}, team.reasons(listing.tasks, team.load_team(
        Workspace(ws), {}, False)), [], ([], 0))
    expected = io.StringIO()
    render.print_board(Console(file=expected, width=80, soft_wrap=False, markup=False, emoji=False), whole)

    shown = hermes(ws, "board")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == expected.getvalue()
    assert "... 4 more" in shown.stdout and "... 2 more" in shown.stdout
    # --json still holds every task, each with why it waits.
    document = json.loads(hermes(ws, "board", "--json").stdout)
    assert document["counts"]["todo"] == 12 and len(document["columns"]["todo"]) == 12
    assert all(item["waiting"] for item in document["columns"]["todo"] + document["columns"]["blocked"])
    assert document["columns"] == whole["columns"]


def test_a_task_its_ingest_event_shows_claimable_is_not_read_again():
    """Each event carries its task's role, assignee and dependencies: a task claimable as
    ingested is not read back; any other, and any event without a well-formed carry, is."""
    from hermes_sup.kanban.index import carried
    from hermes_sup.kanban.why import Member, Team
    from hermes_sup.supervisor.ingestwarn import to_judge

    team = Team(members=(Member(name="coder", roles=("code",), tier=None),))

    def event(task_id: str, **fields: object) -> dict:
        doc = {"priority": 0, "created_at": "2026-11-29T00:00:00Z", "updated_at": "2026-11-29T00:00:00Z",
               "assignee": None, "role": None, "depends_on": [], "steps": [], "waiting": None, **fields}
        return {"task": task_id, "from": "inbox", "to": "todo", "by": "ingest", "index": carried(doc)}

    plain, coded = event("plain"), event("coded", role="code")
    records = [plain, coded, event("designed", role="design"), event("assigned", assignee="coder"),
               event("after", depends_on=["plain"]), {**event("bare"), "index": None},
               {**event("odd"), "index": {**plain["index"], "role": 7}},
               {**coded, "by": "cli", "from": None}]
    assert to_judge(records, team) == ["designed", "assigned", "after", "bare", "odd"]
    assert to_judge([plain, coded], Team(members=())) == ["plain", "coded"], "no agent at all: read and judged"
    assert to_judge([plain], None) == ["plain"], "no team known: read and judged"
