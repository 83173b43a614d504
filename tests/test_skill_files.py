"""skill_manage on instruction skills in Hermes Agent's shape (agents/skillfiles.py): create with a
category, edit, patch SKILL.md or a file beside it, write_file, remove_file, delete; each checked as
Hermes checks it, each change kept so that rollback brings any version back; nothing written outside
the skill's folder, nothing bundled changed."""

from __future__ import annotations

import json
import threading

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.skillfiles import frontmatter_problem, path_problem
from hermes_sup.agents.skills import Skills
from hermes_sup.agents.tools import Refused, Toolbox, ToolContext, ToolError

SKILL = "---\nname: deploy-checks\ndescription: What to check before a deploy.\n---\n1. Run the tests.\n"
GRANTS = ("skills", "shell", "fs.read")


@pytest.fixture
def place(tmp_path):
    (tmp_path / "skills").mkdir()
    bundled = tmp_path / "bundled"
    (bundled / "ops" / "kept").mkdir(parents=True)
    (bundled / "ops" / "kept" / "SKILL.md").write_text("---\nname: kept\ndescription: Bundled.\n---\nBody.\n")
    skills = Skills(tmp_path, bundled=bundled)
    (tmp_path / "scratch").mkdir()
    ctx = ToolContext(scratch=tmp_path / "scratch", stop=threading.Event(), agent="maker", services={"skills": skills})
    return tmp_path, skills, ctx


def manage(ctx: ToolContext, **args) -> str:
    return Toolbox(grants=GRANTS, toolsets=("skills",)).call(ctx, "skill_manage", args)


def test_hermes_actions_on_an_instruction_skill_and_every_version_back(place):
    root, skills, ctx = place
    assert "created instruction skill deploy-checks in devops" in manage(
        ctx, action="create", name="deploy-checks", content=SKILL, category="devops")
    assert (root / "skills/devops/deploy-checks/SKILL.md").read_text() == SKILL
    assert skills.get("deploy-checks").description == "What to check before a deploy."
    manage(ctx, action="patch", name="deploy-checks", old_string="Run the tests.", new_string="Run make test.")
    manage(ctx, action="write_file", name="deploy-checks", file_path="references/rollback.md",
           file_content="How to roll back.\n")
    manage(ctx, action="patch", name="deploy-checks", file_path="references/rollback.md", old_string="roll",
           new_string="ROLL", replace_all=True)
    folder = root / "skills/devops/deploy-checks"
    assert (folder / "references/rollback.md").read_text() == "How to ROLL back.\n"
    viewed = Toolbox(grants=GRANTS, toolsets=("skills",)).call(ctx, "skill_view", {"name": "deploy-checks"})
    assert "Run make test." in viewed and "references/rollback.md" in viewed
    manage(ctx, action="edit", name="deploy-checks", content=SKILL.replace("1.", "First:"))
    manage(ctx, action="remove_file", name="deploy-checks", file_path="references/rollback.md")
    assert not (folder / "references/rollback.md").exists()
    assert "version" in manage(ctx, action="delete", name="deploy-checks", absorbed_into="")
    assert not folder.exists()
    assert "rolled skill deploy-checks back to version 6" in manage(ctx, action="rollback", name="deploy-checks")
    assert (folder / "SKILL.md").read_text() == SKILL.replace("1.", "First:"), "the deleted skill, back in devops/"
    manage(ctx, action="rollback", name="deploy-checks", version=3)
    assert (folder / "SKILL.md").read_text().endswith("1. Run make test.\n")
    assert (folder / "references/rollback.md").read_text() == "How to roll back.\n"
    log = [json.loads(line) for line in (root / "skills/.history/instructions/deploy-checks/log.jsonl")
           .read_text().splitlines()]
    assert [entry["note"] for entry in log][:3] == ["created", "patched SKILL.md", "wrote references/rollback.md"]
    assert all(entry["by"] == "maker" for entry in log)


@pytest.mark.parametrize("args, message", [
    ({"action": "create", "name": "Bad Name", "content": SKILL}, "must be lowercase letters"),
    ({"action": "create", "name": "x-y", "content": "no front matter"}, "must start with YAML front matter"),
    ({"action": "create", "name": "x", "content": "---\nname: x\n---\nBody\n"}, "must include 'description'"),
    ({"action": "create", "name": "x", "content": "---\nname: x\ndescription: d\n---\n  \n"}, "needs instructions"),
    ({"action": "create", "name": "x", "content": SKILL, "category": "../up"}, "category '../up' must be"),
    ({"action": "create", "name": "kept", "content": SKILL}, "exists"),
    ({"action": "edit", "name": "kept", "content": SKILL}, "bundled with hermes-sup"),
    ({"action": "edit", "name": "nobody", "content": SKILL}, "no instruction skill named"),
])
def test_what_hermes_refuses_is_refused_and_nothing_is_written(place, args, message):
    root, _, ctx = place
    with pytest.raises((ToolError, Refused), match=message.replace("(", r"\(").replace(".", r"\.")):
        manage(ctx, **args)
    assert list((root / "skills").iterdir()) == [], "nothing written, not even a history"


@pytest.mark.parametrize("file_path", ["../escape.md", "/etc/passwd", "notes.md", "references", "scripts/../../x",
                                       "~/x", "a/b/SKILL.md"])
def test_a_file_path_outside_the_skills_own_places_is_refused(place, file_path):
    root, _, ctx = place
    manage(ctx, action="create", name="deploy-checks", content=SKILL)
    with pytest.raises(ToolError):
        manage(ctx, action="write_file", name="deploy-checks", file_path=file_path, file_content="x")
    assert sorted(p.name for p in (root / "skills/deploy-checks").iterdir()) == ["SKILL.md"]
    assert not (root / "escape.md").exists()


def test_a_link_planted_in_a_skill_is_never_written_through(place, tmp_path):
    root, _, ctx = place
    manage(ctx, action="create", name="deploy-checks", content=SKILL)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "skills/deploy-checks/references").symlink_to(outside)
    with pytest.raises(ToolError, match="not a folder of the skill's own"):
        manage(ctx, action="write_file", name="deploy-checks", file_path="references/x.md", file_content="x")
    (root / "skills/deploy-checks/templates").mkdir()
    (root / "skills/deploy-checks/templates/t.md").symlink_to(outside / "t.md")
    with pytest.raises(ToolError, match="not a regular file"):
        manage(ctx, action="write_file", name="deploy-checks", file_path="templates/t.md", file_content="x")
    assert list(outside.iterdir()) == []


def test_python_skills_keep_their_own_actions(place):
    root, _, ctx = place
    source = "from hermes_sup.agents.tools import Tool, register\n"
    with pytest.raises(ToolError):  # create a Python skill whose check fails: a Python skill's path still
        manage(ctx, action="create", name="tally", content=source + "this is not python\n")
    assert not (root / "skills/tally.py").exists()


def test_the_checks_alone():
    assert frontmatter_problem(SKILL) == "" and frontmatter_problem("\ufeff" + SKILL) == ""
    assert "over 100,000" in frontmatter_problem(SKILL + "x" * 100_000)
    assert "not closed" in frontmatter_problem("---\nname: x\n")
    assert path_problem("SKILL.md") == path_problem("deploy-checks/SKILL.md") == path_problem("assets/a.png") == ""
    assert path_problem("x\0y") and path_problem("") and path_problem(None)


# -- what a mutation check found unguarded -------------------------------------------------------------

def test_a_category_that_is_a_link_is_never_written_through(place, tmp_path):
    root, _, ctx = place
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "skills" / "devops").symlink_to(outside)
    with pytest.raises(ToolError, match="not a folder of skills/"):
        manage(ctx, action="create", name="deploy-checks", content=SKILL, category="devops")
    assert list(outside.iterdir()) == []


def test_a_rollback_goes_where_the_skill_was_never_where_its_log_points(place, tmp_path):
    import json

    root, _, ctx = place
    manage(ctx, action="create", name="deploy-checks", content=SKILL, category="devops")
    manage(ctx, action="delete", name="deploy-checks")
    log = root / "skills/.history/instructions/deploy-checks/log.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    records[-1]["folder"] = "../../outside/deploy-checks"  # a log edited to lead out of skills/
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    manage(ctx, action="rollback", name="deploy-checks")
    assert (root / "skills/deploy-checks/SKILL.md").read_text() == SKILL
    assert not (tmp_path / "outside").exists()
    manage(ctx, action="delete", name="deploy-checks")
    (root / "skills/devops").rmdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    records[-1]["folder"] = "devops/deploy-checks"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "skills/devops").symlink_to(outside)  # and a category replaced by a link since
    with pytest.raises(ToolError, match="not a folder of skills/"):
        manage(ctx, action="rollback", name="deploy-checks")
    assert list(outside.iterdir()) == []


def test_patches_edits_and_files_are_checked_as_a_create_is(place):
    root, _, ctx = place
    manage(ctx, action="create", name="deploy-checks", content=SKILL + "2. Run the tests.\n")
    folder = root / "skills/deploy-checks"
    before = (folder / "SKILL.md").read_text()
    with pytest.raises(ToolError, match="must include 'description'"):
        manage(ctx, action="patch", name="deploy-checks", old_string="description: What to check before a deploy.\n",
               new_string="")
    with pytest.raises(ToolError, match="occurs 2 times"):
        manage(ctx, action="patch", name="deploy-checks", old_string="Run the tests.", new_string="Run make test.")
    assert "2 place(s)" in manage(ctx, action="patch", name="deploy-checks", old_string="Run the tests.",
                                  new_string="Run make test.", replace_all=True)
    assert (folder / "SKILL.md").read_text() != before
    with pytest.raises(ToolError, match="over 1,048,576 bytes"):
        manage(ctx, action="write_file", name="deploy-checks", file_path="assets/big.bin",
               file_content="x" * (1 << 20) + "x")
    with pytest.raises(ToolError, match="description is over 1024"):
        manage(ctx, action="edit", name="deploy-checks", content=SKILL.replace("What to check before a deploy.",
                                                                               "d" * 1025))
    with pytest.raises(ToolError, match="delete the skill instead"):
        manage(ctx, action="remove_file", name="deploy-checks", file_path="SKILL.md")
    with pytest.raises(ToolError, match="absorbed_into names no skill"):
        manage(ctx, action="delete", name="deploy-checks", absorbed_into="nosuch")
    with pytest.raises(ToolError, match=r"no version 99; kept: 1"):
        manage(ctx, action="rollback", name="deploy-checks", version=99)
    patched = (folder / "SKILL.md").read_text()
    manage(ctx, action="rollback", name="deploy-checks")  # the patch undone
    assert (folder / "SKILL.md").read_text() == before
    manage(ctx, action="rollback", name="deploy-checks", version=2)  # and the rollback itself, kept as 2
    assert (folder / "SKILL.md").read_text() == patched
