"""hermes.yaml's schema: 'did you mean' for near-miss keys, the JSON Schema editors use, and init's modeline."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.config.schema import AGENT, SECTIONS, TOP
from hermes_sup.supervisor.config.schemadoc import MODELINE, SCHEMA_FILE, json_schema, markdown
from hermes_sup.supervisor.config.workspace import ConfigError, load_config
from hermes_sup.supervisor.governance.alerts import bare_on

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [ROOT / "examples" / "hermes.yaml", ROOT / "examples" / "research" / "hermes.yaml", ROOT / "hermes.yaml"]


@pytest.mark.parametrize(("text", "message"), [
    ("agents:\n  - name: a\n    role: [x]\n", ":2: unknown agent key 'role' (did you mean 'roles'?)"),
    ("agents:\n  - name: a\n    heartbeat_timout: 5\n",
     ":2: unknown agent key 'heartbeat_timout' (did you mean 'heartbeat_timeout'?)"),
    ("agent:\n  - name: a\n", ":1: unknown key 'agent' (did you mean 'agents'?)"),
    ("defaults:\n  stop_timout: 3\nagents: [{name: a}]\n",
     ":2: unknown key 'defaults.stop_timout' (did you mean 'stop_timeout'?)"),
    ("providers:\n  x: {model: m, timout: 3}\nagents: [{name: a}]\n",
     ":2: provider x: unknown key 'timout' (did you mean 'timeout'?)"),
    ("defaults:\n  restart:\n    polcy: never\nagents: [{name: a}]\n",
     ":3: defaults: unknown key 'restart.polcy' (did you mean 'policy'?)"),
    ("metrics: {prot: 9}\nagents: [{name: a}]\n", ":1: unknown key 'metrics.prot' (did you mean 'port'?)"),
    ("telemetry:\n  otlp_endpiont: http://x\nagents: [{name: a}]\n",
     ":2: unknown key 'telemetry.otlp_endpiont' (did you mean 'otlp_endpoint'?)"),
    ("agents:\n  - name: a\n    zzz: 1\n", ":2: unknown agent key 'zzz'; expected one of name, roles"),
    ("tiers:\n  chepa: [auto]\nagents: [{name: a}]\n", ":2: unknown tier 'chepa' (did you mean 'cheap'?)"),
    ("providers:\n  x: {kind: antropic, model: m}\nagents: [{name: a}]\n",
     ":2: provider x: unknown kind 'antropic' (did you mean 'anthropic'?)"),
    ("prices:\n  m: {inptu: 1}\nagents: [{name: a}]\n",
     ":2: price of m: must be a mapping with input, output and cached (unknown key 'inptu' (did you mean 'input'?))"),
])
def test_unknown_keys_say_the_key_they_are_closest_to(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "hermes.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, skills=lambda: ())
    assert f"{path}{message}" in str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ("defaults:\n  delegation: {max_depth: 11}\nagents: [{name: a}]\n",
     ":2: defaults: 'delegation.max_depth' must be a whole number from 0 to 10, got 11"),
    ("providers:\n  x: {model: m, context_window: 0}\nagents: [{name: a}]\n",
     ":2: provider x: 'context_window' must be a whole number from 1 to 1,000,000,000, got 0"),
    ("agents:\n  - name: a\n    sandbox: maybe\n", ":2: agent a: 'sandbox' must be one of auto, bubblewrap"),
    ("agents:\n  - name: a\n    restart: {backoff: {initial: -1}}\n",
     ":3: agent a: 'restart.backoff.initial' must be a number of seconds >= 0"),
])
def test_typed_values_are_checked_from_the_schema(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "hermes.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, skills=lambda: ())
    assert f"{path}{message}" in str(info.value)


def as_editors_read(text: str) -> Any:
    """hermes.yaml as an editor's YAML 1.2 reads it: PyYAML's YAML 1.1 takes a bare `on` for true."""
    config = yaml.safe_load(text)
    if isinstance(config, dict):
        bare_on(config)
    return config


def doc_blocks() -> list[tuple[str, Any]]:
    """The docs' ```yaml blocks of hermes.yaml (whole files or some of its sections)."""
    blocks = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for found in re.finditer(r"```ya?ml\n(.*?)```", page.read_text(), re.S):
            config = as_editors_read(found.group(1))
            if isinstance(config, dict) and set(config) <= set(TOP.names()):
                blocks.append((f"{page.relative_to(ROOT)}: {next(iter(config), '')}", config))
    return blocks


def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_json_schema_takes_the_examples_and_refuses_a_typo() -> None:
    check = validator()
    for path in EXAMPLES:
        config = as_editors_read(path.read_text())
        assert [error.message for error in check.iter_errors(config)] == [], path
    blocks = doc_blocks()
    assert {"schedules", "alerts", "budgets", "folders", "mcp_servers", "routing", "telemetry"} <= {
        key for _, block in blocks for key in block}, "the docs show every section"
    for where, block in blocks:  # a block shows some sections: `agents`, which the file must have, aside
        assert [error.message for error in check.iter_errors({"agents": [{"name": "a"}], **block})] == [], where
    config = as_editors_read(EXAMPLES[0].read_text())
    config["agents"][0]["role"] = config["agents"][0].pop("roles")
    assert any("'role'" in error.message for error in check.iter_errors(config))
    assert not check.is_valid({**config, "agents": [{"name": "a", "count": 65}]})
    assert not check.is_valid({**config, "defaults": {"stop_timeout": 0}})


# One wrong value in each section the schema describes beside its own checker: the editor's JSON Schema and
# `up` both refuse it (`up` at its line).
@pytest.mark.parametrize(("section", "message"), [
    ('schedules: [{name: Bad_Name, cron: "* * * * *", task: {title: R}}]', ":3: schedule name 'Bad_Name'"),
    ("schedules: [{name: r, cron: 5, task: {title: R}}]", ":3: schedule r: 'cron' must be a cron expression"),
    ("schedules: {name: r}", ":3: 'schedules' must be a list of {name, cron, task}"),
    ("routing: {strategy: cascade, min_confidence: 1.5}", ":3: 'routing.min_confidence' must be a number from 0 to 1"),
    ("routing: {strategy: cheapest}", ":3: 'routing.strategy' must be one of tiers, cascade, got 'cheapest'"),
    ("alerts: [{webhook_env: U, secret_env: S, on: [task_done]}]", ":3: alerts: unknown alert 'task_done'"),
    ("alerts: [{webhook_env: U, secret_env: S, on: []}]", ":3: alerts: 'on' must list the alerts"),
    ("alerts: [{webhook_env: 'https://hook', secret_env: S, on: [task_failed]}]",
     ":3: alerts: 'webhook_env' must name"),
    ("budgets: {team: {per_day: -1}}", ":3: 'budgets.team.per_day' must be a number of dollars, 0 or more, got -1"),
    ("budgets: {agents: {w: {total: x}}}", ":3: 'budgets.agents.w.total' must be a number of dollars"),
    ("budgets: {agents: {w: 5}}", ":3: 'budgets.agents.w' must be a mapping (per_day, total)"),
    ("folders: {docs: {path: ., mode: write}}", ":3: folder docs: 'mode' must be one of ro, rw, got 'write'"),
    ("folders: {docs: {path: ., worktree: 'yes'}}", ":3: folder docs: 'worktree' must be true or false"),
    ("folders: {docs: [x]}", ":3: folder docs: must be a mapping (path, mode, worktree, base)"),
    ("mcp_servers: {t: {command: x, timeout: 0}}", ":3: MCP server t: 'timeout' must be a number of seconds > 0 and "
                                                   "at most 3,600, got 0"),
    ("mcp_servers: {t: {command: x, enabled: 'no'}}", ":3: MCP server t: 'enabled' must be true or false"),
    ("mcp_servers: {t: {command: x, url: 'http://h/mcp'}}", ":3: MCP server t: give either command"),
    ("mcp_servers: {t: {command: x, tools: [a]}}", ":3: MCP server t: 'tools' must be a mapping (include, exclude)"),
    ("telemetry: {content: 'yes'}", ":3: 'telemetry.content' must be true or false"),
    ("telemetry: {otlp_endpoint: 5}", ":3: 'telemetry.otlp_endpoint' must be an http(s) URL"),
])
def test_a_wrong_value_in_each_section_is_refused_by_the_json_schema_and_by_up(tmp_path: Path, section: str,
                                                                               message: str) -> None:
    text = f"agents:\n  - name: a\n{section}\n"
    assert not validator().is_valid(as_editors_read(text))
    path = tmp_path / "hermes.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, skills=lambda: ())
    assert f"{path}{message}" in str(info.value)


@pytest.mark.parametrize(("section", "message"), [
    ('schedules:\n  - {name: r, crom: "* * * * *", task: {title: R}}',
     ":2: schedules: unknown key 'crom' (did you mean 'cron'?)"),
    ("routing:\n  stratgy: cascade", ":2: unknown key 'routing.stratgy' (did you mean 'strategy'?)"),
    ("alerts:\n  - {webhook_env: U, secret_evn: S, on: [task_failed]}",
     ":2: alerts: unknown key 'secret_evn' (did you mean 'secret_env'?)"),
    ("budgets:\n  team: {per_dy: 1}", ":2: unknown key 'budgets.team.per_dy' (did you mean 'per_day'?)"),
    ("folders:\n  docs: {path: ., mdoe: rw}", ":2: folder docs: unknown key 'mdoe' (did you mean 'mode'?)"),
    ("mcp_servers:\n  t: {url: 'http://h/mcp', headers: {A: B}}",
     ":2: MCP server t: unknown key 'headers' (did you mean 'headers_env'?)"),
    ("mcp_servers:\n  t: {command: x, tools: {exlude: [a]}}",
     ":2: MCP server t: unknown key 'tools.exlude' (did you mean 'exclude'?)"),
    ("telemetry:\n  contnet: true", ":2: unknown key 'telemetry.contnet' (did you mean 'content'?)"),
])
def test_up_and_doctor_say_the_key_a_misspelt_one_is_closest_to(tmp_path: Path, section: str, message: str) -> None:
    # The agent's program does not exist: were the key let through, up would still refuse the file
    # (after the sections), never start a team inside the test.
    (tmp_path / "hermes.yaml").write_text(f"{section}\nagents:\n  - name: a\n    command: [./missing]\n")
    said = f"{tmp_path / 'hermes.yaml'}{message}"
    up = CliRunner().invoke(main, ["-w", str(tmp_path), "up"])
    assert up.exit_code == 2 and said in up.output, up.output
    doctor = CliRunner().invoke(main, ["-w", str(tmp_path), "doctor", "--json"])
    [config] = [check for check in json.loads(doctor.stdout)["checks"] if check["name"] == "config"]
    assert config["level"] == "error" and said in config["detail"], config


def test_every_key_of_the_schema_is_in_the_json_schema_and_on_the_page() -> None:
    schema, page = json_schema(), markdown()
    assert set(schema["properties"]) == set(TOP.names())
    assert set(schema["properties"]["agents"]["items"]["properties"]) == set(AGENT.names())
    for name in (*TOP.names(), *AGENT.names()):
        assert f"| `{name}` |" in page
    for name in SECTIONS:  # each described key by key, with a table of its own
        field = TOP.field(name)
        shown = field.item if field.item is not None else field
        assert shown.fields and f"`{name}{'[]' if field.kind == 'list' else '.NAME' if field.item else ''}`" in page
        for key in shown.names():
            assert f"| `{key}` |" in page


def test_schema_prints_the_json_schema() -> None:
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json_schema()


@pytest.mark.parametrize("example", [None, "team", "research"])
def test_init_writes_the_modeline_and_the_schema_beside_it(tmp_path: Path, example: str | None) -> None:
    args = ["init", str(tmp_path / "w"), "--json", *(["--example", example] if example else [])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert SCHEMA_FILE in json.loads(result.output)["created"]
    config = tmp_path / "w" / "hermes.yaml"
    assert config.read_text().splitlines()[0] == MODELINE
    assert json.loads((tmp_path / "w" / SCHEMA_FILE).read_text()) == json_schema()
    load_config(config)


def test_the_repositorys_schema_file_is_the_schema_printed_now() -> None:
    # The repository's hermes.yaml points editors at it: regenerate with `hermes-sup schema > hermes.schema.json`.
    assert json.loads((ROOT / SCHEMA_FILE).read_text()) == json_schema()
    assert (ROOT / "hermes.yaml").read_text().splitlines()[0] == MODELINE


def test_the_schema_names_the_keys_the_hand_written_checkers_take() -> None:
    # Sections whose values agents/ and kanban/ still check: their key lists and the schema's must not drift.
    from hermes_sup.agents.spans import SETTINGS_KEYS
    from hermes_sup.kanban.backends import SECTION_KEYS
    from hermes_sup.supervisor.config.runtimes import RUNTIME_KEYS

    assert TOP.field("telemetry").names() == SETTINGS_KEYS
    assert set(TOP.field("board").names()) == {key for keys in SECTION_KEYS.values() for key in keys}
    assert set(RUNTIME_KEYS) <= set(AGENT.names())
    # Defaults the schema states that code elsewhere applies.
    from hermes_sup.agents.cascade import CascadePolicy
    from hermes_sup.agents.mcpservers import CALL_TIMEOUT, CONNECT_TIMEOUT

    routing, policy = TOP.field("routing"), CascadePolicy()
    assert [routing.field(key).default for key in ("cheap", "premium", "min_confidence", "verify")] == [
        policy.cheap, policy.premium, policy.min_confidence, policy.verify]
    server = TOP.field("mcp_servers").item
    assert server is not None
    assert (server.field("timeout").default, server.field("connect_timeout").default) == (CALL_TIMEOUT,
                                                                                          CONNECT_TIMEOUT)
