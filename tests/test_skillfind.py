"""Skill discovery (agents/skillfind.py): a walk of the skills folders kept until one of them changes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hermes_sup.agents import skillfind
from hermes_sup.agents.skillfind import Finder


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each real walk of the folders, counted (the walk itself runs as it is)."""
    counted: list[int] = []
    find = skillfind.find

    def counting(*args, **kwargs):
        counted.append(1)
        return find(*args, **kwargs)
    monkeypatch.setattr(skillfind, "find", counting)
    return counted


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Move the walk's clock on: the folders' last changes are `seconds` old for it."""
    monkeypatch.setattr(skillfind, "wall_ns", lambda: time.time_ns() + int(seconds * 1e9))


def test_a_walk_is_kept_until_a_folder_it_walked_changes_and_never_while_a_change_is_fresh(
        tmp_path: Path, walks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    bundled, workspace = tmp_path / "bundled", tmp_path / "skills"
    (bundled).mkdir()
    (bundled / "alpha.py").write_text("")
    deep = workspace / "mlops" / "inference"
    deep.mkdir(parents=True)
    finder = Finder(bundled, workspace)

    # Fresh folders (changed within the kernel's tick of the walk, for all it knows): walked each time.
    assert set(finder.found()) == {"alpha"}
    assert set(finder.found()) == {"alpha"}
    assert len(walks) == 2

    later(monkeypatch, 2)
    finder.found()
    assert set(finder.found()) == {"alpha"}
    assert len(walks) == 3, "an unchanged set of folders was walked again"

    # An instruction skill made three folders down: that folder changed, so the walk is redone.
    (deep / "llama").mkdir()
    (deep / "llama" / "SKILL.md").write_text("---\ndescription: d\n---\n")
    assert set(finder.found()) == {"alpha", "llama"}
    # A Python skill added to the bundled folder.
    (bundled / "beta.py").write_text("")
    later(monkeypatch, 4)
    assert set(finder.found()) == {"alpha", "beta", "llama"}
    # A skills folder removed: gone from what is found.
    (deep / "llama" / "SKILL.md").unlink()
    later(monkeypatch, 6)
    assert set(finder.found()) == {"alpha", "beta"}
    walked = len(walks)
    assert set(finder.found()) == {"alpha", "beta"}
    assert len(walks) == walked


def test_a_skills_folder_that_is_a_link_is_walked_again_when_the_folder_it_names_changes(
        tmp_path: Path, walks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    bundled, real, workspace = tmp_path / "bundled", tmp_path / "shared-skills", tmp_path / "skills"
    bundled.mkdir()
    real.mkdir()
    workspace.symlink_to(real)
    finder = Finder(bundled, workspace)
    later(monkeypatch, 2)
    assert finder.found() == {}
    (real / "gamma.py").write_text("")
    later(monkeypatch, 4)
    assert set(finder.found()) == {"gamma"}, "a skill added through the link went unseen"
