"""`delegate_task`: a subtask worked by a child agent in a process of its own, durably.

The child's work is a task on the board, assigned to the child, linked to the parent's task
(`meta.parent`), with an id derived from the parent's task and the delegation itself: a parent that
crashes and runs the call again finds the same task, and takes its result if it is done, or starts
a child for it again (the child resumes from its own transcript) if it is not. The child runs as
`python -m hermes_sup.agents run` in `runs/<parent>/children/<child>/`, in its own process group within the
parent's session (the supervisor kills the session's groups with the parent), with a narrower
toolset, the delegation tier, one more level of depth, and leaves once its task is closed, or at once
when its parent is gone. A child that dies before closing its task fails it and the parent gets an
error result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..kanban.liveness import start_time
from ..kanban.task import TERMINAL
from .launchenv import AGENT_ENV, WORKSPACE_ENV
from .notify import NOTIFY_ENV
from .offer import DELEGATING
from .telemetry import trace_meta
from .tools import Tool, ToolContext, ToolError, register

# Subtasks one delegate_task call may hand out: each is a task on the board and a child process, and
# a hostile or confused model must not fan out thousands with one call.
MAX_BATCH = 16


@dataclass(frozen=True)
class Limits:
    max_depth: int = 2
    max_concurrent: int = 3
    tier: str = "cheap"
    timeout: float = 1800.0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Limits:
        raw = config.get("delegation") or {}
        return cls(int(raw.get("max_depth", 2)), int(raw.get("max_concurrent", 3)), str(raw.get("tier", "cheap")),
                   float(raw.get("timeout", 1800.0)))


def child_ids(parent_task: str, agent: str, args: dict[str, Any]) -> tuple[str, str]:
    """(the child's task id, the child agent's name) for a delegation (pure, deterministic)."""
    key = json.dumps([parent_task, args.get("goal"), args.get("context"), args.get("toolsets")], sort_keys=True)
    short = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{parent_task[:50]}-sub-{short}", f"{agent}.sub-{short}"


def not_ours(doc: dict[str, Any], parent_task: str, agent: str) -> str | None:
    """Why a task found under a delegation's id is not that delegation's own, or None (pure).

    The id is derived from what anyone reading the board can see (a task's steps name the goal), so
    a teammate could put a task of its own there first (kanban_create takes any id): the child,
    which runs with the delegating agent's rights, would then work that teammate's instructions,
    and the delegating agent take that teammate's result for its subtask's. Only a task this agent
    made for this parent task is taken up again; the board tool cannot forge `meta`."""
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    history = doc.get("history") if isinstance(doc.get("history"), list) else []
    maker = history[0].get("by") if history and isinstance(history[0], dict) else None
    if meta.get("parent") != {"task": parent_task, "agent": agent} or maker != agent:
        return f"{maker or 'someone else'} made, not this delegation"
    return None


def child_config(parent: dict[str, Any], name: str, task_id: str, limits: Limits,
                 toolsets: list[str] | None, grants: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The child agent's config: the parent's, narrowed (pure). `grants` are the capabilities the
    delegating call runs with (a task's steps may have fewer than the parent agent): the child gets
    no more than those."""
    depth = int(parent.get("depth", 0)) + 1
    grants = [c for c in parent.get("capabilities") or ("fs.read", "fs.write", "memory", "kanban")
              if (c != "delegate" or depth < limits.max_depth) and (grants is None or c in grants)]
    narrowed = toolsets if parent.get("toolsets") is None else [t for t in (toolsets or parent["toolsets"])
                                                                if t in parent["toolsets"]]
    return {**{k: v for k, v in parent.items() if k not in ("count", "roles", "env", "command")},
            "name": name, "roles": [], "tier": limits.tier, "capabilities": grants, "toolsets": narrowed,
            "depth": depth, "only_task": task_id, "parent_pid": os.getpid(),
            # Tools the delegating model named are what it wants the helper to use: all offered.
            **({"offer_tools": "all"} if toolsets else {}),
            "identity": f"You are a helper working one subtask for {parent['name']}; answer with its result."}


def open_subtasks(tasks: Iterable[dict[str, Any]], parent_task: str) -> list[str]:
    """The ids of a task's subtasks not yet closed, and of theirs, parents first (pure)."""
    by_parent: dict[str, list[dict[str, Any]]] = {}
    for doc in tasks:
        parent = ((doc.get("meta") or {}).get("parent") or {})
        if isinstance(parent, dict) and isinstance(parent.get("task"), str):
            by_parent.setdefault(parent["task"], []).append(doc)
    found, seen, queue = [], {parent_task}, [parent_task]
    while queue:
        for doc in by_parent.get(queue.pop(0), ()):
            if doc["id"] in seen:
                continue  # a hand-made loop of parents
            seen.add(doc["id"])
            queue.append(doc["id"])  # a closed subtask may still have open ones of its own
            if doc["status"] not in TERMINAL:
                found.append(doc["id"])
    return found


def watch_parent(parent_pid: int, on_gone: Callable[[str], None]) -> None:
    """Call `on_gone` (from a thread) the moment the parent agent exits. A child has nothing to wait for
    without its parent: unlike an agent without its supervisor it is never adopted, and a restarted
    parent starts a child of its own for the same subtask, so this one must not linger (for
    `orphan_grace`) beside it. Independent of any supervisor killing the parent's processes."""
    why = f"its parent agent (pid {parent_pid}) is gone"
    try:
        pidfd = os.pidfd_open(parent_pid)
    except OSError:
        on_gone(why)
        return
    if os.getppid() != parent_pid:  # it died before the pidfd was open (the pid may name another process now)
        os.close(pidfd)
        on_gone(why)
        return

    def wait() -> None:
        with contextlib.suppress(OSError):
            select.select([pidfd], [], [])  # readable once the process has exited
        os.close(pidfd)
        on_gone(why)

    threading.Thread(target=wait, name="parent", daemon=True).start()


@dataclass
class ChildProcess:
    """A child agent this agent started for one delegated task: its process, and when it began."""
    name: str
    task: str
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    pid_started: float | None = None  # its start time: `status` tells it from a process reusing its pid


class Delegator:
    """One agent's delegations: starts children, waits for their tasks, stops them."""

    def __init__(self, *, board: Any, workspace: Path, workdir: Path, config: dict[str, Any]) -> None:
        self.board = board
        self.workspace = workspace
        self.workdir = workdir
        self.config = config
        self.limits = Limits.from_config(config)
        self.slots = threading.BoundedSemaphore(self.limits.max_concurrent)
        self.children: dict[str, ChildProcess] = {}
        self._lock = threading.Lock()

    def visible(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"name": c.name, "pid": c.proc.pid, "pid_started": c.pid_started, "task": c.task}
                    for c in self.children.values() if c.proc.poll() is None]

    def _grants(self, ctx: ToolContext, args: dict[str, Any]) -> list[str]:
        return child_config(self.config, "-", "-", self.limits, args.get("toolsets"), ctx.grants)["capabilities"]

    def ensure_task(self, ctx: ToolContext, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
        from ..kanban import TaskNotFound

        if int(self.config.get("depth", 0)) + 1 > self.limits.max_depth:
            raise ToolError(f"refused: delegation depth limit reached ({self.limits.max_depth})")
        parent_task = (ctx.task or {}).get("id", "adhoc")
        task_id, name = child_ids(parent_task, self.config["name"], args)
        try:
            existing = self.board.get(task_id)
        except TaskNotFound:
            pass
        else:
            problem = not_ours(existing, parent_task, self.config["name"])
            if problem:
                raise ToolError(f"refused: the subtask's id {task_id} is taken by a task {problem}; "
                                "rephrase the goal to delegate under another id")
            return existing, name
        body = args["goal"] + (f"\n\nContext:\n{args['context']}" if args.get("context") else "")
        doc = self.board.add({"id": task_id, "title": args["goal"].strip().splitlines()[0][:200], "body": body,
                              "assignee": name, "tier": self.limits.tier,
                              "meta": {"parent": {"task": parent_task, "agent": self.config["name"]},
                                       "created_by": self.config["name"],
                                       "capabilities": list(self._grants(ctx, args)), **trace_meta()}},
                             by=self.config["name"])
        return doc, name

    def start(self, ctx: ToolContext, args: dict[str, Any], *, block: bool) -> ChildProcess | None:
        """Start the child for a delegation unless its task is closed or its child runs; with
        `block` False, only when a concurrency slot is free now."""
        doc, name = self.ensure_task(ctx, args)
        with self._lock:
            running = self.children.get(name)
            if running is not None and running.proc.poll() is None:
                return running
        if doc["status"] in TERMINAL:
            return None
        if not self.slots.acquire(blocking=block):
            return None
        folder = self.workdir / "children" / name
        folder.mkdir(parents=True, exist_ok=True)
        config = child_config(self.config, name, doc["id"], self.limits, args.get("toolsets"), ctx.grants)
        config["folders"] = ctx.settings.get("folders") or {}  # what the delegating call may use, no more
        env = {**os.environ, AGENT_ENV: json.dumps(config), WORKSPACE_ENV: str(self.workspace)}
        env.pop(NOTIFY_ENV, None)
        log = open(folder / "agent.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.agents", "run"], cwd=folder, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    process_group=0, close_fds=True)
        except OSError:
            self.slots.release()
            raise
        finally:
            log.close()
        child = ChildProcess(name, doc["id"], proc)
        with contextlib.suppress(OSError):  # out of descriptors: then `status` does not list it
            child.pid_started = start_time(proc.pid)
        with self._lock:
            self.children[name] = child
        return child

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        child = self.start(ctx, args, block=True)
        task_id, _name = child_ids((ctx.task or {}).get("id", "adhoc"), self.config["name"], args)
        try:
            return self._wait(ctx, task_id, child)
        finally:
            if child is not None:
                self._reap(child, stopping=ctx.stop.is_set())

    def _wait(self, ctx: ToolContext, task_id: str, child: ChildProcess | None) -> str:
        deadline = time.monotonic() + self.limits.timeout
        while True:
            doc = self.board.get(task_id)
            if doc["status"] == "done":
                result = doc.get("result")
                return result.get("answer", json.dumps(result)) if isinstance(result, dict) else str(result)
            if doc["status"] in ("failed", "cancelled", "blocked"):
                raise ToolError(f"the subtask {task_id} ended {doc['status']}: {doc.get('error') or 'no reason given'}")
            if ctx.stop.is_set():
                raise InterruptedError
            if child is not None and child.proc.poll() is not None:
                doc = self.board.get(task_id)
                if doc["status"] in TERMINAL or doc["status"] == "blocked":
                    continue
                reason = f"the child agent {child.name} died (exit status {child.proc.returncode}) before finishing"
                with contextlib.suppress(Exception):
                    self.board.move(task_id, "failed", by=self.config["name"], note=reason)
                raise ToolError(reason)
            if child is None and doc["status"] == "todo":
                raise ToolError(f"the subtask {task_id} has no child to work it")
            if time.monotonic() > deadline:
                raise ToolError(f"the subtask {task_id} did not finish within {self.limits.timeout:g} s")
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=0.1)
            else:
                time.sleep(0.1)

    def _reap(self, child: ChildProcess, *, stopping: bool) -> None:
        if child.proc.poll() is None:
            # The child leaves by itself once its task is closed; a stop request ends it now.
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=0 if stopping else 10)
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGTERM)
            try:
                child.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
        with self._lock:
            if self.children.get(child.name) is child:
                del self.children[child.name]
                self.slots.release()

    def stop_all(self) -> None:
        with self._lock:
            children = list(self.children.values())
        for child in children:
            self._reap(child, stopping=True)

    def cancel_subtasks(self, parent_task: str, why: str) -> list[str]:
        """Cancel the open subtasks of a cancelled task (after its children were stopped): each is
        assigned to a child that will never run again, and would wait in todo forever."""
        from ..kanban import BoardError

        cancelled = []
        for task_id in open_subtasks(self.board.list().tasks, parent_task):
            try:
                self.board.move(task_id, "cancelled", by=self.config["name"], note=why)
            except BoardError:
                continue  # closed meanwhile
            cancelled.append(task_id)
        return cancelled


def _delegator(ctx: ToolContext) -> Delegator:
    delegator = ctx.services.get("delegation")
    if delegator is None:
        raise ToolError("delegation is not available here")
    return delegator


def batch(args: dict[str, Any]) -> list[dict[str, Any]]:
    """The delegations of one call (pure): its goal, or Hermes Agent's `tasks`, each with its own
    context (else the call's) and the call's toolsets. Hermes' `role` and `background` have no
    counterpart: depth is bounded by `delegation.max_depth`, and a batch's children work in parallel."""
    if args.get("tasks"):
        if not isinstance(args["tasks"], list) or len(args["tasks"]) > MAX_BATCH:
            count = len(args["tasks"]) if isinstance(args["tasks"], list) else "not a list of"
            raise ToolError(f"delegate_task takes at most {MAX_BATCH} tasks in one call ({count} given): "
                            f"split the work into fewer, larger subtasks, or delegate the rest once these are done")
        items = [{key: value for key, value in {
                     "goal": item.get("goal"), "context": item.get("context") or args.get("context"),
                     "toolsets": item.get("toolsets", args.get("toolsets"))}.items() if value is not None}
                 for item in args["tasks"]]
    elif not args.get("goal"):
        raise ToolError("delegate_task needs goal, or tasks: [{goal, context?}, ...] for a batch")
    else:
        items = [{key: args[key] for key in ("goal", "context", "toolsets") if key in args}]
    if any(not str(item.get("goal") or "").strip() for item in items):
        raise ToolError("each goal must say what to do (a goal of blank lines was given)")
    return items


def delegate_task(ctx: ToolContext, args: dict[str, Any]) -> str:
    items = batch(args)
    if len(items) == 1 and not args.get("tasks"):
        return _delegator(ctx).run(ctx, items[0])
    for item in items:  # all started first, as far as slots allow, so they work in parallel
        start_early(ctx, item)
    results, failed = [], 0
    for number, item in enumerate(items, 1):
        try:
            answer = _delegator(ctx).run(ctx, item)
        except ToolError as exc:
            failed += 1
            answer = f"error: {exc}"
        results.append(f"## {number}. {item['goal'].strip().splitlines()[0][:200]}\n{answer}")
    if failed == len(items):
        raise ToolError("every subtask failed:\n\n" + "\n\n".join(results))
    return "\n\n".join(results)


def start_early(ctx: ToolContext, args: dict[str, Any]) -> None:
    """Before the calls of a turn run one by one: start this delegation's children if slots are
    free, so several delegations of one turn work in parallel."""
    with contextlib.suppress(ToolError):
        for item in batch(args):
            _delegator(ctx).start(ctx, item, block=False)


register(Tool("delegate_task", "Hand a self-contained subtask to a helper agent and get its final answer. Several "
              "delegate_task calls in one turn run in parallel.", delegate_task,
              {"type": "object", "properties": {
                  "goal": {"type": "string", "minLength": 1, "description": "what the helper must do"},
                  "context": {"type": "string", "description": "what it needs to know"},
                  "toolsets": {"type": "array", "items": {"type": "string"},
                               "description": "narrow its tools, e.g. [files]"},
                  "tasks": {"type": "array", "items": {"type": "object", "properties": {
                      "goal": {"type": "string", "minLength": 1}, "context": {"type": "string"},
                      "toolsets": {"type": "array", "items": {"type": "string"}}},
                      "required": ["goal"]}, "maxItems": MAX_BATCH,
                      "description": "instead of goal, a batch worked in parallel: [{goal, context?}]"}},
                  "additionalProperties": False},
              capabilities=("delegate",), idempotent=True, toolset="delegation", prepare=start_early, cues=DELEGATING,
              hidden={"role": {"type": "string", "enum": ["leaf", "orchestrator"]}, "background": {"type": "boolean"}}))
