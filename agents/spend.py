"""What a task's model calls cost: their records in the LLM-call log, and the ceilings that bound them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..kanban.journal import TaskJournal
from ..kanban.task import now_iso
from .budget import is_amount, logged_count, price
from .fallback import Attempt
from .providers import Provider


@dataclass
class Spend:
    """What a task's model calls have used, against its ceilings (None: no ceiling). It counts what
    earlier attempts at the task spent, this agent's and other agents': a ceiling holds across
    restarts and reclaims."""
    max_tokens: int | None = None
    max_cost: float | None = None
    tokens: int = 0
    cost: float = 0.0

    def count_before(self, journal: TaskJournal, others: Iterable[str], task_id: str) -> None:
        for record in journal.llm_calls(others):
            if record.get("task") == task_id:
                self.tokens += logged_count(record.get("tokens_in")) + logged_count(record.get("tokens_out"))
                self.cost += _cost(record.get("cost_usd"))

    def add(self, record: dict[str, Any]) -> None:
        """Count a record of the LLM-call log (llm_record's)."""
        self.tokens += record["tokens_in"] + record["tokens_out"]
        self.cost += record["cost_usd"] or 0.0

    def over_ceiling(self) -> str | None:
        if self.max_tokens is not None and self.tokens > self.max_tokens:
            return f"token ceiling: {self.tokens:,} tokens used, the limit is {self.max_tokens:,} (max_tokens)"
        if self.max_cost is not None and self.cost > self.max_cost:
            return f"cost ceiling: {_dollars(self.cost)} spent, the limit is {_dollars(self.max_cost)} (max_cost)"
        return None


def llm_record(task_id: str, attempt: Attempt, prices: dict[str, Any]) -> dict[str, Any]:
    """One model call as the LLM-call log keeps it (pure)."""
    usage = attempt.completion.usage if attempt.completion else None
    model = (attempt.completion.model if attempt.completion and attempt.completion.model else attempt.model)
    return {"at": now_iso(), "task": task_id, "provider": attempt.provider, "model": model,
            "outcome": attempt.outcome, "latency_s": round(attempt.latency, 3), "error": attempt.error or None,
            "tokens_in": usage.input if usage else 0, "tokens_out": usage.output if usage else 0,
            "tokens_cached": usage.cached if usage else 0, "cost_usd": price(prices, model, usage) if usage else 0.0,
            **({"estimated": True} if usage and usage.estimated else {}),
            **({"route": attempt.route} if attempt.route else {})}


def started_record(task_id: str, call_id: str, chain: list[Provider], prompt_estimate: int) -> dict[str, Any]:
    """The LLM-call log's record of a call about to be made (pure); its outcome records carry the
    same `call`. No token fields: a reader that does not pair them counts it as nothing spent."""
    first = chain[0].config if chain else None
    return {"at": now_iso(), "task": task_id, "call": call_id, "outcome": "started",
            "provider": first.name if first else "-", "model": first.model if first else "-",
            "prompt_estimate": prompt_estimate}


def _dollars(amount: float) -> str:
    """$0.00011 rather than $0.0001: small amounts keep their significant digits."""
    return "$" + (f"{amount:.6f}".rstrip("0").rstrip(".") or "0")


def _cost(value: Any) -> float:
    """A cost as logged; 0.0 for anything but a finite amount of at least 0 (see logged_count)."""
    return float(value) if is_amount(value) else 0.0
