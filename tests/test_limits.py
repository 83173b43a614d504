"""One size limit for every task put on the board, however it arrives: a dropped file, Board.add
(`task add`), or an agent's kanban_create call; and comments are bounded the same way."""

from __future__ import annotations

import os
import threading

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.tools import Toolbox, ToolContext, ToolError
from hermes_sup.kanban import Board, BoardError, TaskError
from hermes_sup.kanban.events import read_all
from hermes_sup.kanban.task import MAX_BYTES

FIVE_MB = "x" * (5 * 1024 * 1024)


def nothing_added(board: Board) -> bool:
    events, _ = read_all(board.events_path)
    return sum(board.counts().values()) == 0 and not events


@pytest.mark.parametrize("fields", [
    {"title": "big body", "body": FIVE_MB},
    {"title": FIVE_MB},
    {"title": "big meta", "meta": {"blob": FIVE_MB}},
    {"title": "big steps", "steps": [{"tool": "write_file", "args": {"content": FIVE_MB}}]},
    {"title": "many small parts", "meta": {str(i): "y" * 100 for i in range(20_000)}},
])
def test_board_add_refuses_a_task_over_the_drop_limit(board, fields):
    with pytest.raises(TaskError, match=f"the limit for a task is {MAX_BYTES} bytes"):
        board.add(fields)
    assert nothing_added(board)


def test_a_task_just_under_the_limit_is_added(board):
    doc = board.add({"title": "big but allowed", "body": "x" * (MAX_BYTES - 2048)})
    assert len(board.get(doc["id"])["body"]) == MAX_BYTES - 2048


def test_kanban_create_shares_the_limit(tmp_path):
    (tmp_path / "scratch").mkdir()
    with Board(tmp_path / "kanban") as board:
        ctx = ToolContext(scratch=tmp_path / "scratch", stop=threading.Event(), board=board, agent="a",
                          task={"id": "parent"})
        with pytest.raises(ToolError, match=f"the board refused the task: .*limit for a task is {MAX_BYTES}"):
            Toolbox(grants=("kanban",)).call(ctx, "kanban_create", {"title": "huge", "body": FIVE_MB})
        assert nothing_added(board)
        assert os.listdir(board.root / "todo") == []


def test_a_comment_over_the_limit_is_refused_and_the_task_kept(board):
    doc = board.add({"title": "commented"})
    with pytest.raises(TaskError, match=f"limit for a comment is {MAX_BYTES} bytes"):
        board.comment(doc["id"], FIVE_MB)
    assert "comments" not in board.get(doc["id"])
    board.comment(doc["id"], "a fine comment")
    assert [c["text"] for c in board.get(doc["id"])["comments"]] == ["a fine comment"]


def test_a_document_the_board_would_refuse_to_read_back_is_never_written(board):
    doc = board.add({"title": "result too large"})
    claimed = board.claim("a")
    with pytest.raises(BoardError, match=r"would be \d+ bytes"):
        board.complete(doc["id"], claimed["claim"]["token"], result="r" * (65 * MAX_BYTES))
    assert board.get(doc["id"])["status"] == "doing"
    assert board.complete(doc["id"], claimed["claim"]["token"], result="ok")["status"] == "done"
