"""The agent process: heartbeat, claim a task, work it, close it; stop cleanly on SIGTERM; leave by
itself when no supervisor has heard from it for `orphan_grace` seconds.

A task with `steps` is worked by running them (tool calls, no LLM); any other task by the LLM
loop (agents/loop.py) over the provider chain of its tier. With no provider at all the agent takes
only tasks with steps and leaves the rest in todo, looking for a provider again every few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hermes_sup.kanban import Board, BoardError, ClaimLost
from hermes_sup.kanban.fsio import write_json_atomic
from hermes_sup.kanban.task import now_iso

from . import builtins  # noqa: F401 - registers the built-in tools
from .delegation import Delegator
from .keys import ENV_FILE, KeyFile, key_names
from .loop import TaskLoop
from .memory import MemoryFile
from .notify import NOTIFY_ENV, Notifier
from .providers import Provider, ProviderConfig, ProviderError, complete_with_fallback, make_provider
from .routing import chain_for, resolve_auto, task_tier
from .skills import Skills, prompt_block
from .steps import StepRun
from .tools import DEFAULT_CAPABILITIES, Toolbox, ToolContext, ToolError

AGENT_ENV = "HERMES_SUP_AGENT"
NO_PROVIDER = "no LLM provider available"
# How often an agent without a provider looks again: a stat of .env (a new local server is looked for
# at most once a minute, see _resolve_auto).
OFFLINE_RECHECK = 5.0
WORKSPACE_ENV = "HERMES_SUP_WORKSPACE"


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
        self.board = Board(workspace / "kanban")
        self.skills = Skills(workspace)
        self.delegator = Delegator(board=self.board, workspace=workspace, workdir=workdir, config=config)
        self.notifier = Notifier(os.environ.get(NOTIFY_ENV), self.name)
        self.stop = threading.Event()
        self.tier = str(config.get("tier") or "auto")
        self.llm = config.get("llm") or {}
        self.memory = MemoryFile(workdir / "memory" / "MEMORY.md")
        self._providers: dict[str, Provider] = {}
        self._auto: tuple[float, ProviderConfig | None] | None = None
        self._auto_said: list[str] = []
        self.keys = KeyFile(workspace / ENV_FILE, key_names(self.llm))
        self.step: int | None = None
        self.provider = "offline"
        self.why_stopping = ""
        self.current: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._orphaned_since: float | None = None

    # -- signals and heartbeat --------------------------------------------------------------------

    def request_stop(self, why: str) -> None:
        if not self.stop.is_set():
            self.why_stopping = why
            self.stop.set()
            self.board.wake()

    def beat(self) -> None:
        with self._lock:
            task = self.current
        if self.parent_pid is not None:
            delivered = os.getppid() == self.parent_pid  # a child answers to its parent agent, not the supervisor
        else:
            delivered = self.notifier.send(WATCHDOG=1, TASK=task["id"] if task else "-")
        now = time.monotonic()
        if delivered:
            self._orphaned_since = None
        elif self._orphaned_since is None:
            self._orphaned_since = now
        elif now - self._orphaned_since >= self.orphan_grace:
            self.request_stop(f"no supervisor for {self.orphan_grace:g} s")
        self.write_state("working" if task else "idle")
        self.rotate_log()
        if task is not None:
            # If the task was taken back, the step in flight finds out when it closes the task.
            with contextlib.suppress(ClaimLost):
                self.board.renew(task["id"], task["claim"]["token"])

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
            "step": self.step if task else None, "provider": self.provider, "heartbeat": now_iso(),
            "children": self.delegator.visible(),
        }, fsync=False)

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(self.interval):
            self.beat()

    # -- providers --------------------------------------------------------------------------------

    def _resolve_auto(self) -> ProviderConfig | None:
        # Probing local ports costs up to a second; remember the answer for a while (a server
        # started later is found within a minute, without restarting the team).
        now = time.monotonic()
        if self._auto is None or now - self._auto[0] > 60:
            said: list[str] = []
            found = resolve_auto(os.environ, config=self.llm, notes=said)
            if said != self._auto_said:  # which server auto adopted, or passed over, once per change
                self._auto_said = said
                for line in said:
                    print(f"{self.name}: {line}", flush=True)
            self._auto = (now, found)
        return self._auto[1]

    def chain(self, tier: str) -> list[Provider]:
        configs = chain_for(tier, self.llm, self._resolve_auto, os.environ)
        chain = []
        for config in configs:
            if config.name not in self._providers:
                self._providers[config.name] = make_provider(config)
            chain.append(self._providers[config.name])
        return chain

    def has_llm(self) -> bool:
        if self.keys.refresh():  # a key was added to (or taken out of) .env: look again
            self._providers.clear()
            self._auto = None
        chain = self.chain(task_tier({}, self.tier))
        self.provider = chain[0].config.name if chain else "offline"
        return bool(chain)

    # -- work -----------------------------------------------------------------------------------

    def _on_step(self, step: int) -> None:
        self.step = step

    def toolbox(self) -> Toolbox:
        """This agent's tools for the next task: the built-ins and the skills it enables, looked up
        again for every task so a skill dropped into skills/ is picked up without a restart. An agent
        that may manage skills may use every valid one; others use the ones their config lists."""
        enabled = None if "skills" in self.capabilities else set(self.config.get("skills") or ())
        extra, notes = self.skills.tools_for(enabled)
        for note in notes:
            print(f"{self.name}: {note}", flush=True)
        return Toolbox(grants=self.capabilities, toolsets=self.toolsets, extra=extra)

    def ask_model(self, tier: str, prompt: str) -> str:
        """One model call for a tool (a summarize skill, say), on a tier's chain."""
        chain = self.chain(tier) or self.chain(task_tier({}, self.tier))
        if not chain:
            raise ToolError(NO_PROVIDER)
        try:
            completion = complete_with_fallback(chain, [{"role": "user", "content": prompt}], None)
        except ProviderError as exc:
            raise ToolError(str(exc)) from None
        return completion.message.get("content") or ""

    def context(self, doc: dict[str, Any]) -> ToolContext:
        scratch = self.scratch
        folder = (doc.get("meta") or {}).get("workspace") if isinstance(doc.get("meta"), dict) else None
        settings = dict(self.config)
        if isinstance(folder, str) and folder:
            root = (self.workspace / folder).resolve()
            if root == self.workspace.resolve() or self.workspace.resolve() in root.parents:
                root.mkdir(parents=True, exist_ok=True)
                settings["files_root"] = str(root)
        return ToolContext(scratch=scratch, stop=self.stop, memory=self.memory, board=self.board, agent=self.name,
                           task=doc, llm=self.ask_model, settings=settings,
                           services={"skills": self.skills, "delegation": self.delegator})

    def inputs(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """The tasks this one depends on, for their results."""
        found = []
        for dep in doc.get("depends_on") or []:
            with contextlib.suppress(BoardError):
                found.append(self.board.get(dep))
        return found

    def think(self, doc: dict[str, Any], toolbox: Toolbox) -> None:
        """Work a task with the LLM loop and close it by its outcome."""
        task_id, token = doc["id"], doc["claim"]["token"]
        chain = self.chain(task_tier(doc, self.tier))
        extra = prompt_block(self.skills.catalog()) if toolbox.get("skill_view") and toolbox.allowed(
            toolbox.get("skill_view")) else ""
        loop = TaskLoop(task=doc, chain=chain, workdir=self.workdir, ctx=self.context(doc), toolbox=toolbox,
                        identity=str(self.config.get("identity") or ""), prompt_extra=extra,
                        prices=self.llm.get("prices") or {},
                        max_iterations=int(self.config.get("max_iterations") or 60),
                        max_tokens=self.config.get("max_tokens"), max_cost=self.config.get("max_cost"),
                        context_window=min((p.config.context_window for p in chain), default=128_000),
                        summarizer=self.chain("cheap") or chain, on_step=self._on_step, agent=self.name,
                        inputs=self.inputs(doc))
        try:
            outcome = loop.run()
        except InterruptedError:
            self._give_back(task_id, token)
            return
        for note in loop.notes:
            print(f"{self.name}: {note}", flush=True)
        self._close(task_id, token, outcome.kind, {"answer": outcome.text}, outcome.text)

    def _close(self, task_id: str, token: int, kind: str, result: dict[str, Any], reason: str) -> None:
        """Close a worked task by its outcome: done with `result`, else blocked or failed for `reason`."""
        try:
            if kind == "done":
                self.board.complete(task_id, token, result)
            elif kind == "blocked":
                self.board.block(task_id, token, reason)
            else:
                self.board.fail(task_id, token, reason)
        except ClaimLost as exc:
            print(f"{self.name}: lost task {task_id}: {exc}", file=sys.stderr, flush=True)

    def _give_back(self, task_id: str, token: int) -> None:
        # Stopping is not the task's fault: the attempt is given back.
        self.delegator.stop_all()
        self.board.release(task_id, token, f"released: {self.name} is stopping ({self.why_stopping})")

    def work(self, doc: dict[str, Any]) -> None:
        toolbox = self.toolbox()
        if not doc.get("steps"):
            self.think(doc, toolbox)
            return
        task_id, token = doc["id"], doc["claim"]["token"]
        run = StepRun(task=doc, workdir=self.workdir, ctx=self.context(doc), toolbox=toolbox, agent=self.name,
                      on_step=self._on_step)
        try:
            outcome = run.run()
        except InterruptedError:
            self._give_back(task_id, token)
            return
        self._close(task_id, token, outcome.kind, {"steps": outcome.results}, outcome.reason)

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

    def run(self) -> int:
        self._watch_signals()
        self.notifier.send(READY=1)
        self.has_llm()  # names the provider in state.json from the first write on
        self.write_state("idle")
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        print(f"{self.name}: ready (pid {os.getpid()}, roles {', '.join(self.roles) or '-'})", flush=True)
        while not self.stop.is_set():
            if self.only_task is not None and self._only_task_closed():
                self.request_stop(f"its task {self.only_task} is closed")
                break
            # Without an LLM provider only tasks with steps can be done; the others wait in todo,
            # saying why, until a provider appears.
            offline = not self.has_llm()
            self.board.mark_waiting(NO_PROVIDER if offline else None)
            doc = self.board.wait_for_work(self.name, roles=self.roles, stop=self.stop, steps_only=offline,
                                           timeout=OFFLINE_RECHECK if offline else 60,
                                           assigned_only=self.only_task is not None)
            if doc is None:
                continue
            with self._lock:
                self.current = doc
            self.notifier.send(TASK=doc["id"])  # at once, not at the next heartbeat
            print(f"{self.name}: working on {doc['id']}: {doc['title']}", flush=True)
            try:
                self.work(doc)
            finally:
                with self._lock:
                    self.current = None
                self.notifier.send(TASK="-")
            self.write_state("idle")
            self.rotate_log()
        self.write_state("stopped")
        self.notifier.send(STOPPING=1)
        print(f"{self.name}: stopped ({self.why_stopping})", flush=True)
        self.board.close()
        return 0


def main() -> int:
    raw = os.environ.get(AGENT_ENV)
    workspace = os.environ.get(WORKSPACE_ENV)
    if not raw or not workspace:
        print(f"agents: started outside a supervisor ({AGENT_ENV} and {WORKSPACE_ENV} are not set); "
              "run `hermes-sup up` instead", file=sys.stderr)
        return 2
    return Agent(json.loads(raw), Path(workspace), Path.cwd()).run()
