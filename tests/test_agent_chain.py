"""A model per agent: an agent's own `providers:` chain serves every model call of that agent,
whatever the tier, while the team's tiers serve the others (two scripted servers, a real `up`); its
refusals with file:line."""

from __future__ import annotations

import pytest
from hermes_sup.agents.routing import chain_for
from hermes_sup.kanban import Board, TaskNotFound
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply


def test_an_agents_own_chain_serves_every_tier():
    config = {"providers": {"lab": {"kind": "openai", "model": "lab-model", "base_url": "http://127.0.0.1:1/v1"},
                            "cloud": {"kind": "openai", "model": "cloud-model", "base_url": "http://127.0.0.1:2/v1"}},
              "tiers": {"cheap": ["cloud"], "standard": ["cloud"], "premium": ["cloud"]}}
    for tier in ("cheap", "standard", "premium"):
        assert [p.name for p in chain_for(tier, config, lambda: None, {})] == ["cloud"]
        assert [p.name for p in chain_for(tier, {**config, "chain": ["lab", "cloud"]}, lambda: None, {})] == \
            ["lab", "cloud"]


def test_two_agents_answer_with_their_own_models(tmp_path, up):
    ws = tmp_path / "ws"
    init_workspace(ws)
    with ScriptedLLM(responder=lambda api, body: openai_reply(f"lab answers {body['model']}")) as lab, \
            ScriptedLLM(responder=lambda api, body: openai_reply(f"cloud answers {body['model']}")) as cloud:
        (ws / "hermes.yaml").write_text(f"""\
providers:
  lab: {{kind: openai, base_url: '{lab.url}/v1', model: lab-model}}
  cloud: {{kind: openai, base_url: '{cloud.url}/v1', model: cloud-model}}
tiers: {{cheap: [cloud], standard: [cloud], premium: [cloud]}}
agents:
  - name: researcher
    roles: [research]
    tier: premium
    providers: [lab]
  - name: coder
    roles: [code]
""")
        up(ws)
        board = Board(ws / "kanban")
        board.add({"id": "study", "title": "Study this", "role": "research"})
        board.add({"id": "build", "title": "Build that", "role": "code"})

        def done(task_id: str):
            try:
                doc = board.get(task_id)
            except TaskNotFound:
                return None
            return doc if doc["status"] in ("done", "failed", "blocked") else None

        study, build = wait_until(lambda: done("study"), timeout=60), wait_until(lambda: done("build"), timeout=60)
    assert study["result"]["answer"] == "lab answers lab-model", "the researcher's own chain, not the premium tier"
    assert build["result"]["answer"] == "cloud answers cloud-model", "the team's tiers for the others"
    assert {r["body"]["model"] for r in lab.requests} == {"lab-model"}
    assert {r["body"]["model"] for r in cloud.requests} == {"cloud-model"}


@pytest.mark.parametrize("entry, message", [
    ("providers: [nowhere]", "'providers' names 'nowhere', which is no provider of hermes.yaml"),
    ("providers: []", "'providers' must be a list of provider names"),
    ("providers: lab", "'providers' must be a list of provider names"),
    ("runtime: command\n    argv: [codex]\n    providers: [auto]", "'providers' is for the built-in loop"),
])
def test_an_agents_chain_that_cannot_be_is_refused_with_file_and_line(tmp_path, entry, message):
    path = tmp_path / "hermes.yaml"
    path.write_text(f"agents:\n  - name: a\n    {entry}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, skills=lambda: ())
    assert f"{path}:2: agent a: {message}" in str(info.value)
