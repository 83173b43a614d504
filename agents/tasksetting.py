"""What an agent works a task with: the task's folder and worktrees, its tools (skills and MCP servers
included), the tool context, and the results of the tasks it depends on."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from ..kanban import BoardError
from . import mcpservers, worktrees
from .logline import say
from .taskdir import ensure_work_folder
from .terminal import clean_env, command_for, withheld
from .tools import Toolbox, ToolContext


class TaskSetting:
    """The folders, tools and inputs of the agent's tasks (mixed into worker.Agent, whose state it uses)."""

    def toolbox(self, grants: tuple[str, ...] | None = None, whose: str = "this agent") -> Toolbox:
        """This agent's tools for the next task, with `grants` (default: its capabilities): the
        built-ins and the skills it enables, looked up again for every task so a skill dropped into
        skills/ is picked up without a restart. With `skills` granted every valid skill may be used;
        otherwise the ones the agent's config lists."""
        grants = self.capabilities if grants is None else grants
        enabled = None if "skills" in grants else set(self.config.get("skills") or ())
        extra, notes = self.skills.tools_for(enabled)
        for note in notes:
            say(self.name, f"{note}")
        return Toolbox(grants=grants, toolsets=self.toolsets, extra={**extra, **self.mcp.tools()}, whose=whose)

    def _warm_skills(self) -> None:
        """Check the skills on a thread of their own at start, not on the first task: a check runs
        each skill in a confined process (about a second), and the first task of every agent of a
        new workspace waited for it while the board filled. A failure here is the first task's to
        meet and say (it looks the same skills up again)."""
        def warm() -> None:
            with contextlib.suppress(Exception):
                self.skills.catalog()
        threading.Thread(target=warm, name="skills-warm", daemon=True).start()

    def _start_mcp(self) -> None:
        """Start the MCP servers granted to this agent and wait (bounded) for their first tool list."""
        if not self.mcp.servers:
            return
        self.mcp.start().wait_ready()
        for server in self.mcp.servers.values():
            say(self.name, f"mcp {server.name}: " + (f"{len(server.tools)} tool(s)" if server.session is not None
                                                     else f"not connected ({server.error or 'starting'})"))
            for note in server.notes:
                say(self.name, f"mcp {server.name}: {note}")

    def _mcp_command(self, name: str, spec: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """A stdio MCP server's command line, confined as the terminal is, in its own folder; a
        worktree's repository read-only to it (its tasks' trees are theirs). Its `env_from` values
        come from this process's environment, by name."""
        folder = mcpservers.server_folder(self.workdir, name)
        folders = {key: {**spec_, "mode": "ro"} if spec_.get("worktree") else spec_
                   for key, spec_ in (self.config.get("folders") or {}).items()}
        env = clean_env(os.environ, withheld(self.config))
        env.update({key: str(value) for key, value in (spec.get("env") or {}).items()})
        env.update({key: os.environ.get(var, "") for key, var in (spec.get("env_from") or {}).items()})
        argv = [str(spec["command"]), *(str(arg) for arg in spec.get("args") or ())]
        return command_for({**self.config, "folders": folders}, self.capabilities, self.workspace, folder, folder,
                           env, argv, shown=mcpservers.named_files(argv))

    def context(self, doc: dict[str, Any], halt: threading.Event | None = None,
                grants: tuple[str, ...] | None = None) -> ToolContext:
        stop = halt or self.stop
        return ToolContext(scratch=self.task_folder(doc), stop=stop, memory=self.memory, board=self.board,
                           agent=self.name, task=doc, llm=lambda tier, prompt, log=None: self.ask_model(
                               tier, prompt, stop, task=str(doc.get("id")), log=log),
                           settings={**self.config, "folders": self._folders(self.config.get("folders"), doc)},
                           services={"skills": self.skills, "delegation": self.delegator},
                           grants=self.capabilities if grants is None else grants, workspace=self.workspace)

    def _folders(self, folders: Any, doc: dict[str, Any]) -> dict[str, Any]:
        """The agent's folders as this task's tools see them: a worktree folder leads to its tree."""
        try:
            return worktrees.attach(folders or {}, self.workspace / "runs", str(doc.get("id")))
        except ValueError:  # not a task id: no tree, and the folder itself is not offered instead
            return {name: spec for name, spec in (folders or {}).items() if not spec.get("worktree")}

    def _trees(self, doc: dict[str, Any]) -> None:
        """Make this task's worktrees that are missing (WorktreeError says why one cannot be)."""
        own = worktrees.tree_of(self.workspace / "runs", str(doc["id"]), "x").parent
        for spec in self._folders(self.config.get("folders"), doc).values():
            if spec.get("tree") and Path(spec["tree"]).parent == own:
                worktrees.ensure(Path(spec["path"]), Path(spec["tree"]), str(doc["id"]), spec.get("base"))

    def _commit_trees(self, task_id: str) -> None:
        """Commit what the task changed in each of its worktrees, with its title; a failure is said on
        the task (its changes stay in the tree, which prune keeps until told)."""
        made = worktrees.records(self.workspace / "runs", task_id)
        if not made:
            return
        title = task_id
        with contextlib.suppress(BoardError):
            title = str(self.board.get(task_id).get("title") or task_id)
        for name, record in made.items():
            tree = worktrees.tree_of(self.workspace / "runs", task_id, name)
            try:
                commit = worktrees.commit(tree, record, f"{title}\n\nhermes-sup task {task_id}", self.name)
                say(self.name, f"{task_id}: {name}: " + (f"committed {commit[:12]} to {worktrees.branch_of(task_id)}"
                                                         if commit else "nothing to commit"))
            except worktrees.WorktreeError as exc:
                with contextlib.suppress(BoardError):
                    self.board.comment(task_id, f"the changes in {tree} were not committed: {exc}", by=self.name)

    def task_folder(self, doc: dict[str, Any]) -> Path:
        """Where the tools work on this task: its own folder under runs/tasks/, the same for whoever
        holds it, so a take-over or a retry finds the files the conversation names. Only the task's id
        (a checked name) places it: no other field of a task points the tools anywhere. A folder that
        cannot be made (a symlink on the way) leaves the agent's own scratch folder, and says why."""
        try:
            return ensure_work_folder(self.workspace / "runs", str(doc.get("id")))
        except (OSError, ValueError) as exc:
            say(self.name, f"working in {self.scratch}, not in the task's own folder: {exc}")
            return self.scratch

    def inputs(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """The tasks this one depends on, for their results."""
        found = []
        for dep in doc.get("depends_on") or []:
            with contextlib.suppress(BoardError):
                found.append(self.board.get(dep))
        return found
