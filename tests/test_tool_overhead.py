"""What the tool definitions cost in every call: a 4k-context local server has no room for 1.5k
tokens of them. The default agent's definitions are bounded (characters / 4, as the usage estimate
counts), and an agent is offered only the tools its toolsets and capabilities let it use."""

from __future__ import annotations

import json

from hermes_sup.agents import offer
from hermes_sup.agents.fallback import CHARS_PER_TOKEN
from hermes_sup.agents.worker import Agent

# Measured (characters / 4): 1,085 tokens before the descriptions were shortened, 1,041 after (9 tools);
# 845 once the check-only keywords left the definitions. Offered by what the task calls for: 101 for
# a one-line question, 474 for a task on a file.
BUDGETS = {"What is the capital of France?": 110, "Summarize notes.md in three lines": 480, None: 850}
LONGEST_DESCRIPTION = 90


def tokens(schemas: list[dict]) -> int:
    return len(json.dumps(schemas, ensure_ascii=False)) // CHARS_PER_TOKEN


def offered(tmp_path, title: str | None = None, **config) -> list[dict]:
    agent = Agent({"name": "a", **config}, tmp_path, tmp_path / "runs" / "a")
    try:
        toolbox = agent.toolbox()
        if title is None:  # every tool the agent may call
            return toolbox.schemas()
        cues = {name: tool.cues for name, tool in toolbox.callable().items()}
        return toolbox.schemas(offer.offered(cues, offer.task_text({"title": title})))
    finally:
        agent.board.close()


def test_the_default_agents_tool_definitions_stay_within_budget(tmp_path):
    for index, (title, budget) in enumerate(BUDGETS.items()):
        schemas = offered(tmp_path / str(index), title)
        size = tokens(schemas)
        print(f"default agent, {title or 'every tool'}: {len(schemas)} tools, ~{size} tokens")
        assert size <= budget, (title, size)
    long = {s["function"]["name"]: len(s["function"]["description"]) for s in offered(tmp_path / "all")
            if len(s["function"]["description"]) > LONGEST_DESCRIPTION}
    assert not long, f"descriptions over {LONGEST_DESCRIPTION} characters: {long}"


def test_only_the_tools_an_agent_can_use_are_offered(tmp_path):
    names = {s["function"]["name"] for s in offered(tmp_path)}
    assert "terminal" not in names and "delegate_task" not in names, "no shell or delegate capability"
    files_only = offered(tmp_path / "f", toolsets=["files"])
    assert {s["function"]["name"] for s in files_only} == {"read_file", "write_file", "patch", "search_files"}
    assert tokens(files_only) < tokens(offered(tmp_path / "d"))
    readers = {s["function"]["name"] for s in offered(tmp_path / "r", capabilities=["fs.read"])}
    assert "write_file" not in readers and "patch" not in readers and "read_file" in readers
