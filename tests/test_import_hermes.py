"""`hermes-sup import-hermes`: a Hermes Agent profile (fixtures from hermes-agent 0.19.0) becomes an
agent of hermes.yaml; keys only by name; hostile profiles refused with nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hermes_sup.agents.skills import Skills
from hermes_sup.supervisor.cli import hermes as cli_hermes
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.config.workspace import load_config

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hermes"
SECRETS = ("sk-or-v1-0123456789abcdef", "sk-ant-api03-fedcba9876543210")
SOUL = ("You are Ada: a careful research assistant.\n\n  # not a comment, 'quoted' \"too\"\n"
        "key: value, - item, {flow}, [list] & *alias !tag %directive @at `tick`\n"
        "Ends with spaces   \nÜnïcödé ✓")
CONFIG = """\
model:
  default: anthropic/claude-sonnet-4
  provider: openrouter
fallback_providers:
  - {provider: anthropic, model: claude-sonnet-4-5}
  - {provider: mystery, model: m-1}
memory:
  user_char_limit: 2000
telegram:
  enabled: true
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    assert CliRunner().invoke(main, ["init", str(tmp_path / "ws")]).exit_code == 0
    return tmp_path / "ws"


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    home = tmp_path / "hermes-home"
    shutil.copytree(FIXTURES / "memories", home / "memories")
    shutil.copytree(FIXTURES / "skills", home / "skills")
    (home / "config.yaml").write_text(CONFIG)
    (home / ".env").write_text(f"OPENROUTER_API_KEY={SECRETS[0]}\nexport ANTHROPIC_API_KEY=\"{SECRETS[1]}\"\n")
    (home / "SOUL.md").write_text(SOUL)
    (home / "cron").mkdir()
    (home / "sessions").mkdir()
    return home


def invoke(ws: Path, *args: str):
    return CliRunner().invoke(main, ["-w", str(ws), "import-hermes", *args])


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_hermes_profile_becomes_an_agent(ws, profile):
    nested = profile / "skills/research/polymarket/live-odds"  # a skill inside a skill, as Hermes has some
    nested.mkdir()
    (nested / "SKILL.md").write_text("---\nname: live-odds\ndescription: Odds now.\n---\nBody.\n")
    before = (ws / "hermes.yaml").read_text()
    (ws / "hermes.yaml.before").write_text(before)
    old_umask = os.umask(0)  # a lax umask: the import makes the memory private itself
    try:
        result = invoke(ws, str(profile), "--name", "ada", "--json")
    finally:
        os.umask(old_umask)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    config = load_config(ws / "hermes.yaml")
    agent = config["agents"][-1]
    assert agent["name"] == "ada" and agent["identity"] == SOUL.strip()
    assert agent["memory"] == {"user_char_limit": 2000}
    assert "kanban" in agent["toolsets"] and "shell" not in agent["capabilities"]
    assert config["providers"]["ada"] == {"kind": "openai", "model": "anthropic/claude-sonnet-4",
                                          "base_url": "https://openrouter.ai/api/v1",
                                          "api_key_env": "OPENROUTER_API_KEY"}
    assert config["providers"]["ada-fallback-1"] == {"kind": "anthropic", "model": "claude-sonnet-4-5",
                                                     "api_key_env": "ANTHROPIC_API_KEY"}
    assert agent["providers"] == ["ada", "ada-fallback-1"], "the profile's own chain, the mystery one left out"
    assert config["tiers"] == load_config(ws / "hermes.yaml.before")["tiers"], "the team's tiers are left alone"
    after = (ws / "hermes.yaml").read_text()
    assert [line for line in before.splitlines() if line.startswith("#")] == \
        [line for line in after.splitlines() if line.startswith("#")], "the user's comments are kept"
    assert "  - name: worker" in after
    for name in ("MEMORY.md", "USER.md"):
        assert (ws / "runs/ada/memory" / name).read_bytes() == (FIXTURES / "memories" / name).read_bytes()
        assert (ws / "runs/ada/memory" / name).stat().st_mode & 0o777 == 0o600, "private, as Hermes keeps it"
    for folder in ("runs", "runs/ada", "runs/ada/memory"):
        assert (ws / folder).stat().st_mode & 0o777 == 0o700, folder
    listed = {skill.name for skill in Skills(ws, bundled=ws / "none").catalog()}
    assert {"polymarket", "nano-pdf"} <= listed
    assert agent["skills"] == ["apple-notes", "live-odds", "nano-pdf", "polymarket"], "its own, as Hermes keeps them"
    assert (ws / "skills/research/polymarket/references/api-endpoints.md").is_file()
    assert (ws / "skills/research/polymarket/live-odds/SKILL.md").read_text().endswith("Body.\n")
    not_carried = {item["what"] for item in report["not_carried_over"]}
    assert {"gateway", "sessions", "model"} <= not_carried and "cron" not in not_carried, "an empty cron/ is no loss"
    assert any("mystery" in item["why"] for item in report["not_carried_over"])
    assert any("ANTHROPIC_API_KEY, OPENROUTER_API_KEY" in note for note in report["carried_over"])
    everything = result.output + "".join(data.decode("utf-8", "replace") for data in snapshot(ws).values())
    assert not any(secret in everything for secret in SECRETS), "a key's value reached the workspace or the output"


def test_a_dry_run_writes_nothing_and_a_taken_name_is_refused(ws, profile):
    before = snapshot(ws)
    result = invoke(ws, str(profile), "--name", "ada", "--dry-run")
    assert result.exit_code == 0 and result.output.startswith(f"would import {profile} as agent ada")
    assert "not carried over:\n  gateway: messaging gateways" in result.output
    assert snapshot(ws) == before
    result = invoke(ws, str(profile), "--name", "worker")
    assert result.exit_code == 1 and "already has an agent named worker" in result.output
    assert snapshot(ws) == before


@pytest.mark.parametrize("damage, message", [
    (lambda home: (home / "config.yaml").write_text("model: [unclosed\n"), "config.yaml is not valid YAML at line"),
    (lambda home: (home / "config.yaml").write_text("a: &x 1\nb: *x\n"), "aliases (*x) are not allowed"),
    (lambda home: (home / "config.yaml").write_text("- a list\n"), "config.yaml must be a mapping"),
    (lambda home: (home / "SOUL.md").write_text("x" * 70_000), "SOUL.md (" ),
    (lambda home: (home / "SOUL.md").write_bytes(b"\xff\xfe"), "SOUL.md is not UTF-8 text"),
    (lambda home: ((home / "SOUL.md").unlink(), (home / "SOUL.md").symlink_to("/etc/passwd")), "is a symlink"),
    (lambda home: ((home / "config.yaml").unlink(), os.mkfifo(home / "config.yaml")), "is not a regular file"),
    (lambda home: (home / "memories/MEMORY.md").write_text("m" * 1_100_000), "larger than 1,048,576 bytes"),
])
def test_a_hostile_profile_is_refused_with_nothing_written(ws, profile, damage, message):
    damage(profile)
    before = snapshot(ws)
    result = invoke(ws, str(profile), "--name", "ada")
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert snapshot(ws) == before


def test_a_broken_hermes_yaml_is_named_with_its_line_and_problem_as_a_broken_config_yaml_is(ws, profile):
    config = ws / "hermes.yaml"
    config.write_text(config.read_text() + "extra: [unclosed\n")
    lines = config.read_text().count("\n")
    result = invoke(ws, str(profile), "--name", "ada")
    assert result.exit_code == 1 and "Traceback" not in result.output
    expected = "did not find expected ',' or ']'"
    assert f"{config} is not valid YAML at line {lines + 1}, fix it first: {expected}" in result.output
    (profile / "config.yaml").write_text("model: [unclosed\n")
    assert f"config.yaml is not valid YAML at line 2: {expected}" in invoke(ws, str(profile)).output


def test_links_in_skills_are_not_followed_and_an_oversized_memory_is_flagged(ws, profile, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("private")
    (profile / "skills/research/polymarket/references/leak.md").symlink_to(tmp_path / "outside" / "secret.txt")
    (profile / "skills/research/elsewhere").symlink_to(tmp_path / "outside")
    (profile / "memories/MEMORY.md").write_text("\n§\n".join(f"fact {i} " + "x" * 100 for i in range(30)))
    result = invoke(ws, str(profile), "--name", "ada", "--json")
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.output)["warnings"]
    assert "not copied: skills/research/polymarket/references/leak.md: a symlink, not followed" in warnings
    assert "not copied: skills/research/elsewhere: a symlink, not followed" in warnings
    assert any("more than Hermes Agent's 2,200" in warning for warning in warnings)
    assert not (ws / "skills/research/polymarket/references/leak.md").exists()
    assert "private" not in "".join(d.decode("utf-8", "replace") for d in snapshot(ws).values())


def test_a_one_line_agents_list_is_refused_and_a_failed_write_takes_back_what_it_moved(ws, profile, monkeypatch):
    text = (ws / "hermes.yaml").read_text()
    (ws / "hermes.yaml").write_text(text.replace("agents:\n  - name: worker\n    roles: [work]\n    tier: cheap\n"
                                                 "    count: 2\n", "agents: [{name: worker}]\n"))
    before = snapshot(ws)
    result = invoke(ws, str(profile), "--name", "ada")
    assert result.exit_code == 1 and "writes agents on one line" in result.output
    assert snapshot(ws) == before

    (ws / "hermes.yaml").write_text(text)
    before = snapshot(ws)

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device", str(ws / "hermes.yaml"))

    monkeypatch.setattr(cli_hermes, "write_atomic", failing)
    result = invoke(ws, str(profile), "--name", "ada")
    assert result.exit_code == 1 and "No space left on device" in result.output
    assert snapshot(ws) == before, "the memory and skills moved in were taken out again"
    assert not [p for p in ws.rglob(".import-*")], "no staging folder left behind"


def test_board_moves_the_open_tasks_of_a_hermes_kanban_db(ws, profile):
    from hermes_sup.kanban import Board

    shutil.copy(FIXTURES / "kanban.db", profile / "kanban.db")
    result = invoke(ws, str(profile), "--name", "ada", "--board", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert "kanban" not in {item["what"] for item in report["not_carried_over"]}
    assert report["written"][-1] == "board: 3 tasks added"
    assert "assignees with no agent here, left unassigned: researcher-b, writer" in report["warnings"]
    board = Board(ws / "kanban")
    try:
        tasks = {doc["meta"]["hermes"]["id"]: doc for doc in board.list().tasks}
    finally:
        board.close()
    assert set(tasks) == {"t_32348092", "t_22f9cf34", "t_348d2e49"}, "the done task is not moved"
    research_a, synth = tasks["t_32348092"], tasks["t_348d2e49"]
    assert research_a["assignee"] == "ada", "Hermes' default profile is the imported agent"
    assert research_a["priority"] == 2 and research_a["meta"]["hermes"]["tenant"] == "acme"
    assert research_a["body"] == "Read source A.\n\nComments on Hermes' board:\n- lead: Focus on 2025 data."
    assert sorted(synth["depends_on"]) == ["hermes-t-22f9cf34", "hermes-t-32348092"], "done parents are met"
    assert all(doc["status"] == "todo" for doc in tasks.values())
    again = invoke(ws, str(profile), "--name", "bob", "--board", "--json")
    assert json.loads(again.output)["written"][-1] == "board: 0 tasks added, 3 already there"


def test_a_broken_kanban_db_is_refused_before_anything_is_written(ws, profile, tmp_path):
    before = snapshot(ws)
    (profile / "kanban.db").write_bytes(b"not a database" * 100)
    result = invoke(ws, str(profile), "--name", "ada", "--board")
    assert result.exit_code == 1 and "is not a Hermes kanban database, or is damaged" in result.output
    (profile / "kanban.db").unlink()
    (profile / "kanban.db").symlink_to(FIXTURES / "kanban.db")
    result = invoke(ws, str(profile), "--name", "ada", "--board")
    assert result.exit_code == 1 and "is a symlink; it is not followed" in result.output
    assert snapshot(ws) == before


def test_board_refuses_an_id_taken_by_another_task_before_writing(ws, profile):
    from hermes_sup.kanban import Board

    shutil.copy(FIXTURES / "kanban.db", profile / "kanban.db")
    board = Board(ws / "kanban")
    board.add({"id": "hermes-t-22f9cf34", "title": "someone else's"})
    board.close()
    before = snapshot(ws)
    result = invoke(ws, str(profile), "--name", "ada", "--board")
    assert result.exit_code == 1 and "already has tasks hermes-t-22f9cf34 that are not Hermes'" in result.output
    assert snapshot(ws) == before


def test_the_command_line_has_import_hermes(ws, profile):
    import subprocess

    from .conftest import CLI, ROOT

    done = subprocess.run([*CLI, "-w", str(ws), "import-hermes", str(profile), "--name", "ada", "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"would import {profile} as agent ada\n")


def test_a_profiles_own_address_for_a_known_provider_is_not_given_that_providers_key(ws, profile):
    # The workspace's ANTHROPIC_API_KEY was paired with whatever base_url the profile named, and the
    # import puts the profile's providers first in every tier: the team's key and tasks went there.
    (profile / "config.yaml").write_text(
        "model:\n  default: claude-sonnet-4-5\n  provider: anthropic\n  base_url: https://collector.example/v1\n"
        "fallback_providers:\n  - {provider: openrouter, model: a/b, base_url: 'https://openrouter.ai/api/v1/'}\n")
    result = invoke(ws, str(profile), "--name", "ada", "--json")
    assert result.exit_code == 0, result.output
    providers = load_config(ws / "hermes.yaml")["providers"]
    assert providers["ada"] == {"kind": "anthropic", "model": "claude-sonnet-4-5",
                                "base_url": "https://collector.example/v1"}, "no key variable named"
    assert providers["ada-fallback-1"]["api_key_env"] == "OPENROUTER_API_KEY", "the provider's own address keeps it"
    report = json.loads(result.output)
    assert any("https://collector.example/v1" in note and "ANTHROPIC_API_KEY" in note
               for note in report["carried_over"]), report["carried_over"]


def test_a_kanban_db_whose_tables_are_endless_views_is_refused_at_once(ws, profile):
    # SQL in a hostile file runs when it is read: a `tasks` view over an endless recursive query held
    # the import (and its memory) for as long as it liked.
    import sqlite3
    import subprocess
    import sys

    db = sqlite3.connect(profile / "kanban.db")
    db.executescript(
        "CREATE VIEW Tasks AS WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
        "SELECT x AS id, 't' AS title, '' AS body, NULL AS assignee, 'todo' AS status, 0 AS priority, "
        "NULL AS tenant, x AS created_at FROM n;"
        "CREATE TABLE task_links (parent_id, child_id); CREATE TABLE task_comments (id, task_id, author, body);")
    db.close()
    before = snapshot(ws)
    done = subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "-w", str(ws), "import-hermes",
                           str(profile), "--name", "ada", "--board"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "kanban.db" in done.stderr and "tasks is a view" in done.stderr, done.stderr
    assert snapshot(ws) == before


def test_a_kanban_db_value_over_its_limit_is_refused(ws, profile):
    # A generated column makes a value of any size out of a small file.
    import sqlite3

    db = sqlite3.connect(profile / "kanban.db")
    db.executescript(
        "CREATE TABLE tasks (id TEXT, title TEXT, assignee TEXT, status TEXT, priority INT, tenant TEXT, "
        "created_at INT, body BLOB GENERATED ALWAYS AS (zeroblob(64 * 1024 * 1024)) VIRTUAL);"
        "INSERT INTO tasks (id, title, status, created_at) VALUES ('t1', 'big', 'todo', 1);"
        "CREATE TABLE task_links (parent_id, child_id); CREATE TABLE task_comments (id, task_id, author, body);")
    db.close()
    assert (profile / "kanban.db").stat().st_size < 1 << 20
    before = snapshot(ws)
    result = invoke(ws, str(profile), "--name", "ada", "--board")
    # Refused as it is read, not after a 64 MiB value was read and a 320 MB task document built of it.
    assert result.exit_code != 0 and "kanban.db" in result.output and "too big" in result.output, result.output
    assert snapshot(ws) == before


def test_a_memories_folder_that_is_a_symlink_is_not_followed(ws, profile, tmp_path):
    # O_NOFOLLOW refuses a link as a file's last part only: memories/ as a link read MEMORY.md from anywhere.
    elsewhere = tmp_path / "elsewhere"
    shutil.move(profile / "memories", elsewhere)
    (profile / "memories").symlink_to(elsewhere)
    before = snapshot(ws)
    result = invoke(ws, str(profile), "--name", "ada")
    assert result.exit_code != 0 and "memories/" in result.output and "symlink" in result.output, result.output
    assert snapshot(ws) == before


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_team_whose_agents_name_bundled_and_workspace_skills_takes_an_import(tmp_path, profile, dry_run):
    # The docs' path (docs/how-to/from-hermes-agent.md): `init --example` (workers with the bundled
    # data_tools and summarize), a skill
    # of the workspace's own named too, then import-hermes. The check of the new hermes.yaml must know
    # the skills `up` knows; it once knew none, and refused every team that named a skill.
    team = tmp_path / "team"
    assert CliRunner().invoke(main, ["init", "--example", str(team)]).exit_code == 0
    (team / "skills/mine").mkdir(parents=True)
    (team / "skills/mine/SKILL.md").write_text("---\nname: mine\ndescription: Ours.\n---\nBody.\n")
    config = team / "hermes.yaml"
    config.write_text(config.read_text().replace("skills: [data_tools, summarize]",
                                                 "skills: [data_tools, summarize, mine]"))
    assert "mine]" in config.read_text()
    result = invoke(team, str(profile), "--name", "ada", *(["--dry-run"] if dry_run else []))
    assert result.exit_code == 0, result.output
    names = [agent["name"] for agent in load_config(config)["agents"]]
    assert names[-1] == ("reviewer" if dry_run else "ada")
    # A skill that exists nowhere is still refused by the same check, with nothing written.
    config.write_text(config.read_text().replace("mine]", "nowhere]"))
    before = snapshot(team)
    result = invoke(team, str(profile), "--name", "bob")
    assert result.exit_code == 1 and "no skill named 'nowhere'" in result.output
    assert snapshot(team) == before


def test_a_profiles_mcp_servers_carry_over_with_their_secrets_only_named(ws, profile):
    (profile / "config.yaml").write_text(CONFIG + """\
mcp_servers:
  github:
    command: npx
    args: ["-y", "@modelcontextprotocol/server-github"]
    env:
      GITHUB_PERSONAL_ACCESS_TOKEN: "${GITHUB_TOKEN}"
      LOG_LEVEL: info
      API_KEY: ghp_written_as_a_value_0123456789
    tools: {exclude: [delete_repository]}
  keyed:
    command: some-server
    args: [--token, abc123]
  userinfo:
    url: "http://user:pw@docs.example.com/mcp"
  docs:
    url: "https://docs.example.com/mcp"
    headers: {Authorization: "Bearer ${DOCS_TOKEN}", X-Team: "${TEAM_HEADER}"}
    timeout: 30
""")
    result = invoke(ws, str(profile), "--name", "ada", "--json")
    assert result.exit_code == 0, result.output
    config = load_config(ws / "hermes.yaml")
    assert config["mcp_servers"]["github"] == {
        "command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
        "env_from": {"GITHUB_PERSONAL_ACCESS_TOKEN": "GITHUB_TOKEN"}, "env": {"LOG_LEVEL": "info"},
        "tools": {"exclude": ["delete_repository"]}}
    assert config["mcp_servers"]["docs"] == {"url": "https://docs.example.com/mcp", "timeout": 30,
                                             "headers_env": {"X-Team": "TEAM_HEADER"}}
    agent = config["agents"][-1]
    assert agent["mcp_servers"] == ["docs", "github"] and "mcp" in agent["toolsets"]
    assert "shell" in agent["capabilities"] and "terminal" not in agent["toolsets"], "the servers' tools, no terminal"
    left = {item["what"]: item["why"] for item in json.loads(result.output)["not_carried_over"]}
    assert "MCP server github: env API_KEY" in left and "MCP server docs: headers Authorization" in left
    assert "holds a secret" in left["MCP server keyed"] and "holds a secret" in left["MCP server userinfo"]
    assert "keyed" not in config["mcp_servers"] and "abc123" not in (ws / "hermes.yaml").read_text()
    assert "ghp_written_as_a_value" not in (ws / "hermes.yaml").read_text() + result.output


def test_each_imported_profile_keeps_its_own_model_and_the_team_tiers_stay(ws, tmp_path):
    """Two profiles, a coder and a researcher on different models: each agent is served by its own
    (the import once made the first profile's model every tier's, so the researcher's tasks were
    answered by the coder's model)."""
    homes = {}
    for name, model in (("coder", "coder-model"), ("researcher", "research-model")):
        home = homes[name] = tmp_path / "profiles" / name
        home.mkdir(parents=True)
        (home / "config.yaml").write_text(f"model:\n  default: {model}\n  provider: custom\n"
                                          f"  base_url: http://127.0.0.1:9/{name}/v1\n")
    tiers = load_config(ws / "hermes.yaml")["tiers"]
    for name, home in homes.items():
        result = invoke(ws, str(home))
        assert result.exit_code == 0, result.output
        assert f"providers: the agent's own chain {name} serves all its model calls" in result.output
    config = load_config(ws / "hermes.yaml")
    agents = {agent["name"]: agent for agent in config["agents"]}
    assert agents["coder"]["providers"] == ["coder"] and agents["researcher"]["providers"] == ["researcher"]
    assert config["providers"]["researcher"]["model"] == "research-model"
    assert config["providers"]["coder"]["model"] == "coder-model"
    assert config["tiers"] == tiers


def test_board_keeps_what_hermes_tasks_wait_for_and_their_own_settings(ws, profile):
    """A Hermes board (written by hermes-agent 0.19.0's kanban_db) with a task in each waiting status:
    none of them becomes workable here, each says why; skills, max_retries carry, the rest is named."""
    from hermes_sup.kanban import Board

    shutil.copy(FIXTURES / "kanban-statuses.db", profile / "kanban.db")
    result = invoke(ws, str(profile), "--name", "ada", "--board", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert any("4 of them blocked" in note for note in report["carried_over"]), report["carried_over"]
    assert any("model_override claude-sonnet-4-5 (a model of its own) is kept in meta.hermes, not acted on" in w
               for w in report["warnings"])
    board = Board(ws / "kanban")
    try:
        tasks = {doc["meta"]["hermes"]["id"]: doc for doc in board.list().tasks}
    finally:
        board.close()
    status = {hermes_id: doc["status"] for hermes_id, doc in tasks.items()}
    assert status == {"t_983b505b": "blocked", "t_aa7809ef": "blocked", "t_b5441ebc": "blocked",
                      "t_2a144230": "todo", "t_e4d549bc": "blocked"}, "a triaged task waits for a person"
    said = {hermes_id: " ".join(c["text"] for c in doc.get("comments") or []) for hermes_id, doc in tasks.items()}
    assert "in triage on Hermes' board: it waits for a person to specify it" in said["t_983b505b"]
    assert "scheduled on Hermes' board" in said["t_aa7809ef"] and "waits for the nightly window" in said["t_aa7809ef"]
    assert "blocked on Hermes' board: Which output format: CSV or JSON?" in said["t_b5441ebc"]
    assert "in review on Hermes' board" in said["t_e4d549bc"] and said["t_2a144230"] == ""
    answer = tasks["t_b5441ebc"]
    assert answer["max_attempts"] == 2 and answer["body"].endswith("Skills to read first: csv-tools, arxiv")
    assert answer["meta"]["hermes"]["max_runtime_seconds"] == 900


def test_a_profile_has_its_homes_board_which_board_only_imports_once_without_an_agent(ws, tmp_path):
    """Hermes keeps one kanban.db at the home's root for all its profiles: --board on a profile reads
    it; --board-only adds its tasks and no agent; a second import adds nothing new."""
    from hermes_sup.kanban import Board

    home = tmp_path / "home"
    (home / "profiles" / "coder").mkdir(parents=True)
    shutil.copy(FIXTURES / "kanban.db", home / "kanban.db")
    before = (ws / "hermes.yaml").read_text()
    result = invoke(ws, str(home), "--board-only")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"imported the board of {home} (no agent added)")
    assert "a one-way copy" in result.output and "board: 3 tasks added" in result.output
    assert (ws / "hermes.yaml").read_text() == before
    result = invoke(ws, str(home / "profiles" / "coder"), "--board", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["agent"] == "coder" and report["written"][-1] == "board: 0 tasks added, 3 already there"
    board = Board(ws / "kanban")
    try:
        assert len(board.list().tasks) == 3
    finally:
        board.close()


def test_a_profiles_own_provider_its_context_and_what_it_says_of_itself_carry_over(ws, tmp_path):
    """Hermes' named custom providers (the providers: mapping, and the custom_providers: list that
    `hermes model` writes) got no model at all; model.context_length, display.personality and
    profile.yaml's description are carried or named."""
    home = tmp_path / "profiles" / "labs"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("""\
model: {default: qwen2.5-7b, provider: labbox, context_length: 32768}
fallback_providers:
  - {provider: custom:remote, model: big-model}
providers:
  labbox: {name: Lab Box, base_url: "http://127.0.0.1:8080/v1", key_env: LABBOX_KEY, default_model: qwen2.5-7b}
  off: {base_url: "http://127.0.0.1:9/v1", enabled: false}
custom_providers:
  - {name: remote, base_url: "https://llm.example.org/v1", key_env: OPENAI_API_KEY}
display: {personality: kawaii}
""")
    (home / "profile.yaml").write_text("description: Runs experiments on the lab's GPU box.\n")
    result = invoke(ws, str(home), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    config = load_config(ws / "hermes.yaml")
    assert config["providers"]["labs"] == {"kind": "openai", "model": "qwen2.5-7b",
                                           "base_url": "http://127.0.0.1:8080/v1", "api_key_env": "LABBOX_KEY",
                                           "context_window": 32768}
    assert config["providers"]["labs-fallback-1"] == {"kind": "openai", "model": "big-model",
                                                      "base_url": "https://llm.example.org/v1"}, \
        "a key variable is never sent to an address off this machine that the profile chose"
    assert any("its key variable OPENAI_API_KEY is left out" in n for n in report["carried_over"])
    assert any("Runs experiments on the lab's GPU box." in n for n in report["carried_over"])
    assert "display.personality kawaii" in {item["what"] for item in report["not_carried_over"]}
    assert config["agents"][-1]["providers"] == ["labs", "labs-fallback-1"]


def test_the_profiles_cli_toolsets_become_its_toolsets_and_capabilities(ws, tmp_path):
    """platform_toolsets were said to be messaging gateways and dropped, every agent got the same fixed
    toolsets: each of Hermes' toolsets maps to its counterpart here, or is named as having none."""
    home = tmp_path / "profiles" / "coder"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("platform_toolsets:\n  cli: [file, terminal, web, todo, clarify]\n"
                                      "  telegram: [web]\n")
    result = invoke(ws, str(home), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    agent = load_config(ws / "hermes.yaml")["agents"][-1]
    assert agent["toolsets"] == ["files", "terminal", "board"]
    assert agent["capabilities"] == ["fs.read", "fs.write", "shell"], "the profile's rights, no more"
    left = {item["what"] for item in report["not_carried_over"]}
    assert {"toolset web", "toolset todo"} <= left and "gateway" in left, "telegram's toolsets are a gateway's"
    (home / "config.yaml").write_text("toolsets: [hermes-cli]\n")
    result = invoke(ws, str(home), "--name", "plain", "--json")
    agent = load_config(ws / "hermes.yaml")["agents"][-1]
    assert agent["toolsets"] == ["files", "memory", "board", "skills", "kanban"], "Hermes' default: ours"


def test_board_reads_a_copy_a_fifo_beside_the_users_kanban_db_never_holds_it(ws, profile):
    import threading

    shutil.copy(FIXTURES / "kanban.db", profile / "kanban.db")
    os.mkfifo(profile / "kanban.db-journal")
    results = []
    worker = threading.Thread(target=lambda: results.append(invoke(ws, str(profile), "--name", "ada", "--board")),
                              daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the import blocked in open() on the FIFO beside kanban.db"
    assert results[0].exit_code == 0, results[0].output
