"""`skills new NAME` (supervisor/config/skillnew.py): the skill it writes works as written: its own test
passes with hermes-sup's Python, the check the agents apply accepts it, and an agent of a real team
calls it for a task; nothing existing is ever written over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import CLI, ROOT, init_workspace


def hermes(ws: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    return ws


def test_a_new_python_skill_passes_its_test_and_the_check_and_an_agent_calls_it(tmp_path):
    ws = workspace(tmp_path)
    made = hermes(ws, "skills", "new", "shout", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["files"] == ["skills/shout.py", "tests/test_shout.py"]
    own = subprocess.run([sys.executable, "tests/test_shout.py"], capture_output=True, text=True, timeout=120, cwd=ws)
    assert own.returncode == 0 and own.stdout.count("ok ") == 2, own.stdout + own.stderr
    listed = {s["name"]: s for s in json.loads(hermes(ws, "skills", "list", "--json").stdout)["skills"]}
    assert listed["shout"]["state"] == "ok", listed["shout"]
    (ws / "hermes.yaml").write_text("agents:\n  - name: crier\n    skills: [shout]\n")
    task = json.loads(hermes(ws, "task", "add", "Shout", "--steps",
                             '[{"tool": "shout", "args": {"text": "made by skills new"}}]', "--json").stdout)
    try:
        up = hermes(ws, "up", "--detach")
        assert up.returncode == 0, up.stdout + up.stderr
        waited = hermes(ws, "task", "wait", task["id"], "--timeout", "90", timeout=150)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        shown = json.loads(hermes(ws, "task", "show", task["id"], "--json").stdout)
        assert "MADE BY SKILLS NEW" in json.dumps(shown["result"])
    finally:
        hermes(ws, "down")


def test_a_new_instruction_skill_is_listed_with_its_description(tmp_path):
    ws = workspace(tmp_path)
    assert hermes(ws, "skills", "new", "howto", "--kind", "instructions").returncode == 0
    listed = {s["name"]: s for s in json.loads(hermes(ws, "skills", "list", "--json").stdout)["skills"]}
    assert listed["howto"]["kind"] == "instructions" and listed["howto"]["state"] == "ok"
    assert (ws / "skills" / "howto" / "SKILL.md").read_text().startswith("---\nname: howto\n")


def test_nothing_is_written_over_and_a_bad_name_is_a_usage_error(tmp_path):
    ws = workspace(tmp_path)
    assert hermes(ws, "skills", "new", "shout").returncode == 0
    (ws / "skills" / "shout.py").write_text("# mine\n")
    again = hermes(ws, "skills", "new", "shout")
    assert again.returncode == 1 and "exists already" in again.stderr
    assert (ws / "skills" / "shout.py").read_text() == "# mine\n"
    assert hermes(ws, "skills", "new", "Bad-Name").returncode == 2
    # A link where its test would go: refused, and neither the link's target nor the skill is written.
    target = tmp_path / "elsewhere.py"
    target.write_text("kept\n")
    os.symlink(target, ws / "tests" / "test_other.py")
    linked = hermes(ws, "skills", "new", "other")
    assert linked.returncode == 1 and "nothing was written" in linked.stderr
    assert target.read_text() == "kept\n" and not (ws / "skills" / "other.py").exists()


def test_a_skills_or_tests_folder_that_is_a_link_out_of_the_workspace_is_refused(tmp_path):
    ws = workspace(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    if (ws / "tests").exists():
        (ws / "tests").rmdir()
    os.symlink(outside, ws / "tests")  # tests/ put there as a link to a folder elsewhere
    linked = hermes(ws, "skills", "new", "shout")
    assert linked.returncode == 1 and "symbolic link" in linked.stderr and "nothing was written" in linked.stderr
    assert list(outside.iterdir()) == [] and not (ws / "skills" / "shout.py").exists()
    (ws / "tests").unlink()
    os.rename(ws / "skills", ws / "skills-real")
    os.symlink(outside, ws / "skills")
    linked = hermes(ws, "skills", "new", "notes", "--kind", "instructions")
    assert linked.returncode == 1 and "symbolic link" in linked.stderr
    assert list(outside.iterdir()) == []
