"""Hard budgets (hermes.yaml `budgets:`, whose schema checks it at load): the caps and the pure decision whether
a model call of a given worst-case cost may be reserved against the spend the ledger holds.

Nothing here does I/O: the ledger (agents/ledger.py) hands over its entries, a clock hands over
`now`, and the answer is a Refusal naming the cap and until when, or None.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


def logged_count(value: Any) -> int:
    """A count (tokens, calls) as logged, or 0 for anything that is not one: a damaged or forged record (any
    host on a shared board can write them) must neither lift a ceiling nor crash a reader."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def is_amount(value: Any) -> bool:
    """A money amount as a cap, a hold or a logged cost may be: a finite number of at least 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class Caps:
    """The caps in dollars; None where there is none. `agents` is keyed by the name in hermes.yaml:
    an agent with `count` (worker-1, worker-2) falls under its entry's name, each on its own."""

    team_day: float | None = None
    team_total: float | None = None
    agents: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)
    task_max: float | None = None

    def any(self) -> bool:
        return (self.team_day, self.team_total, self.task_max) != (None, None, None) or bool(self.agents)


def caps_from(budgets: Mapping[str, Any] | None) -> Caps:
    """Caps from a checked `budgets:` mapping (pure)."""
    budgets = budgets or {}
    team = budgets.get("team") or {}
    agents = {str(name): (caps.get("per_day"), caps.get("total"))
              for name, caps in (budgets.get("agents") or {}).items() if isinstance(caps, Mapping)}
    return Caps(team.get("per_day"), team.get("total"), agents, (budgets.get("tasks") or {}).get("max_cost"))


def agent_caps(caps: Caps, agent: str) -> tuple[float | None, float | None]:
    """An agent's (per_day, total): its own name's, or else its entry's (worker for worker-2)."""
    if agent in caps.agents:
        return caps.agents[agent]
    base, dash, index = agent.rpartition("-")
    return caps.agents.get(base, (None, None)) if dash and index.isdigit() else (None, None)


def task_cap(caps: Caps, meta: Any) -> float | None:
    """A task's ceiling: the team's default, lowered (never raised) by its own meta.max_cost."""
    own = meta.get("max_cost") if isinstance(meta, Mapping) else None
    if not is_amount(own):
        return caps.task_max
    return own if caps.task_max is None else min(own, caps.task_max)


@dataclass(frozen=True)
class Entry:
    """One call's spend in the ledger: settled (its real cost) or still reserved (its worst case)."""

    agent: str
    task: str
    day: str  # the UTC day the call was reserved on, YYYY-MM-DD
    amount: float


@dataclass(frozen=True)
class Refusal:
    scope: str  # "team", "agent NAME", "task ID"
    cap: str  # per_day, total, max_cost
    limit: float
    spent: float  # settled and reserved under that cap, before this call
    until: float | None  # epoch seconds of the next UTC midnight for per_day; None: until raised
    period: str  # the UTC day for per_day, "total" otherwise: one budget_reached per cap per period
    worst: float = 0.0  # the refused call's worst case

    @property
    def key(self) -> str:
        return f"{self.scope} {self.cap} {self.period}"

    def text(self) -> str:
        """In words: the cap reached, or, when some of it is left, that the call's worst case does not
        fit in it (a cap shown as reached with $0.00 spent said nothing of what to change)."""
        when = (f"until {dt.datetime.fromtimestamp(self.until, dt.UTC):%Y-%m-%dT%H:%MZ}"
                if self.until is not None else "until the cap is raised")
        reached = f"budget reached: {self.scope} {self.cap} ${self.limit:.2f} {when}"
        if self.spent + 1e-9 >= self.limit:
            return reached
        return (f"{reached} ({dollars(self.spent)} spent; a call's worst case, {dollars(self.worst)}, does not fit in "
                f"the {dollars(self.limit - self.spent)} left: the provider's max_tokens lowers it)")


def dollars(amount: float) -> str:
    """An amount in dollars, with the cents that show a small one (pure)."""
    return f"${amount:.2f}" if amount >= 0.01 or amount <= 0 else f"${amount:.4f}"


def price(prices: Mapping[str, Any], model: str, usage: Any) -> float | None:
    """Dollars for one call from the price table (per million tokens: input, output, cached), or
    None for a model the table does not know: unpriced, never counted as free."""
    entry = prices.get(model)
    if not isinstance(entry, Mapping):
        return None
    fresh = max(0, usage.input - usage.cached)
    cached_rate = entry.get("cached", entry.get("input", 0))
    return round((fresh * entry.get("input", 0) + usage.cached * cached_rate + usage.output * entry.get("output", 0))
                 / 1e6, 8)


def utc_day(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")


def next_midnight(now: float) -> float:
    day = dt.datetime.fromtimestamp(now, dt.UTC).date() + dt.timedelta(days=1)
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def worst_cost(prices: Mapping[str, Any], model: str, prompt_tokens: int, max_tokens: int) -> float | None:
    """The most a call can cost: every prompt token at the input price (none taken as cached) and
    max_tokens at the output price, per million as in the price table; None for an unpriced model."""
    entry = prices.get(model)
    if not isinstance(entry, Mapping):
        return None
    return (prompt_tokens * float(entry.get("input", 0)) + max_tokens * float(entry.get("output", 0))) / 1e6


def spent(entries: Iterable[Entry], caps: Caps, agent: str, task: str, now: float) -> dict[str, float]:
    """What each scope has spent or reserved: team_day, team_total, agent_day, agent_total, task."""
    today = utc_day(now)
    found = dict.fromkeys(("team_day", "team_total", "agent_day", "agent_total", "task"), 0.0)
    for entry in entries:
        found["team_total"] += entry.amount
        found["team_day"] += entry.amount if entry.day == today else 0.0
        if entry.agent == agent:
            found["agent_total"] += entry.amount
            found["agent_day"] += entry.amount if entry.day == today else 0.0
        if entry.task == task:
            found["task"] += entry.amount
    return found


def decide(entries: Iterable[Entry], caps: Caps, *, agent: str, task: str, task_limit: float | None,
           worst: float, now: float) -> Refusal | None:
    """None when a call costing at most `worst` may be reserved now; else the first cap it would cross,
    totals before per-day ones (a total reached is not lifted by the next day)."""
    have = spent(entries, caps, agent, task, now)
    today, midnight = utc_day(now), next_midnight(now)
    agent_day, agent_total = agent_caps(caps, agent)
    checks = (("team", "total", caps.team_total, have["team_total"]),
              ("team", "per_day", caps.team_day, have["team_day"]),
              (f"agent {agent}", "total", agent_total, have["agent_total"]),
              (f"agent {agent}", "per_day", agent_day, have["agent_day"]),
              (f"task {task}", "max_cost", task_limit, have["task"]))
    for scope, cap, limit, used in checks:
        if limit is not None and used + worst > limit + 1e-12:
            daily = cap == "per_day"
            return Refusal(scope, cap, float(limit), round(used, 8), midnight if daily else None,
                           today if daily else "total", worst)
    return None


def standing(entries: Iterable[Entry], caps: Caps, now: float) -> list[dict[str, Any]]:
    """Spend against each cap, for `usage` (pure): scope, cap, limit, spent (settled and reserved)."""
    rows: list[dict[str, Any]] = []
    items = list(entries)
    today = utc_day(now)
    team_day = sum(e.amount for e in items if e.day == today)
    team_total = sum(e.amount for e in items)
    for cap, limit, used in (("per_day", caps.team_day, team_day), ("total", caps.team_total, team_total)):
        if limit is not None:
            rows.append({"scope": "team", "cap": cap, "limit": limit, "spent": round(used, 8)})
    # Each agent that spent, under its own caps (worker-2 under `worker`'s); a capped name with no
    # spend yet is shown at zero, so a cap is visible before it is reached.
    seen = sorted({e.agent for e in items})
    shown = seen + [name for name in sorted(caps.agents) if not any(agent_caps(caps, a) == caps.agents[name]
                                                                     and (a == name or a.startswith(name + "-"))
                                                                     for a in seen)]
    for agent in shown:
        per_day, total = agent_caps(caps, agent)
        mine = [e for e in items if e.agent == agent]
        for cap, limit, used in (("per_day", per_day, sum(e.amount for e in mine if e.day == today)),
                                 ("total", total, sum(e.amount for e in mine))):
            if limit is not None:
                rows.append({"scope": f"agent {agent}", "cap": cap, "limit": limit, "spent": round(used, 8)})
    return rows
