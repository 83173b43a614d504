"""Tools offered by what the task calls for (agents/offer.py): the pure choice, then the loop against
the scripted server (real openai SDK): a one-line question's calls carry no board or file tool, a
tool called without being offered still runs and is offered from then on, `offer_tools: all` offers
every tool, and the key is checked in hermes.yaml."""

from __future__ import annotations

import json
import threading

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.loop import TaskLoop
from hermes_sup.agents.memory import MemoryFile
from hermes_sup.agents.offer import FILE_CUE, calls_for, offered, task_text
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.tools import Toolbox, ToolContext
from hermes_sup.supervisor.config.workspace import ConfigError, load_config
from hermes_sup.supervisor.spec import build_specs

from .llm_server import ScriptedLLM, openai_reply
from .loops import task_loop

DEFAULT_OFFER = {name: tool.cues for name, tool in Toolbox().callable().items()}


def names(text: str, used: tuple[str, ...] = (), mode: str = "task") -> list[str]:
    return offered(DEFAULT_OFFER, text, used, mode)


def test_a_one_line_question_is_offered_only_the_tools_without_cues():
    assert names("What is the capital of France?") == ["memory"]
    assert names("Wie heißt die Hauptstadt von Frankreich?") == ["memory"]


@pytest.mark.parametrize("text, wanted", [
    ("Summarize notes.md", {"read_file", "write_file", "patch", "search_files"}),
    ("Fix the bug in src/app", {"read_file", "patch"}),
    ("Save the list in a file", {"write_file"}),
    ("Lies die Datei und fasse sie zusammen", {"read_file"}),
    ("Break the launch into tasks with depends_on", {"kanban_create"}),
    ("Comment on the card with your findings", {"kanban_comment"}),
    ("Ask a person to confirm the budget", {"ask_human"}),
    ("Wait 30 seconds, then answer", {"wait"}),
])
def test_a_cue_calls_for_its_tools(text, wanted):
    got = set(names(text))
    assert wanted <= got and "memory" in got, got


def test_a_tool_named_in_the_text_or_already_called_is_offered_and_all_offers_everything():
    assert "kanban_comment" in names("when done, use kanban_comment to say so")
    assert "wait" in names("What is 2 + 2?", used=("wait",))
    assert names("What is 2 + 2?", mode="all") == sorted(DEFAULT_OFFER)


def test_the_cues_are_word_beginnings_and_files_are_seen_by_their_shape():
    assert calls_for(("writ",), "Writing it down") and not calls_for(("writ",), "rewrite")
    assert calls_for((), "anything"), "no cues: always offered"
    assert calls_for("csv", "a CSV file") and not calls_for("csv", "cat"), "a lone string is one cue"
    assert calls_for((None, 3, ""), "anything"), "what is not text is no cue"
    for text in ("open report.pdf", "look in docs/api", "see ~/papers", "the /etc folder"):
        assert calls_for((FILE_CUE,), text), text
    for text in ("costs 3.5 dollars", "e.g. this", "i.e. that", "What is 2 + 2?"):
        assert not calls_for((FILE_CUE,), text), text


def test_the_prompts_fixed_headers_are_no_cue():
    task = {"id": "t1", "title": "What is 2 + 2?", "comments": [{"by": "ann", "text": "ask me if unsure"}]}
    text = task_text(task, [{"id": "d", "result": "wrote plan.md"}], "You are the planner.")
    assert "Task" not in text and "Results of the tasks" not in text
    assert {"ask_human", "read_file", "kanban_create"} <= set(names(text))


# -- the loop ---------------------------------------------------------------------------------------

@pytest.fixture
def llm():
    with ScriptedLLM() as server:
        yield server


def run_loop(llm, tmp_path, title: str, **kwargs) -> TaskLoop:
    scratch = tmp_path / "agent" / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=MemoryFile(tmp_path / "agent" / "MEMORY.md"))
    provider = OpenAIProvider(ProviderConfig(name="scripted", kind="openai", model="m", base_url=f"{llm.url}/v1"))
    loop = task_loop(task={"id": "t-1", "title": title}, chain=[provider], workdir=tmp_path / "agent", ctx=ctx,
                     toolbox=Toolbox(), agent="agent", **kwargs)
    loop.outcome = loop.run()
    return loop


def offered_in(request: dict) -> list[str]:
    return [tool["function"]["name"] for tool in request["body"].get("tools") or []]


def test_a_tool_called_without_being_offered_runs_and_is_offered_from_then_on(llm, tmp_path):
    llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "a.txt", "content": "4"})]),
               openai_reply("4"))
    loop = run_loop(llm, tmp_path, "What is 2 + 2?")
    assert (loop.outcome.kind, loop.outcome.text) == ("done", "4")
    assert offered_in(llm.requests[0]) == ["memory"]
    assert offered_in(llm.requests[1]) == ["memory", "write_file"]
    assert (tmp_path / "agent" / "scratch" / "a.txt").read_text() == "4", "granted, so it ran"
    record = json.loads((tmp_path / "agent" / "tool_calls.jsonl").read_text().splitlines()[-1])
    assert (record["tool"], record["outcome"]) == ("write_file", "ok")


def test_offer_tools_all_offers_every_tool_on_every_call(llm, tmp_path):
    llm.script("openai", openai_reply("4"))
    run_loop(llm, tmp_path, "What is 2 + 2?", offer_tools="all")
    assert offered_in(llm.requests[0]) == sorted(DEFAULT_OFFER)


def test_offer_tools_is_checked_and_reaches_the_agent(tmp_path):
    path = tmp_path / "hermes.yaml"
    path.write_text("defaults:\n  offer_tools: all\nagents:\n  - name: a\n  - name: b\n    offer_tools: task\n")
    specs = {spec.name: spec.agent_config()["offer_tools"] for spec in build_specs(load_config(path), tmp_path)}
    assert specs == {"a": "all", "b": "task"}
    path.write_text("agents:\n  - name: a\n\n    offer_tools: some\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: agent a: 'offer_tools' must be one of task, all"):
        load_config(path)


def test_the_bundled_skills_tools_wait_for_their_cues():
    import runpy
    from pathlib import Path

    from hermes_sup.agents.tools import collecting

    with collecting() as skill_tools:
        for name in ("data_tools", "summarize", "web_fetch"):
            runpy.run_path(str(Path(__file__).resolve().parent.parent / "skills" / f"{name}.py"))
    cues = {**DEFAULT_OFFER, **{tool.name: tool.cues for tool in skill_tools}}
    assert {"csv_summary", "json_query", "summarize", "web_fetch"} <= set(cues)
    assert offered(cues, "What is 17 + 25?") == ["memory"], "a small model called csv_summary for a sum"
    assert {"csv_summary", "summarize"} <= set(offered(cues, "Summarize sales.csv"))
    assert "web_fetch" in offered(cues, "What does https://example.org say?")
