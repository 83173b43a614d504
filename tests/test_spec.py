"""Child specs from hermes.yaml, the reload plan, and the config checks that guard them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hermes_sup.supervisor.spec import build_specs, plan_reload
from hermes_sup.supervisor.workspace import ConfigError, load_config

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
