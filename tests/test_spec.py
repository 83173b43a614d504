"""Child specs from hermes.yaml, the reload plan, and the config checks that guard them."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hermes_sup.supervisor.config.workspace import ConfigError, load_config
from hermes_sup.supervisor.spec import ReloadPlan, build_specs, describe_reload, plan_reload

CONFIG = """\
defaults:
  restart: {policy: always, backoff: {initial: 1, max: 10}, max_restarts: 3, window: 30}
  stop_timeout: 5
agents:
  - name: planner
    roles: [plan]
  - name: worker
    roles: [work]
    count: 2
    restart: {max_restarts: 9}
    env: {MODE: fast}
"""


def specs_from(tmp_path: Path, text: str):
    path = tmp_path / "hermes.yaml"
    path.write_text(text)
    return build_specs(load_config(path), tmp_path, python="/py")


def test_agents_expand_and_inherit_defaults(tmp_path):
    specs = {spec.name: spec for spec in specs_from(tmp_path, CONFIG)}
    assert list(specs) == ["planner", "worker-1", "worker-2"]
    planner, worker = specs["planner"], specs["worker-1"]
    assert planner.argv == ("/py", "-P", "-m", "hermes_sup.agents", "run")
    assert planner.workdir == tmp_path / "runs" / "planner"
    assert (planner.restart.policy, planner.restart.initial, planner.restart.max) == ("always", 1.0, 10.0)
    assert planner.restart.max_restarts == 3 and worker.restart.max_restarts == 9
    assert worker.restart.window == 30.0 and worker.restart.policy == "always"
    assert planner.stop_timeout == 5.0 and planner.heartbeat_timeout == 60.0 and planner.orphan_grace == 30.0
    assert worker.env == (("MODE", "fast"),) and worker.roles == ("work",)


def test_reload_plan_touches_only_what_changed(tmp_path):
    before = {spec.name: spec for spec in specs_from(tmp_path, CONFIG)}
    changed = CONFIG.replace("count: 2", "count: 3").replace("MODE: fast", "MODE: slow").replace(
        "  - name: planner\n    roles: [plan]\n", "  - name: reviewer\n    roles: [review]\n")
    plan = plan_reload(before, specs_from(tmp_path, changed))
    assert plan.start == ("reviewer", "worker-3")
    assert plan.stop == ("planner",)
    assert plan.restart == ("worker-1", "worker-2")
    assert plan.keep == ()
    same = plan_reload(before, specs_from(tmp_path, CONFIG))
    assert same.keep == ("planner", "worker-1", "worker-2") and not (same.start or same.stop or same.restart)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defaults:\n  stop_timeout: -1\n", ":2: defaults: 'stop_timeout' must be a number of seconds > 0"),
        ("defaults:\n  restart: {policy: sometimes}\n", ":2: defaults: restart policy must be always, on-failure or"),
        ("defaults:\n  restart:\n    backoff: {initial: 9, max: 1}\n", ":3: defaults: 'backoff.initial' is larger"),
        ("defaults:\n  restrat: {}\n", ":2: unknown key 'defaults.restrat'"),
        ("agents:\n  - name: a\n    max_rss_mb: lots\n", ":2: agent a: 'max_rss_mb' must be a number > 0 or null"),
        ("agents:\n  - name: a\n    capabilities: [root]\n", ":2: agent a: 'capabilities' must be a list drawn"),
        ("agents:\n  - name: a\n    tier: gold\n", ":2: agent a: unknown tier 'gold'"),
        ("agents:\n  - name: a\n    command: python\n", ":2: agent a: 'command' must be a non-empty list"),
        ("defaults:\n  max_cost: -1\n", ":2: defaults: 'max_cost' must be a number > 0"),
        ("agents:\n  - name: a\n    max_tokens: 1.5\n", ":2: agent a: 'max_tokens' must be a whole number > 0"),
        ("providers:\n  x: {kind: openia, model: m}\n", ":2: provider x: unknown kind 'openia'"),
        ("providers:\n  x: {kind: anthropic}\n", ":2: provider x: kind anthropic needs a 'model'"),
        ("providers:\n  x:\n    kind: openai\n    model: m\n    api_key: sk-1\n",
         ":3: provider x: keys are not written in hermes.yaml"),
        ("providers:\n  x: {model: m, stream: yes please}\n", ":2: provider x: 'stream' must be true or false"),
        ("providers:\n  x: {model: m, timout: 3}\n", ":2: provider x: unknown key 'timout'"),
        ("providers:\n  x: {model: m}\ntiers:\n  cheap: [x, y]\n", ":4: tier cheap: no provider named 'y'"),
        ("tiers:\n  fast: [auto]\n", ":2: unknown tier 'fast'"),
    ],
)
def test_bad_settings_are_refused_with_file_and_line(tmp_path, text, message):
    path = tmp_path / "hermes.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}{message}" in str(info.value)


def test_the_example_team_builds(tmp_path):
    root = Path(__file__).resolve().parent.parent
    names = [spec.name for spec in build_specs(load_config(root / "hermes.yaml"), root)]
    assert names == ["planner", "worker-1", "worker-2", "reviewer"]


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defaults:\n  stop_timeout: .nan\n", ":2: invalid YAML: .nan is not a finite number"),
        ("defaults:\n  heartbeat_timeout: .inf\n", ":2: invalid YAML: .inf is not a finite number"),
        ("defaults:\n  orphan_grace: .inf\n", ":2: invalid YAML: .inf is not a finite number"),
        (f"defaults:\n  stop_timeout: 1{'0' * 400}\n", ":2: invalid YAML: an integer of 401 digits"),
        ("defaults:\n  restart: {backoff: {max: .inf}}\n", ":2: invalid YAML: .inf is not a finite number"),
        ("defaults:\n  max_cost: .nan\n", ":2: invalid YAML: .nan is not a finite number"),
        ("defaults:\n  stop_timeout: 31536000\n", ":2: defaults: 'stop_timeout' must be a number of seconds > 0 "
                                                "and at most 86,400, got 31536000"),
        ("defaults:\n  restart: {window: 1000000000.0}\n",
         ":2: defaults: 'restart.window' must be a number of seconds > 0 and at most 86,400"),
        ("agents:\n  - name: a\n    delegation: {timeout: 10000000.0}\n", ":3: agent a: 'delegation.timeout' must be a "
                                                                  "number of seconds > 0 and at most 86,400"),
        ("providers:\n  x: {model: m, timeout: .nan}\n", ":2: invalid YAML: .nan is not a finite number"),
        ("agents:\n  - name: a\nagents:\n  - name: b\n", ":3: invalid YAML: duplicate key 'agents' (first on line 1)"),
        ("agents:\n  - name: a\n    roles: [x]\n    roles: [y]\n", ":4: invalid YAML: duplicate key 'roles'"),
        ("agents:\n  - name: a\n    count: 10000\n", ":2: agent a: 'count' must be a whole number from 1 to 64"),
        ("agents:\n  - name: ../../x\n", ":2: agent name '../../x' must be 1 to 64 letters"),
        ("agents:\n  - name: supervisor.json\n", ":2: agent name 'supervisor.json' must be"),
        ("agents:\n  - name: notify.sock\n", ":2: agent name 'notify.sock' must be"),
        ("agents:\n  - name: a/b\n", ":2: agent name 'a/b' must be"),
        ("agents:\n  - name: .hidden\n", ":2: agent name '.hidden' must be"),
        ("agents:\n  - name: '[/]'\n", ":2: agent name '[/]' must be"),
        (f"agents:\n  - name: {'a' * 65}\n", ":2: agent name 'aaaa"),
        ("defaults: &d\n  stop_timeout: 5\nagents:\n  - name: a\n    restart: *d\n",
         ":5: invalid YAML: aliases (*d) are not allowed"),
        (LAUGHS + "agents:\n  - name: a\n", ":2: invalid YAML: aliases (*a) are not allowed"),
        ("agents:\n  - name: a\n    env: {X: " + "[" * 200 + "]" * 200 + "}\n",
         ":3: invalid YAML: the data is nested more than 32"),
        # Past the YAML parser's own limit (libyaml's since PyYAML 6.0.4): refused in its words, so
        # only ours (file:line, invalid YAML) are asserted.
        ("agents:\n  - name: a\n    env: {X: " + "[" * 100_000 + "]" * 100_000 + "}\n", ":3: invalid YAML: "),
        (f"agents:\n  - name: a\n    max_iterations: {'9' * 5000}\n", ":3: invalid YAML: an integer of 5000 digits"),
        ("agents: []\n", ":1: no agents: 'agents' must list at least one"),
        ("", ":1: no agents"),
        ("providers: {}\n", ":1: no agents"),
        ("agents:\n  - name: a\n    env: {'A=B': x}\n", ":2: agent a: 'env' must be a mapping of variable names"),
        ("agents:\n  - name: a\n    command: [python, \"a\\0b\"]\n", ":2: agent a: 'command' must be a non-empty"),
        ("agents:\n  - name: a\n    log_keep: 1000000000\n", ":2: agent a: 'log_keep' must be a whole number from 0"),
        ("agents:\n  - name: a\n    skills: data_tools\n", ":2: agent a: 'skills' must be a list of names"),
        ("agents:\n  - name: a\n    delegation: {max_concurrent: 0}\n", ":3: agent a: 'delegation.max_concurrent'"),
        ("agents:\n  - name: a\n    delegation: {tier: gold}\n", ":3: agent a: unknown delegation tier 'gold'"),
        ("agents:\n  - name: a\n    terminal: {timeout: .nan}\n", ":3: invalid YAML: .nan is not a finite number"),
        ("agents:\n  - name: a\n    terminal: {approve: rm-root}\n", ":3: agent a: 'terminal.approve' must be a list"),
        ("providers:\n  x: {model: m, base_url: [u]}\n", ":2: provider x: 'base_url' must be text"),
        ("prices:\n  m: {input: .nan, output: 1}\n", ":2: invalid YAML: .nan is not a finite number"),
        ("prices:\n  m: {input: 1, output: -1}\n", ":2: price of m: 'output' must be a number of dollars"),
        ("prices:\n  m: {inptu: 1}\n", ":2: price of m: must be a mapping with input, output and cached"),
        ("prices: [1]\n", ":1: 'prices' must be a mapping of model names"),
    ],
)
def test_hostile_configs_are_refused_with_file_and_line(tmp_path, text, message):
    path = tmp_path / "hermes.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, skills=lambda: ())
    assert f"{path}{message}" in str(info.value)


def test_unreadable_and_non_utf8_and_oversized_configs_are_config_errors(tmp_path):
    path = tmp_path / "hermes.yaml"
    path.write_bytes(b"agents:\n  - name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"hermes\.yaml:2: not UTF-8 text \(byte 0xe9\)"):
        load_config(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match=r"hermes\.yaml: cannot be read: not a regular file"):
        load_config(path)
    path.rmdir()
    os.mkfifo(path)  # would block a reader (a reload) forever
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_config(path)
        except BaseException as exc:  # what the loader raised is the result
            outcome.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # blocked in open(): let it go before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=30)
    assert outcome and isinstance(outcome[0], ConfigError), outcome
    assert str(outcome[0]) == f"{path}: cannot be read: not a regular file"
    path.unlink()
    path.write_text("agents:\n  - name: a\n" + "#" * (1 << 20))
    with pytest.raises(ConfigError, match=r"hermes\.yaml:1: larger than 1,048,576 bytes, the most"):
        load_config(path)


def test_an_agent_command_must_be_runnable(tmp_path):
    path = tmp_path / "hermes.yaml"
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\n")
    for command, message in (("[/nonexistent/agent]", "command '/nonexistent/agent' is not an executable file"),
                             (f"[{script}]", f"command '{script}' is not an executable file"),
                             ("[no-such-program-here, x]", "command 'no-such-program-here' is not an executable "
                                                           "file on PATH")):
        path.write_text(f"agents:\n  - name: a\n  - name: b\n    command: {command}\n")
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}:3: agent b: {message}"
    script.chmod(0o755)
    for command in (f"[{script}]", "[sh, -c, 'true']", "[../../agent.sh]"):  # the last: from runs/b/
        path.write_text(f"agents:\n  - name: b\n    command: {command}\n")
        assert load_config(path)["agents"][0]["command"][0] in (str(script), "sh", "../../agent.sh")


def test_skills_and_toolsets_an_agent_names_must_exist(tmp_path):
    path = tmp_path / "hermes.yaml"
    path.write_text("agents:\n  - name: a\n    skills: [data_tools]\n    toolsets: [files, summarize]\n"
                    "  - name: b\n    skills: [data_tool]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)  # discovered: the bundled skills, and the workspace's skills/ folder
    assert str(info.value).startswith(f"{path}:5: agent b: skills: no skill named 'data_tool' (skills known here: ")
    assert "data_tools" in str(info.value)
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills" / "data_tool.py").write_text("raise SystemExit('never imported by the check')\n")
    assert [a["skills"] for a in load_config(path)["agents"]] == [["data_tools"], ["data_tool"]]
    path.write_text("agents:\n  - name: a\n    toolsets: [file]\n")
    with pytest.raises(ConfigError, match=r":2: agent a: toolsets: no toolset or skill named 'file' \(toolsets "
                                          r"known here: files, terminal"):
        load_config(path)


def test_builtin_toolsets_are_the_ones_the_tools_belong_to():
    import importlib

    for module in ("builtins", "delegation", "skills", "terminal"):  # importing one registers its tools
        importlib.import_module(f"hermes_sup.agents.{module}")
    from hermes_sup.agents.tools import REGISTRY
    from hermes_sup.supervisor.config.checks import BUILTIN_TOOLSETS

    # mcp: the tools of the agent's MCP servers, made when it connects them (agents/mcpservers.py)
    assert {tool.toolset for tool in REGISTRY.values()} == set(BUILTIN_TOOLSETS) - {"mcp"}


def test_a_reload_is_described_by_agent_names_not_python_lists():
    plan = ReloadPlan(start=("reviewer",), stop=(), restart=("worker-1", "worker-2"), keep=("planner",))
    assert describe_reload(plan) == "reload: started reviewer; restarted worker-1, worker-2; unchanged planner"
    assert describe_reload(ReloadPlan((), ("old",), (), ())) == "reload: stopped old"
    assert describe_reload(ReloadPlan((), (), (), ("a", "b"))) == "reload: nothing changed (a, b unchanged)"
    assert describe_reload(ReloadPlan((), (), (), ())) == "reload: nothing changed"
