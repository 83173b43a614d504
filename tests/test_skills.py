"""Skills for real: each file validated in a process of its own, broken ones rejected with their
reason beside a good one, versions kept by skill_manage, rolled back by the tool and the CLI, and
instruction skills (SKILL.md) listed and read."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.skills import Skills, front_matter, prompt_block
from hermes_sup.agents.tools import Toolbox, ToolContext, ToolError

ROOT = Path(__file__).resolve().parent.parent
GOOD = '''"""Double a number."""
from hermes_sup.agents.tools import Tool, register

def double(ctx, args):
    return str(args["n"] * 2)

register(Tool("double", "Double n.", double, {"type": "object", "properties": {"n": {"type": "integer"}},
              "required": ["n"]}, capabilities=("fs.read",), idempotent=True))
'''
BROKEN = {
    "syntax": ("def oops(:\n    pass\n", "syntax error at line 1"),
    "importer": ("import no_such_module_here\n", "ModuleNotFoundError while loading: No module named"),
    "badschema": ('from hermes_sup.agents.tools import Tool, register\nregister(Tool("bad_schema", "x", print, '
                  '{"type": "object", "properties": {"n": {"type": "integr"}}}))\n',
                  "tool bad_schema: bad schema: parameters.properties.n: unknown type 'integr'"),
    "exits": ("import sys\nsys.exit(3)\n", "calls sys.exit(3) while loading"),
    "loops": ("while True:\n    pass\n", "did not finish loading within"),
    "clash": ('from hermes_sup.agents.tools import Tool, register\nregister(Tool("terminal", "mine", print))\n',
              "clashes with the built-in tool"),
    "nothing": ("x = 1\n", "registers no tool"),
    "kills": ("import os\nos._exit(9)\n", "ended with status 9 without a verdict"),
}


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    from hermes_sup.agents import skills as skills_module

    monkeypatch.setattr(skills_module, "CHECK_TIMEOUT", 3.0)  # bounds the looping skill's check
    (tmp_path / "skills").mkdir()
    return tmp_path


def ctx_for(workspace: Path, skills: Skills) -> ToolContext:
    (workspace / "scratch").mkdir(exist_ok=True)
    return ToolContext(scratch=workspace / "scratch", stop=threading.Event(), agent="maker",
                       services={"skills": skills})


def test_broken_skills_are_rejected_with_their_reason_and_a_good_one_loads(workspace):
    (workspace / "skills" / "double.py").write_text(GOOD)
    for name, (source, _) in BROKEN.items():
        (workspace / "skills" / f"{name}.py").write_text(source)
    skills = Skills(workspace, bundled=workspace / "none")
    catalog = {skill.name: skill for skill in skills.catalog()}
    assert catalog["double"].state == "ok" and [t["name"] for t in catalog["double"].tools] == ["double"]
    for name, (_, reason) in BROKEN.items():
        assert catalog[name].state == "rejected", name
        assert reason in catalog[name].error, (name, catalog[name].error)
    tools, notes = skills.tools_for(None)
    assert list(tools) == ["double"] and len(notes) == len(BROKEN)
    box = Toolbox(extra=tools)
    assert box.call(ctx_for(workspace, skills), "double", {"n": 21}) == "42"
    verdicts = json.loads((workspace / "runs" / "skills.json").read_text())
    assert len(verdicts) == len(BROKEN) + 1, "each version is checked once, then remembered"


def test_create_patch_break_and_roll_back_through_skill_manage_and_the_cli(workspace):
    skills = Skills(workspace, bundled=workspace / "none")
    ctx = ctx_for(workspace, skills)
    box = Toolbox(grants=("fs.read", "skills"))
    assert box.call(ctx, "skill_manage", {"action": "create", "name": "double", "content": GOOD}) == \
        "created skill double: tools double"
    assert box.call(ctx, "skill_manage", {"action": "patch", "name": "double", "old_string": "* 2",
                                          "new_string": "* 3"}).startswith("patched")
    assert Toolbox(extra=skills.tools_for(None)[0]).call(ctx, "double", {"n": 2}) == "6", "the new version is used"
    with pytest.raises(ToolError, match="skill double was not changed: the new version is rejected: syntax error"):
        box.call(ctx, "skill_manage", {"action": "patch", "name": "double", "content": "def (:"})
    assert "* 3" in (workspace / "skills" / "double.py").read_text()
    # A version that validates but whose tool fails at use: the CLI rolls it back.
    box.call(ctx, "skill_manage", {"action": "patch", "name": "double", "old_string": 'str(args["n"] * 3)',
                                   "new_string": "1 / 0"})
    with pytest.raises(ToolError, match="double raised ZeroDivisionError"):
        Toolbox(extra=skills.tools_for(None)[0]).call(ctx, "double", {"n": 2})
    cli = [sys.executable, "-m", "hermes_sup.supervisor", "-w", str(workspace)]
    (workspace / "hermes.yaml").write_text("agents: []\n")
    history = json.loads(subprocess.run([*cli, "skills", "history", "double", "--json"], capture_output=True,
                                        text=True, cwd=ROOT, check=True).stdout)
    assert [v["version"] for v in history["versions"]] == [1, 2] and history["versions"][0]["by"] == "maker"
    done = subprocess.run([*cli, "skills", "rollback", "double", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["restored"] == 2 and json.loads(done.stdout)["state"] == "ok"
    assert Toolbox(extra=skills.tools_for(None)[0]).call(ctx, "double", {"n": 2}) == "6"
    assert box.call(ctx, "skill_manage", {"action": "rollback", "name": "double", "version": 1}) == \
        "rolled skill double back to version 1 (ok)"
    assert Toolbox(extra=skills.tools_for(None)[0]).call(ctx, "double", {"n": 2}) == "4"
    listed = json.loads(subprocess.run([*cli, "skills", "list", "--json"], capture_output=True, text=True, cwd=ROOT,
                                       check=True).stdout)
    sources = {s["name"]: (s["source"], s["state"]) for s in listed["skills"]}
    assert sources["double"] == ("workspace", "ok") and sources["web_fetch"] == ("bundled", "ok")
    missing = subprocess.run([*cli, "skills", "rollback", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 1 and "skill nope has no earlier version" in missing.stderr


def test_instruction_skills_are_listed_and_read_on_demand(workspace):
    folder = workspace / "skills" / "release_notes"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: release_notes\ndescription: Write release notes from a changelog.\n"
                                     "---\n# Release notes\n\nGroup changes by kind.\n")
    (workspace / "skills" / "no_front").mkdir()
    (workspace / "skills" / "no_front" / "SKILL.md").write_text("just text\n")
    skills = Skills(workspace, bundled=workspace / "none")
    block = prompt_block(skills.catalog())
    assert "- release_notes: Write release notes from a changelog." in block and "no_front" not in block
    ctx = ctx_for(workspace, skills)
    body = Toolbox(grants=("skills",)).call(ctx, "skill_view", {"name": "release_notes"})
    assert body == "# Release notes\n\nGroup changes by kind.\n"
    assert front_matter("no front matter") == ({}, "no front matter")


def test_the_bundled_skills_validate():
    from hermes_sup.agents.skills import check_in_process_of_its_own

    verdicts = {path.stem: check_in_process_of_its_own(path) for path in sorted((ROOT / "skills").glob("*.py"))}
    assert {name: v["ok"] for name, v in verdicts.items()} == {"data_tools": True, "summarize": True,
                                                                  "web_fetch": True}
    assert verdicts["data_tools"]["tools"][0]["name"] == "json_query"
