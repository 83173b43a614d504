"""The agent process: heartbeat, claim a task, work it, close it; stop cleanly on SIGTERM; leave by
itself when no supervisor has heard from it for `orphan_grace` seconds.

A task with `steps` is worked by running them (tool calls, no LLM); any other task by the LLM
loop (agents/loop.py) over the provider chain of its tier. With no provider at all the agent takes
only tasks with steps and leaves the rest in todo, looking for a provider again every few seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_sup.kanban import BoardError, ClaimLost, TaskNotFound
from hermes_sup.kanban.backends import open_board
from hermes_sup.kanban.events import agent_event
from hermes_sup.kanban.fsio import write_json_atomic
from hermes_sup.kanban.journal import Journal
from hermes_sup.kanban.task import now_iso

from . import (
    builtins,  # noqa: F401 - registers the built-in tools
    clirun,
    hermesrun,
    mcpservers,
    sandbox,
    worktrees,
)
from .breaker import Breaker, label
from .budget import Refusal, caps_from, task_cap
from .cascade import Cascade, cascade_policy, cascades
from .delegation import Delegator, watch_parent
from .grants import describe, grants_of
from .keys import ENV_FILE, KeyFile, key_names
from .ledger import BudgetGate, BudgetReached, Ledger, open_ledger
from .logline import say, short
from .loop import TaskLoop, ToolUse, interruptible, llm_record, task_prompt
from .memory import Memories
from .notify import NOTIFY_ENV, ORPHANED, Notifier
from .providers import (
    BREAKERS_FILE,
    Attempt,
    Provider,
    ProviderConfig,
    ProviderError,
    ProviderHealth,
    abort,
    complete_with_fallback,
    make_provider,
)
from .routing import chain_for, keep_auto, resolve_auto, task_tier
from .skills import Skills, prompt_block
from .steps import StepRun, step_folders, step_grants
from .taskdir import ensure_work_folder
from .telemetry import Telemetry, install
from .terminal import clean_env, command_for, withheld
from .tools import DEFAULT_CAPABILITIES, Toolbox, ToolContext, ToolError

AGENT_ENV = "HERMES_SUP_AGENT"
NO_PROVIDER = "no LLM provider available"
# How often an agent without a provider looks again: a stat of .env (a new local server is looked for
# at most once a minute, see _resolve_auto).
OFFLINE_RECHECK = 5.0
WORKSPACE_ENV = "HERMES_SUP_WORKSPACE"
# The pid of the supervisor that starts the agent (as its child): see Worker._owned.
SUPERVISOR_ENV = "HERMES_SUP_SUPERVISOR_PID"
# How often the holder of a task looks whether it still holds it (a cancel, a move by hand, a
# reclaim), and how many looks in a row must say no: work stops within CLAIM_CHECK * CLAIM_LOOKS,
# plus the moment a tool or a model call takes to notice.
CLAIM_CHECK = 0.15
CLAIM_LOOKS = 2
# Why LLM tasks wait while a cap was reached and the ledger cannot say whether it still is.
BUDGET_UNKNOWN = "budget reached: the budget ledger cannot be read, so LLM tasks wait"


def claim_gone(doc: dict[str, Any] | None, token: int) -> str | None:
    """Why a task's document says its claim `token` is no longer held, or None while it is (pure).
    None for the document means the task is no longer on the board."""
    if doc is None:
        return "it is no longer on the board"
    claim = doc.get("claim") or {}
    if doc.get("status") == "doing" and claim.get("token") == token:
        return None
    if doc.get("status") == "doing":
        return f"it was claimed again by {claim.get('agent')}"
    return f"it was moved to {doc.get('status')}" + (f" ({doc['history'][-1].get('note')})"
                                                      if doc.get("history") else "")


class Agent:
    def __init__(self, config: dict[str, Any], workspace: Path, workdir: Path) -> None:
        self.config = config
        self.name: str = config["name"]
        self.roles = tuple(config.get("roles") or ())
        self.capabilities = tuple(config.get("capabilities") or DEFAULT_CAPABILITIES)
        self.toolsets = tuple(config["toolsets"]) if config.get("toolsets") is not None else None
        self.only_task: str | None = config.get("only_task")  # a delegated child: its one task, then leave
        self.parent_pid: int | None = config.get("parent_pid")
        self.workspace = workspace
        self.orphan_grace = float(config.get("orphan_grace", 30.0))
        self.interval = max(0.05, min(5.0, float(config.get("heartbeat_timeout", 60.0)) / 4))
        self.log_max_bytes = int(float(config.get("log_max_mb", 10.0)) * (1 << 20))
        self.log_keep = int(config.get("log_keep", 3))
        self.workdir = workdir
        self.scratch = workdir / "scratch"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.board = open_board(workspace, config.get("board"), host=config.get("host"))
        self.skills = Skills(workspace, listed=config.get("skills") or ())
        self.delegator = Delegator(board=self.board, workspace=workspace, workdir=workdir, config=config)
        self.mcp = mcpservers.Hub(config.get("mcp_servers") or {}, self._mcp_command)
        self.notifier = Notifier(os.environ.get(NOTIFY_ENV), self.name)
        self.stop = threading.Event()
        self.tier = str(config.get("tier") or "auto")
        self.llm = config.get("llm") or {}
        self.memory = Memories(workdir / "memory", config.get("memory"))
        self._providers: dict[str, Provider] = {}
        self._tool_use: dict[str, ToolUse] = {}  # per provider: does it ever call the tools it is offered?
        self.health = ProviderHealth(path=workdir / BREAKERS_FILE,  # doctor shows the breakers
                                     on_outage=self._outage)
        # Until when LLM tasks are left in todo because every provider refused its connections
        # (epoch seconds), and the reason they show meanwhile.
        self._paused: tuple[float, str] | None = None
        # Hard budgets: every agent that can claim the board's tasks reserves against one ledger, the
        # board's (runs/ for the file board, its database for PostgreSQL, shared by every host). While
        # a team or agent cap is reached, LLM tasks stay in todo; `_budget_wait` holds the gate and the
        # refused call's worst case to look again with (a reservation settling lower frees room).
        self.caps = caps_from(self.llm.get("budgets"))
        self.ledger: Ledger | None = open_ledger(workspace, config.get("board"), host=config.get("host")) \
            if self.caps.any() else None
        self._budget_wait: tuple[BudgetGate, float] | None = None
        self._auto: tuple[float, ProviderConfig | None] | None = None
        self._auto_said: list[str] = []
        self.keys = KeyFile(workspace / ENV_FILE, key_names(self.llm))
        self.step: int | None = None
        self.provider = "offline"
        self.waiting: str | None = None  # why it leaves LLM tasks in todo ("" when it does not; None: not yet known)
        self.why_stopping = ""
        self.current: dict[str, Any] | None = None
        self._halt: threading.Event | None = None  # the current task's stop: ours, or the task taken away
        self._lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._orphaned_since: float | None = None
        self.orphaned = False  # it stops because it heard from no supervisor: exit status ORPHANED
        # The supervisor that started us (we are its child until it dies and we are reparented).
        spawner = os.environ.get(SUPERVISOR_ENV, "")
        self._spawner = int(spawner) if spawner.isdigit() else 0
        self.telemetry = install(Telemetry.from_settings(config.get("telemetry"), os.environ, agent=self.name,
                                                         workspace=str(workspace), host=config.get("host"),
                                                         providers=self.llm.get("providers")))

    # -- signals and heartbeat --------------------------------------------------------------------

    def request_stop(self, why: str) -> None:
        if not self.stop.is_set():
            self.why_stopping = why
            self.stop.set()
            with self._lock:
                if self._halt is not None:
                    self._halt.set()
            self.board.wake()

    def beat(self) -> None:
        with self._lock:
            task = self.current
        if self.parent_pid is not None:
            delivered = os.getppid() == self.parent_pid  # a child answers to its parent agent, not the supervisor
        else:
            delivered = self.notifier.send(WATCHDOG=1, TASK=task["id"] if task else "-") and self._owned()
        now = time.monotonic()
        if delivered:
            self._orphaned_since = None
        elif self._orphaned_since is None:
            self._orphaned_since = now
        elif now - self._orphaned_since >= self.orphan_grace:
            self.orphaned = True
            self.request_stop(f"no supervisor for {self.orphan_grace:g} s")
        self.write_state("working" if task else "idle")
        self.rotate_log()
        if task is not None:
            # If the task was taken back, the step in flight finds out when it closes the task.
            with contextlib.suppress(ClaimLost):
                self.board.renew(task["id"], task["claim"]["token"])

    def _owned(self) -> bool:
        """Whether the supervisor we heart-beat to runs this very process. While the supervisor that
        started us is alive we are its child, whatever its state file says yet (busy starting 255 other
        agents, it writes it late). Once reparented, a supervisor started after ours died binds the
        same socket: if its state does not name our pid (it runs another process for our name) our
        heartbeats reach it but keep nobody informed, and we must leave."""
        if self._spawner > 1 and os.getppid() == self._spawner:
            return True
        try:
            state = json.loads((self.workspace / "runs" / "supervisor.json").read_text())  # the supervisor's STATE_FILE
            return state["agents"][self.name]["pid"] == os.getpid()
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def rotate_log(self) -> None:
        """Rotate our own log by size: the writer rotating is the one way no line is lost or
        written to a file nobody reads. agent.log -> agent.log.1 -> ... -> agent.log.<keep>."""
        with self._log_lock:
            self._rotate_log()

    def _rotate_log(self) -> None:
        path = self.workdir / "agent.log"
        try:
            current = os.fstat(1)
            if current.st_size < self.log_max_bytes or os.stat(path).st_ino != current.st_ino:
                return
        except OSError:
            return  # stdout is not our log file (started by hand), or it is gone
        sys.stdout.flush()
        sys.stderr.flush()
        for index in range(self.log_keep - 1, 0, -1):
            older = path.with_name(f"agent.log.{index}")
            if older.exists():
                os.replace(older, path.with_name(f"agent.log.{index + 1}"))
        if self.log_keep > 0:
            os.replace(path, path.with_name("agent.log.1"))
        else:
            path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def write_state(self, status: str) -> None:
        with self._lock:
            task = self.current
        write_json_atomic(self.workdir / "state.json", {
            "name": self.name, "pid": os.getpid(), "status": status, "task": task["id"] if task else None,
            "step": self.step if task else None, "provider": self.provider, "waiting": self.waiting,
            "heartbeat": now_iso(),
            "children": self.delegator.visible(),
        }, fsync=False)

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(self.interval):
            self.beat()

    # -- providers --------------------------------------------------------------------------------

    def _resolve_auto(self) -> ProviderConfig | None:
        # Probing local ports costs up to a few seconds; remember the answer for a while (a server
        # started later is found within seconds, a busy one's model learnt, without a restart).
        now = time.monotonic()
        if self._auto is None or now - self._auto[0] > keep_auto(self._auto[1]):
            said: list[str] = []
            found = resolve_auto(os.environ, config=self.llm, notes=said)
            if said != self._auto_said:  # which server auto adopted, or passed over, once per change
                self._auto_said = said
                for line in said:
                    say(self.name, f"{line}")
            self._auto = (now, found)
        return self._auto[1]

    def _outage(self, provider: str, event: str, breaker: Breaker) -> None:
        """A provider went down or came back: say it in the events stream (alerts, the dashboard)."""
        until = label(breaker.until) if event == "provider_down" else None
        self.board.append_event(agent_event(now_iso(), self.name, event, breaker.why, provider=provider,
                                            until=until))
        say(self.name, f"provider {provider} " + (f"down until {until} ({breaker.why})" if until else "up again"))

    def chain(self, tier: str) -> list[Provider]:
        configs = chain_for(tier, self.llm, self._resolve_auto, os.environ)
        chain = []
        for config in configs:
            if config.name not in self._providers or self._providers[config.name].config != config:
                self._providers[config.name] = make_provider(config)
            chain.append(self._providers[config.name])
        return chain

    def has_llm(self) -> bool:
        if self.keys.refresh():  # a key was added to (or taken out of) .env: look again
            self._providers.clear()
            self._auto = None
            # A new key may be what an open breaker lacked.
            self.health = ProviderHealth(path=self.workdir / BREAKERS_FILE, on_outage=self._outage)
            self._paused = None
        chain = self.chain(task_tier({}, self.tier))
        self.provider = chain[0].config.name if chain else "offline"
        return bool(chain)

    # -- work -----------------------------------------------------------------------------------

    def _on_step(self, step: int) -> None:
        self.step = step

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

    def gate(self, doc: dict[str, Any] | None) -> BudgetGate | None:
        """The budget gate for a task's calls (None when hermes.yaml sets no budgets)."""
        if self.ledger is None:
            return None
        doc = doc or {}
        return BudgetGate(self.ledger, self.caps, agent=self.name, task=str(doc.get("id") or "-"),
                          task_limit=task_cap(self.caps, doc.get("meta")) if doc else None,
                          prices=self.llm.get("prices") or {})

    def ask_model(self, tier: str, prompt: str, stop: threading.Event | None = None, *, task: str = "-",
                  log: Callable[[Attempt], None] | None = None) -> str:
        """One model call for a tool (a summarize skill, say), on a tier's chain; abandoned (and
        its request aborted) when `stop` is set. Every attempt is logged for `task` in the LLM-call
        log (by `log`, the task loop's, which also counts it against the task's ceilings): a tool's
        spending is spending, never invisible to `usage`."""
        chain = self.chain(tier) or self.chain(task_tier({}, self.tier))
        if not chain:
            raise ToolError(NO_PROVIDER)
        halt = stop or self.stop
        if log is None:  # a task's steps: no loop to count it, the log has it all the same
            log = functools.partial(self._log_tool_call, task)
        try:
            completion = interruptible(lambda: complete_with_fallback(
                chain, [{"role": "user", "content": prompt}], None, stop=halt, health=self.health, log=log,
                budget=self.gate(self.current if task != "-" else None)), halt,
                on_stop=lambda: abort(chain))
        except ProviderError as exc:
            raise ToolError(str(exc)) from None
        return completion.message.get("content") or ""

    def _log_tool_call(self, task: str, attempt: Attempt) -> None:
        journal = Journal(self.workdir / "llm_calls.jsonl")
        try:
            journal.append(llm_record(task, attempt, self.llm.get("prices") or {}))
        finally:
            journal.close()

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

    def think(self, doc: dict[str, Any], toolbox: Toolbox, halt: threading.Event) -> None:
        """Work a task with the LLM loop and close it by its outcome."""
        task_id, token = doc["id"], doc["claim"]["token"]
        chain = self.chain(task_tier(doc, self.tier))
        gate = self.gate(doc)
        complete: Callable[..., Any] = functools.partial(complete_with_fallback, health=self.health, budget=gate)
        policy = cascade_policy(self.llm)
        if policy is not None and cascades(doc, self.tier):  # routing: {strategy: cascade} in hermes.yaml
            cascade = Cascade(self.chain(policy.cheap), self.chain(policy.premium), policy, complete)
            chain, complete = cascade.chain, cascade
        extra = prompt_block(self.skills.catalog()) if toolbox.get("skill_view") and toolbox.allowed(
            toolbox.get("skill_view")) else ""
        # The same for every task of the agent: in the system prompt, where a prefix cache keeps it.
        ctx = self.context(doc, halt)
        # The same for every task of the agent (a prefix cache keeps it), but for a worktree's path.
        extra = "\n\n".join(part for part in (extra, describe(grants_of(ctx.settings))) if part)
        loop = TaskLoop(task=doc, chain=chain, workdir=self.workdir, ctx=ctx, toolbox=toolbox,
                        identity=str(self.config.get("identity") or ""), prompt_extra=extra,
                        prices=self.llm.get("prices") or {},
                        max_iterations=int(self.config.get("max_iterations") or 60),
                        max_tokens=self.config.get("max_tokens"), max_cost=self.config.get("max_cost"),
                        summarizer=self.chain("cheap") or chain, on_step=self._on_step, agent=self.name,
                        inputs=self.inputs(doc), complete=complete,
                        tool_use=self._tool_use, offer_tools=str(self.config.get("offer_tools") or "task"),
                        journal=self.board.task_journal(task_id, token, self.name,
                                                                                 self.workdir))
        try:
            outcome = loop.run()
        except InterruptedError:
            self._interrupted(task_id, token)
            return
        for note in loop.notes:
            say(self.name, f"{note}")
        for warning in outcome.warnings:  # before the close: a person reading the result sees it
            with contextlib.suppress(BoardError):
                self.board.comment(task_id, warning, by=self.name)
        if outcome.kind == "waiting":
            self._wait_for_provider(task_id, token, outcome.text, outcome.retry_at)
            return
        if outcome.kind == "budget" and outcome.budget is not None and gate is not None:
            self._budget_reached(task_id, token, gate, outcome.budget)
            return
        self._close(task_id, token, outcome.kind, {"answer": outcome.text}, outcome.text, outcome.question)

    def _close(self, task_id: str, token: int, kind: str, result: dict[str, Any], reason: str,
               question: str | None = None, permanent: bool = False) -> None:
        """Close a worked task by its outcome: done with `result`, else blocked or failed for `reason`;
        blocked on a `question` until a person answers it."""
        self.telemetry.outcome(kind)
        try:
            if kind == "done":
                self._commit_trees(task_id)
                self.board.complete(task_id, token, result)
                say(self.name, f"done {task_id}")
            elif kind == "blocked" and question is not None:
                self.board.block(task_id, token, f"question: {question} (answer it with `hermes-sup task answer "
                                                 f"{task_id} TEXT`)", question=question)
                say(self.name, f"blocked {task_id}: question: {short(question)}")
            elif kind == "blocked":
                self.board.block(task_id, token, reason)
                say(self.name, f"blocked {task_id}: {short(reason)}")
            else:
                self.board.fail(task_id, token, reason, permanent=permanent)
                say(self.name, f"failed {task_id}: {short(reason)}")
        except ClaimLost as exc:
            say(self.name, f"lost task {task_id}: {exc}", error=True)

    def _wait_for_provider(self, task_id: str, token: int, reason: str, retry_at: float | None) -> None:
        """Every provider refused its connection: the task goes back to todo with its attempt (a
        server that is not there is not the task's fault), and LLM tasks wait, saying why, until the
        first provider may be tried again."""
        self._paused = (retry_at if retry_at is not None else time.time() + OFFLINE_RECHECK, reason)
        with contextlib.suppress(ClaimLost):
            self.board.release(task_id, token, f"released: {reason}")
            say(self.name, f"released {task_id}: {short(reason)}; it goes back to todo")

    def _budget_reached(self, task_id: str, token: int, gate: BudgetGate, reached: BudgetReached) -> None:
        """A call would have crossed a cap. Its task's own ceiling blocks it for a person (no other
        agent could do better); a team or agent cap gives it back to todo, its attempt not spent, and
        LLM tasks wait, saying why, until the next UTC day, room freed, or `reload` raising the cap."""
        refusal: Refusal = reached.refusal
        with contextlib.suppress(Exception):  # the event is news; the task's way back to todo comes first
            if gate.announce(refusal):
                self.board.append_event(agent_event(now_iso(), self.name, "budget_reached", refusal.text(),
                                                    until=label(refusal.until) if refusal.until is not None else None))
        if refusal.scope.startswith("task "):
            self._close(task_id, token, "blocked", {}, f"{refusal.text()} (raise it in hermes.yaml budgets.tasks or "
                                                      "the task's meta.max_cost, then `hermes-sup task retry`)")
            return
        self._budget_wait = (self.gate(None) or gate, reached.worst)
        with contextlib.suppress(ClaimLost):
            self.board.release(task_id, token, f"released: {refusal.text()}")
            say(self.name, f"released {task_id}: {short(refusal.text())}; it goes back to todo")

    def _waiting_reason(self) -> tuple[str, float] | None:
        """Why LLM tasks are left in todo now, and for how long at most, or None when they are not."""
        if not self.has_llm():
            return NO_PROVIDER, OFFLINE_RECHECK
        if self._paused is not None:
            until, reason = self._paused
            left = until - time.time()
            if left > 0:
                return reason, min(left, OFFLINE_RECHECK)  # .env is looked at again meanwhile
            self._paused = None
        return self._budget_waiting()

    def _budget_waiting(self) -> tuple[str, float] | None:
        """Why tasks wait for a budget cap now (every runtime's: a CLI's runs are spend too), or None."""
        if self._budget_wait is not None:
            gate, worst = self._budget_wait
            try:
                refusal = gate.blocked(worst)
            except Exception as exc:  # a ledger database gone: still waiting, and saying why
                return f"{BUDGET_UNKNOWN} ({short(str(exc))})", OFFLINE_RECHECK
            if refusal is not None:
                return refusal.text(), OFFLINE_RECHECK
            self._budget_wait = None
        return None

    def _interrupted(self, task_id: str, token: int) -> None:
        """Work on a task stopped part-way: by our own stop (the task is given back, the attempt not
        counted: stopping is not the task's fault), or because the task was taken from us (cancelled,
        moved by hand), when it is no longer ours to write."""
        self.delegator.stop_all()
        if self.stop.is_set():
            with contextlib.suppress(ClaimLost):
                self.board.release(task_id, token, f"released: {self.name} is stopping ({self.why_stopping})")
                say(self.name, f"released {task_id}: stopping ({short(self.why_stopping)})")
                return
        why = self._claim_lost(task_id, token) or "its claim was lost"
        say(self.name, f"stopped work on {task_id}: {short(why)}")
        try:
            doc = self.board.get(task_id)
        except BoardError:
            return
        if doc["status"] == "cancelled":
            by = (doc["history"][-1] if doc["history"] else {}).get("by") or "someone"
            say(self.name, f"cancelled {task_id} (by {short(by)})")
            for sub in self.delegator.cancel_subtasks(task_id, f"its parent task {task_id} was cancelled (by {by})"):
                say(self.name, f"cancelled {sub}, a subtask of {task_id}")

    def _claim_lost(self, task_id: str, token: int) -> str | None:
        try:
            return claim_gone(self.board.get(task_id), token)
        except TaskNotFound:
            return claim_gone(None, token)
        except BoardError:
            return None  # a damaged file is not a cancel: look again

    def _watch_claim(self, task_id: str, token: int, halt: threading.Event, finished: threading.Event) -> None:
        """Set `halt` once the task is no longer ours, so that no further step, tool call or model
        call is made for it."""
        looks = 0
        while not finished.wait(CLAIM_CHECK) and not halt.is_set():
            looks = looks + 1 if self._claim_lost(task_id, token) else 0
            if looks >= CLAIM_LOOKS:
                halt.set()

    def work(self, doc: dict[str, Any]) -> None:
        task_id, token = doc["id"], doc["claim"]["token"]
        halt, finished = threading.Event(), threading.Event()
        with self._lock:
            self._halt = halt
        if self.stop.is_set():
            halt.set()
        threading.Thread(target=self._watch_claim, args=(task_id, token, halt, finished), name="claim",
                         daemon=True).start()
        try:
            self._trees(doc)
            self._work(doc, halt)
        except worktrees.WorktreeError as exc:
            self._close(task_id, token, "failed", {}, f"its worktree could not be made: {exc}")
        except (InterruptedError, ClaimLost):  # ClaimLost: a fenced journal write found the task gone
            self._interrupted(task_id, token)
        except Exception as exc:
            # A bug, or a task whose input trips one, must not take the agent down: a crash would
            # cost the task an attempt all the same, then restart the agent for each attempt.
            traceback.print_exc()
            self._close(task_id, token, "failed", {}, f"the agent could not work this task: "
                                                      f"{type(exc).__name__}: {exc}")
        finally:
            finished.set()
            # The task is over: what its tools left running (a background terminal command) ends
            # with it, not with the agent, which goes on to tasks of other rights.
            halt.set()
            with self._lock:
                self._halt = None

    def _work(self, doc: dict[str, Any], halt: threading.Event) -> None:
        runtime = self.config.get("runtime")
        if not doc.get("steps") and runtime:  # runtime: command or hermes (agents/clirun.py, hermesrun.py)
            prompt = task_prompt(doc, self.inputs(doc))
            if runtime.get("kind") == "hermes":
                gate = self.gate(doc)
                try:
                    hold = gate.open_run() if gate is not None else None
                except BudgetReached as reached:
                    assert gate is not None
                    self._budget_reached(doc["id"], doc["claim"]["token"], gate, reached)
                    return
                outcome = hermesrun.work(self.context(doc, halt), prompt, self.capabilities,
                                         prices=self.llm.get("prices") or {})
                if gate is not None and hold is not None:
                    spent = (outcome.usage or {}).get("cost_usd")
                    gate.settle_amount(hold, float(spent) if isinstance(spent, (int, float)) else 0.0)
                verdict = self._hermes(doc, outcome)
            else:
                verdict = clirun.work(self.context(doc, halt), prompt, self.capabilities)
            if verdict.kind == "interrupted":
                raise InterruptedError
            question = verdict.reason if verdict.kind == "blocked" else None
            self._close(doc["id"], doc["claim"]["token"], verdict.kind, verdict.result, verdict.reason, question)
            return
        if not doc.get("steps"):
            self.think(doc, self.toolbox(), halt)
            return
        toolbox = self.toolbox(*step_grants(self.capabilities, doc))  # the rights of whoever wrote them
        task_id, token = doc["id"], doc["claim"]["token"]
        ctx = self.context(doc, halt, toolbox.grants)
        folders = self._folders(step_folders(self.config.get("folders") or {}, doc), doc)
        ctx = dataclasses.replace(ctx, settings={**ctx.settings, "folders": folders})
        run = StepRun(task=doc, workdir=self.workdir, ctx=ctx, toolbox=toolbox,
                      agent=self.name, on_step=self._on_step,
                      journal=self.board.task_journal(task_id, token, self.name, self.workdir))
        try:
            outcome = run.run()
        except InterruptedError:
            self._interrupted(task_id, token)
            return
        self._close(task_id, token, outcome.kind, {"steps": outcome.results}, outcome.reason, outcome.question,
                    outcome.permanent)

    def _hermes(self, doc: dict[str, Any], outcome: hermesrun.Outcome) -> clirun.Verdict:
        """A Hermes run's comments onto the task and its usage into the LLM-call log; its verdict."""
        for text in outcome.comments:
            with contextlib.suppress(BoardError):
                self.board.comment(doc["id"], text, by=self.name)
        if outcome.usage is not None:
            journal = Journal(self.workdir / "llm_calls.jsonl")
            try:
                journal.append(outcome.usage)
            finally:
                journal.close()
        return outcome.verdict

    def _only_task_closed(self) -> bool:
        try:
            return self.board.get(str(self.only_task))["status"] not in ("todo", "doing")
        except BoardError:
            return True

    def _watch_signals(self) -> None:
        # A signal handler must not take locks (Event.set does): it only writes the signal
        # number to a pipe, and this thread turns it into a stop request.
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: None)

        def wait_for_signal() -> None:
            while True:
                data = os.read(read_end, 16)
                if data:
                    self.request_stop(signal.Signals(data[-1]).name)

        threading.Thread(target=wait_for_signal, name="signals", daemon=True).start()

    def _commands(self) -> str:
        """How the terminal runs commands here, for the first line of the log (agents/sandbox.py)."""
        runtime = self.config.get("runtime") or {}
        if "shell" not in self.capabilities and not runtime:
            return ""
        cli = ""
        if runtime.get("kind") == "hermes":
            cli = f"; runtime: hermes (profile {runtime.get('profile')}, {runtime.get('profile_dir')})"
        elif runtime:
            cli = f"; runtime: command ({os.path.basename(str(runtime['argv'][0]))})"
        try:
            kind, gaps = sandbox.how(str(self.config.get("sandbox") or "auto"))
        except sandbox.SandboxRefused as exc:
            return f"{cli}; commands: none can run: {exc}"
        return f"{cli}; commands: {kind}" + (f": {gaps}" if gaps else "")

    def run(self) -> int:
        self._watch_signals()
        if self.parent_pid is not None:
            watch_parent(self.parent_pid, self.request_stop)
        self.notifier.send(READY=1)
        self.has_llm()  # names the provider in state.json from the first write on
        self.write_state("idle")
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        say(self.name, f"ready (pid {os.getpid()}, roles {', '.join(self.roles) or '-'}{self._commands()})")
        self._start_mcp()
        while not self.stop.is_set():
            if self.only_task is not None and self._only_task_closed():
                self.request_stop(f"its task {self.only_task} is closed")
                break
            # Without an LLM provider (none configured, or every one refusing connections) only
            # tasks with steps can be done; the others wait in todo, saying why, until one is there.
            # A CLI needs no provider of ours, but its runs are spend under budgets too.
            waiting = self._budget_waiting() if self.config.get("runtime") else self._waiting_reason()
            if self.waiting != (waiting[0] if waiting else ""):  # said in state.json at once: see kanban/why.py
                self.waiting = waiting[0] if waiting else ""
                self.write_state("idle")
            # Only on the tasks this agent could take: a task no agent has the role for, or one whose
            # dependencies are not done, does not wait for this agent's provider.
            self.board.mark_waiting(waiting[0] if waiting else None, agent=self.name, roles=self.roles)
            doc = self.board.wait_for_work(self.name, roles=self.roles, stop=self.stop, steps_only=waiting is not None,
                                           timeout=waiting[1] if waiting else 60,
                                           assigned_only=self.only_task is not None)
            if doc is None:
                continue
            with self._lock:
                self.current = doc
            self.notifier.send(TASK=doc["id"])  # at once, not at the next heartbeat
            say(self.name, f"claimed {doc['id']} ({short(doc['title'])})")
            try:
                with self.telemetry.task_span(doc):
                    self.work(doc)
            finally:
                with self._lock:
                    self.current = None
                self.notifier.send(TASK="-")
            self.write_state("idle")
            self.rotate_log()
        self.write_state("stopped")
        self.notifier.send(STOPPING=1)
        say(self.name, f"stopped ({self.why_stopping})")
        self.mcp.close()
        if self.ledger is not None:
            self.ledger.close()
        self.board.close()
        self.telemetry.close()
        return ORPHANED if self.orphaned else 0


def main() -> int:
    raw = os.environ.get(AGENT_ENV)
    workspace = os.environ.get(WORKSPACE_ENV)
    if not raw or not workspace:
        print(f"agents: started outside a supervisor ({AGENT_ENV} and {WORKSPACE_ENV} are not set); "
              "run `hermes-sup up` instead", file=sys.stderr)
        return 2
    return Agent(json.loads(raw), Path(workspace), Path.cwd()).run()
