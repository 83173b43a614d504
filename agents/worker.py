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
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..kanban import BoardError, ClaimLost, TaskNotFound
from ..kanban.backends import open_board
from ..kanban.journal import Journal
from . import (
    builtins,  # noqa: F401 - registers the built-in tools
    clirun,
    hermesrun,
    hermestools,
    keeper,
    mcpservers,
    sandbox,
    worktrees,
)
from .budget import caps_from
from .cascade import Cascade, cascade_policy, cascades
from .claimwatch import ClaimWatch
from .delegation import Delegator, watch_parent
from .fallback import complete_with_fallback
from .grants import describe, grants_of
from .health import BREAKERS_FILE, ProviderHealth
from .keys import ENV_FILE, KeyFile, key_names
from .launchenv import AGENT_ENV, SUPERVISOR_ENV, WORKSPACE_ENV
from .ledger import BudgetGate, BudgetReached, Ledger, open_ledger
from .liveness import Liveness
from .logline import say, short
from .loop import Brief, Limits, Models, TaskLoop, Workplace
from .memory import Memories
from .modelaccess import BUDGET_UNKNOWN as BUDGET_UNKNOWN  # re-exported: callers knew these from here
from .modelaccess import NO_PROVIDER as NO_PROVIDER
from .modelaccess import OFFLINE_RECHECK as OFFLINE_RECHECK
from .modelaccess import ModelAccess
from .notify import NOTIFY_ENV, ORPHANED, Notifier
from .prompts import task_prompt
from .providers import Provider, ProviderConfig
from .routing import task_tier
from .skills import Skills, prompt_block
from .steps import StepRun, step_folders, step_grants
from .tasksetting import TaskSetting
from .telemetry import Telemetry, install
from .tools import DEFAULT_CAPABILITIES, Toolbox
from .tooluse import ToolUse

# How often the holder of a task looks whether it still holds it (a cancel, a move by hand, a
# reclaim), and how many looks in a row must say no: work stops within CLAIM_CHECK * CLAIM_LOOKS,
# plus the moment a tool or a model call takes to notice.
CLAIM_CHECK = 0.15
CLAIM_LOOKS = 2
# Seconds between two marks of the tasks waiting for this agent's provider with the same note
# (Agent.run). A task that arrives within it before a claim goes unnoted until that task is done,
# as one arriving between a mark and its claim always did: kept short, for a long task after it.
MARK_EVERY = 0.2


def mark_due(reason: str | None, marked: tuple[str | None, float], now: float, timeout: float) -> tuple[bool, float]:
    """Whether the tasks waiting for this agent's provider are to be marked with `reason` now, given
    the note `marked` last and when (a new note at once, the same one again after MARK_EVERY), and
    the timeout of the wait that follows: short enough to mark again in time (pure)."""
    since = now - marked[1]
    if reason != marked[0] or since >= MARK_EVERY:
        return True, timeout
    return False, min(timeout, MARK_EVERY - since)


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


class Agent(Liveness, ModelAccess, TaskSetting):
    """One agent process: the state its parts share, and the loop that claims a task, works it and
    closes it."""

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
        self.heartbeat_timeout = float(config.get("heartbeat_timeout", 60.0))
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
        if self.parent_pid is None:  # an agent of the supervisor's, not a delegated child
            self.board.hand_over_watch(self.notifier.hold)
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
        self._said: dict[str, object] | None = None  # what state.json said last, its heartbeat aside
        self.provider = "offline"
        self.waiting: str | None = None  # why it leaves LLM tasks in todo ("" when it does not; None: not yet known)
        self._marked: tuple[str | None, float] = ("", -MARK_EVERY)  # the last note mark_waiting wrote, and when
        self.why_stopping = ""
        self.current: dict[str, Any] | None = None
        self._halt: threading.Event | None = None  # the current task's stop: ours, or the task taken away
        self.claim_watch = ClaimWatch(self._claim_lost, lambda: CLAIM_CHECK, CLAIM_LOOKS)
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

    # -- work -----------------------------------------------------------------------------------

    def _on_step(self, step: int) -> None:
        self.step = step

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
        models = Models(chain, complete, summarizer=self.chain("cheap") or chain)
        brief = Brief(str(self.config.get("identity") or ""), extra, self.inputs(doc),
                      str(self.config.get("offer_tools") or "task"))
        journal = self.board.task_journal(task_id, token, self.name, self.workdir)
        place = Workplace(self.workdir, self.name, journal, on_step=self._on_step, tool_use=self._tool_use)
        limits = Limits(int(self.config.get("max_iterations") or 60), self.config.get("max_tokens"),
                        self.config.get("max_cost"), self.llm.get("prices") or {})
        loop = TaskLoop(doc, ctx, toolbox, models, place, brief=brief, limits=limits)
        try:
            outcome = loop.run()
        except InterruptedError:
            self._interrupted(task_id, token)
            return
        finally:
            journal.close()  # its logs' descriptors, kept open while the task is worked: one a task leaked
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

    def work(self, doc: dict[str, Any]) -> None:
        task_id, token = doc["id"], doc["claim"]["token"]
        halt = threading.Event()
        with self._lock:
            self._halt = halt
        if self.stop.is_set():
            halt.set()
        try:
            with self.claim_watch.watching(task_id, token, halt):
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
        journal = self.board.task_journal(task_id, token, self.name, self.workdir)
        run = StepRun(task=doc, workdir=self.workdir, ctx=ctx, toolbox=toolbox,
                      agent=self.name, on_step=self._on_step, journal=journal)
        try:
            outcome = run.run()
        except InterruptedError:
            self._interrupted(task_id, token)
            return
        finally:
            journal.close()
        self._close(task_id, token, outcome.kind, {"steps": outcome.results}, outcome.reason, outcome.question,
                    outcome.permanent)

    def _hermes(self, doc: dict[str, Any], outcome: hermesrun.HermesRunResult) -> clirun.Verdict:
        """A Hermes run's comments onto the task, its usage into the LLM-call log and a span; its verdict."""
        for text in outcome.comments:
            with contextlib.suppress(BoardError):
                self.board.comment(doc["id"], text, by=self.name)
        if outcome.usage is not None:
            journal = Journal(self.workdir / "llm_calls.jsonl")
            try:
                journal.append(outcome.usage)
            finally:
                journal.close()
            # What hermes-sup learns of the run's model calls is this one record: one span, so marked.
            self.telemetry.model_call(outcome.usage, None)
        if self.telemetry.enabled and outcome.profile_dir is not None and outcome.window is not None:
            self._hermes_tools(doc, outcome.profile_dir, outcome.session, outcome.window)
        return outcome.verdict

    def _hermes_tools(self, doc: dict[str, Any], profile_dir: Path, session: Any,
                      window: tuple[float, float]) -> None:
        """A span per tool call of the Hermes run, read from its session store; what kept them from
        being read is said once, and the task goes on."""
        try:
            calls, problem = hermestools.read(profile_dir, session, *window, content=self.telemetry.content)
        except Exception as exc:  # telemetry is a bystander: a store we did not foresee costs spans, not the task
            calls, problem = [], f"{type(exc).__name__}: {exc}"
        if problem:
            say(self.name, f"{doc['id']}: telemetry: the Hermes run's tool calls are not all traced: {problem}")
        for call in calls:
            self.telemetry.tool_call(call.name, call.call_id, call.outcome, call.end - call.start, call.args,
                                     call.result or "", at=(call.start, call.end),
                                     extra={"hermes.runtime": "hermes", "hermes.timing": call.timing})

    def _only_task_closed(self) -> bool:
        try:
            return self.board.get(str(self.only_task))["status"] not in ("todo", "doing")
        except BoardError:
            return True

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
        self._warm_skills()
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
            # dependencies are not done, does not wait for this agent's provider. The same note at
            # most once a MARK_EVERY while tasks keep coming (on PostgreSQL a statement a task: in a
            # drain, once in about 50 tasks), and a wait meanwhile ends in time for it.
            reason = waiting[0] if waiting else None
            due, timeout = mark_due(reason, self._marked, time.monotonic(), waiting[1] if waiting else 60)
            if due:
                self.board.mark_waiting(reason, agent=self.name, roles=self.roles)
                self._marked = (reason, time.monotonic())
            # The supervisor ingests the drops for its agents (supervisor/boardwork.py): one of them
            # ingesting a burst of drops worked nothing meanwhile. Without it (an orphan, a delegated
            # child) the agent does it itself.
            doc = self.board.wait_for_work(self.name, roles=self.roles, stop=self.stop, steps_only=waiting is not None,
                                           timeout=timeout,
                                           assigned_only=self.only_task is not None,
                                           ingest=os.environ.get(SUPERVISOR_ENV) != str(os.getppid()))
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
            self.write_state("idle", if_changed=True)
            self.rotate_log()
        self.write_state("stopped")
        self.notifier.send(STOPPING=1)
        say(self.name, f"stopped ({self.why_stopping})")
        self.mcp.close()
        self.claim_watch.close()
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
    # First, while only stdin, stdout and stderr are open; for an agent the supervisor started only
    # (it kills the keeper with the agent's leftovers; a delegated child's parent would not).
    if os.environ.get(SUPERVISOR_ENV) == str(os.getppid()):
        keeper.start()
    return Agent(json.loads(raw), Path(workspace), Path.cwd()).run()
