"""A Hermes Agent user's memory and skills carry over unchanged (fixtures from hermes-agent 0.19.0:
tests/fixtures/hermes/ORIGIN.md)."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the tools
from hermes_sup.agents.memory import HERMES_LIMITS, Memories, MemoryFile, limits_problem, parse, render, round_trips
from hermes_sup.agents.skills import Skills, on_this_platform
from hermes_sup.agents.tools import Toolbox, ToolContext, ToolError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hermes"


def memory_ctx(tmp_path: Path, settings: dict | None = None) -> ToolContext:
    return ToolContext(scratch=tmp_path / "scratch", stop=threading.Event(),
                       memory=Memories(tmp_path / "memory", settings))


# -- memory -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["MEMORY.md", "USER.md"])
def test_a_memory_file_written_by_hermes_reads_and_writes_back_byte_identical(tmp_path, name):
    original = (FIXTURES / "memories" / name).read_bytes()
    assert round_trips(original.decode("utf-8"))
    shutil.copy(FIXTURES / "memories" / name, tmp_path / name)
    target = "user" if name == "USER.md" else "memory"
    memory = MemoryFile(tmp_path / name, HERMES_LIMITS[target], target)
    memory.change("add", content="A fact added here, then removed.")
    assert (tmp_path / name).read_bytes() != original
    memory.change("remove", old_text="added here, then removed")
    assert (tmp_path / name).read_bytes() == original


def test_entries_kept_here_are_written_as_hermes_writes_them(tmp_path):
    """The same adds, made through the memory tool here from an empty memory, give Hermes' bytes."""
    ctx = memory_ctx(tmp_path)
    box = Toolbox(grants=("memory",))
    for target, name in (("memory", "MEMORY.md"), ("user", "USER.md")):
        for entry in parse((FIXTURES / "memories" / name).read_text(encoding="utf-8")):
            box.call(ctx, "memory", {"action": "add", "target": target, "content": entry})
        assert (tmp_path / "memory" / name).read_bytes() == (FIXTURES / "memories" / name).read_bytes()
    entries = parse((FIXTURES / "memories" / "MEMORY.md").read_text(encoding="utf-8"))
    assert any("\n" in entry for entry in entries) and any("§" in entry for entry in entries)


def test_hermes_limits_count_the_separators_and_are_configurable(tmp_path):
    ctx = memory_ctx(tmp_path)
    box = Toolbox(grants=("memory",))
    box.call(ctx, "memory", {"target": "user", "action": "add", "content": "u" * 1000})
    with pytest.raises(ToolError, match=r"memory is full \(1000 of 1375 characters\)"):
        box.call(ctx, "memory", {"target": "user", "action": "add", "content": "v" * 373})  # 1000 + 3 + 373
    assert "1375 of 1375" in box.call(ctx, "memory", {"target": "user", "action": "add", "content": "v" * 372})
    box.call(ctx, "memory", {"action": "add", "content": "m" * 2200})  # no target: the agent's notes
    with pytest.raises(ToolError, match="of 2200 characters"):
        box.call(ctx, "memory", {"target": "memory", "action": "add", "content": "n"})

    larger = memory_ctx(tmp_path / "larger", {"memory_char_limit": 5000, "user_char_limit": 100})
    said = box.call(larger, "memory", {"target": "memory", "action": "add", "content": "m" * 3000})
    assert "3000 of 5000 characters" in said
    assert "more than Hermes Agent's 2,200" in said, "a memory Hermes would not take is flagged"
    assert larger.memory.flags() == ["MEMORY.md holds 3,000 characters, more than Hermes Agent's 2,200: Hermes "
                                     "would refuse to add to it until entries are removed"]
    with pytest.raises(ToolError, match=r"memory is full \(0 of 100"):
        box.call(larger, "memory", {"target": "user", "action": "add", "content": "u" * 101})
    assert limits_problem({"memory_char_limit": 0}) and limits_problem({"user_limit": 5})
    assert limits_problem({"memory_char_limit": 4000, "user_char_limit": 2000}) is None


def test_a_batch_of_operations_applies_all_or_none(tmp_path):
    ctx = memory_ctx(tmp_path)
    box = Toolbox(grants=("memory",))
    box.call(ctx, "memory", {"target": "memory", "action": "add", "content": "old fact"})
    box.call(ctx, "memory", {"target": "memory", "operations": [
        {"action": "remove", "old_text": "old fact"}, {"action": "add", "content": "new fact"},
        {"action": "add", "content": "another"}]})
    assert ctx.memory.entries() == ["new fact", "another"]
    before = (tmp_path / "memory" / "MEMORY.md").read_bytes()
    with pytest.raises(ToolError, match="operation 2: no memory entry contains 'missing'"):
        box.call(ctx, "memory", {"target": "memory", "operations": [
            {"action": "add", "content": "lost?"}, {"action": "replace", "old_text": "missing", "content": "x"}]})
    assert (tmp_path / "memory" / "MEMORY.md").read_bytes() == before


def test_both_files_go_into_the_prompt(tmp_path):
    shutil.copytree(FIXTURES / "memories", tmp_path / "memory")
    block = Memories(tmp_path / "memory").prompt_block()
    assert block.startswith("## What you remember\n- The staging server")
    assert "## What you know about the user\n- User prefers concise answers." in block


def test_render_is_hermes_join():
    assert render(["a", "b\nc"]) == "a\n§\nb\nc"
    assert parse("a\n§\nb\n") == ["a", "b"], "a file with a newline at its end (edited by hand) still reads"
    assert not round_trips("a\n§\nb\n")


# -- skills -----------------------------------------------------------------------------------------

def hermes_skills(tmp_path: Path) -> tuple[Skills, ToolContext]:
    shutil.copytree(FIXTURES / "skills", tmp_path / "ws" / "skills")
    (tmp_path / "bundled").mkdir()
    skills = Skills(tmp_path / "ws", bundled=tmp_path / "bundled")
    return skills, ToolContext(scratch=tmp_path / "scratch", stop=threading.Event(), services={"skills": skills})


def test_hermes_skills_in_their_categories_are_listed_and_platforms_honoured(tmp_path):
    _, ctx = hermes_skills(tmp_path)
    listed = json.loads(Toolbox(grants=("skills",)).call(ctx, "skills_list", {}))
    by_name = {row["name"]: row for row in listed}
    assert set(by_name) == {"nano-pdf", "polymarket"}, "apple-notes says platforms: [macos]"
    assert by_name["polymarket"]["category"] == "research"
    assert by_name["nano-pdf"]["description"] == "Edit PDF text/typos/titles via nano-pdf CLI (NL prompts)."
    only = json.loads(Toolbox(grants=("skills",)).call(ctx, "skills_list", {"category": "productivity"}))
    assert [row["name"] for row in only] == ["nano-pdf"]


def test_platforms_as_hermes_names_them():
    assert on_this_platform(None, "linux") and on_this_platform([], "darwin")
    assert on_this_platform(["macos"], "darwin") and not on_this_platform(["macos"], "linux")
    assert on_this_platform(["linux", "macos", "windows"], "win32") and on_this_platform("linux", "linux")
    assert not on_this_platform([""], "linux")


def test_a_hermes_skill_is_viewed_with_its_linked_files(tmp_path):
    _, ctx = hermes_skills(tmp_path)
    box = Toolbox(grants=("skills",))
    body = box.call(ctx, "skill_view", {"name": "polymarket"})
    assert body.lstrip().startswith("# Polymarket — Prediction Market Data")
    assert "references/api-endpoints.md" in body.rsplit("[linked files", 1)[1]
    linked = box.call(ctx, "skill_view", {"name": "polymarket", "file_path": "references/api-endpoints.md"})
    assert linked == (FIXTURES / "skills/research/polymarket/references/api-endpoints.md").read_text()


def test_skill_view_serves_nothing_outside_the_skills_folder(tmp_path):
    _, ctx = hermes_skills(tmp_path)
    box = Toolbox(grants=("skills",))
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the model")
    folder = tmp_path / "ws" / "skills" / "research" / "polymarket"
    (folder / "references" / "link.md").symlink_to(secret)
    (folder / "templates").symlink_to(tmp_path)
    for path, reason in (("../../productivity/nano-pdf/SKILL.md", "'..' is refused"),
                         (str(secret), "absolute paths are refused"),
                         ("references/link.md", "leads outside the skill's folder"),
                         ("templates/secret.txt", "leads outside the skill's folder"),
                         ("references/none.md", "no file references/none.md")):
        with pytest.raises(ToolError, match=reason):
            box.call(ctx, "skill_view", {"name": "polymarket", "file_path": path})
    body = box.call(ctx, "skill_view", {"name": "polymarket"})
    assert "link.md" not in body and "secret" not in body


def test_memory_limits_are_set_in_hermes_yaml_and_reach_the_agent(tmp_path):
    from hermes_sup.agents.worker import Agent
    from hermes_sup.supervisor.config.workspace import ConfigError, load_config
    from hermes_sup.supervisor.spec import build_specs

    path = tmp_path / "hermes.yaml"
    path.write_text("defaults:\n  memory: {memory_char_limit: 4000}\n"
                    "agents:\n  - name: a\n    memory: {user_char_limit: 2000}\n  - name: b\n")
    config = load_config(path)
    specs = {spec.name: spec.agent_config() for spec in build_specs(config, tmp_path)}
    assert specs["a"]["memory"] == {"user_char_limit": 2000}, "an agent's own setting wins, as for terminal"
    assert specs["b"]["memory"] == {"memory_char_limit": 4000}
    agent = Agent(specs["a"], tmp_path, tmp_path / "runs" / "a")
    try:
        assert {t: f.limit for t, f in agent.memory.files.items()} == {"memory": 2200, "user": 2000}
    finally:
        agent.board.close()
    path.write_text("agents:\n  - name: a\n    memory: {user_char_limit: 0}\n")
    with pytest.raises(ConfigError, match=r"hermes.yaml:2: agent a: memory.user_char_limit must be a whole number"):
        load_config(path)
    path.write_text("agents:\n  - name: a\n    memory: {limit: 5}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'memory\.limit'"):
        load_config(path)
