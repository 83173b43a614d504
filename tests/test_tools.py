"""The step tools the agent runs without an LLM, and the scratch-folder confinement."""

from __future__ import annotations

import threading

import pytest

from agents.tools import ToolContext, ToolError, run_step

CAPS = ("fs.read", "fs.write")


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "scratch").mkdir()
    return ToolContext(scratch=tmp_path / "scratch", stop=threading.Event())


def test_write_then_read(ctx):
    assert run_step(ctx, {"tool": "write_file", "args": {"path": "a/b.txt", "content": "hi"}}, CAPS).startswith("wrote")
    assert run_step(ctx, {"tool": "read_file", "args": {"path": "a/b.txt"}}, CAPS) == "hi"


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../x"])
def test_paths_cannot_leave_the_scratch_folder(ctx, path):
    with pytest.raises(ToolError, match=r"escapes|absolute"):
        run_step(ctx, {"tool": "write_file", "args": {"path": path, "content": "x"}}, CAPS)


def test_a_symlink_out_of_the_scratch_folder_is_refused(ctx, tmp_path):
    (ctx.scratch / "out").symlink_to(tmp_path)
    with pytest.raises(ToolError, match="escapes"):
        run_step(ctx, {"tool": "read_file", "args": {"path": "out/secret"}}, CAPS)


def test_unknown_tools_and_missing_capabilities_are_errors(ctx):
    with pytest.raises(ToolError, match="unknown tool 'nope'"):
        run_step(ctx, {"tool": "nope"}, CAPS)
    with pytest.raises(ToolError, match=r"needs the fs\.write capability"):
        run_step(ctx, {"tool": "write_file", "args": {"path": "x", "content": ""}}, ("fs.read",))


def test_wait_is_interrupted_by_a_stop(ctx):
    ctx.stop.set()
    with pytest.raises(ToolError, match="interrupted"):
        run_step(ctx, {"tool": "wait", "args": {"seconds": 30}}, CAPS)
