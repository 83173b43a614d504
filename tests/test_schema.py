"""hermes.yaml's schema: 'did you mean' for near-miss keys, the JSON Schema editors use, and init's modeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.config.schema import AGENT, TOP
from hermes_sup.supervisor.config.schemadoc import MODELINE, SCHEMA_FILE, json_schema, markdown
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

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


def test_the_json_schema_takes_the_examples_and_refuses_a_typo() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in EXAMPLES:
        config = yaml.safe_load(path.read_text())
        assert [error.message for error in validator.iter_errors(config)] == [], path
    config = yaml.safe_load(EXAMPLES[0].read_text())
    config["agents"][0]["role"] = config["agents"][0].pop("roles")
    assert any("'role'" in error.message for error in validator.iter_errors(config))
    assert not validator.is_valid({**config, "agents": [{"name": "a", "count": 65}]})
    assert not validator.is_valid({**config, "defaults": {"stop_timeout": 0}})


def test_every_key_of_the_schema_is_in_the_json_schema_and_on_the_page() -> None:
    schema, page = json_schema(), markdown()
    assert set(schema["properties"]) == set(TOP.names())
    assert set(schema["properties"]["agents"]["items"]["properties"]) == set(AGENT.names())
    for name in (*TOP.names(), *AGENT.names()):
        assert f"| `{name}` |" in page


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
