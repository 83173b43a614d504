"""An agent's way to its models: the provider chain of a tier, the breakers and budgets in front of it,
and why LLM tasks wait when no call may go out."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..kanban import ClaimLost
from ..kanban.events import agent_event
from ..kanban.journal import Journal
from ..kanban.task import now_iso
from ..kanban.why import NO_PROVIDER
from .breaker import Breaker, label
from .budget import Refusal, task_cap
from .fallback import Attempt, complete_with_fallback
from .health import BREAKERS_FILE, ProviderHealth
from .interrupt import interruptible
from .ledger import BudgetGate, BudgetReached
from .logline import say, short
from .providers import Provider, ProviderConfig, ProviderError, abort, make_provider
from .routing import chain_for, keep_auto, resolve_auto, task_tier
from .spend import llm_record
from .tools import ToolError

# How often an agent without a provider looks again: a stat of .env (a new local server is looked for
# at most once a minute, see _resolve_auto).
OFFLINE_RECHECK = 5.0
# Why LLM tasks wait while a cap was reached and the ledger cannot say whether it still is.
BUDGET_UNKNOWN = "budget reached: the budget ledger cannot be read, so LLM tasks wait"


class ModelAccess:
    """The agent's providers, breakers and budget gate (mixed into worker.Agent, whose state it uses)."""

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
