"""A reservation given back is gone while its process still lives, on both ledgers (runs/budget.jsonl
and PostgreSQL): reserve, release, nothing held. The racers of test_budget.py cannot show it: they
have exited when their ledger is read, and a dead process's holds are dropped anyway. And a provider
that fails with anything at all (not only a ProviderError) gives its call's reservation back."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hermes_sup.agents.budget import Caps, decide
from hermes_sup.agents.fallback import complete_with_fallback
from hermes_sup.agents.ledger import BudgetGate, FileLedger, Hold, Ledger
from hermes_sup.agents.ledger_pg import PgLedger
from hermes_sup.agents.providers import ProviderConfig, ProviderError
from hermes_sup.agents.translate import Completion, Message

from .pgserver import PgServer

PRICES = {"m": {"input": 0.0, "output": 1000.0}}  # max_tokens 100: a call's worst case is $0.10
MESSAGES: list[Message] = [{"role": "user", "content": "hello"}]


@pytest.fixture(params=["files", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "files":
        yield FileLedger(tmp_path / "runs")
        return
    server: PgServer = request.getfixturevalue("pg_server")
    schema = f"rel_{uuid.uuid4().hex[:12]}"
    made = PgLedger(server.dsn, schema=schema)
    try:
        yield made
    finally:
        made.close()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def reserve(ledger: Ledger, amount: float, caps: Caps) -> Any:
    return ledger.reserve(agent="w", task="t", amount=amount, check=lambda entries, now: decide(
        entries, caps, agent="w", task="t", task_limit=None, worst=amount, now=now))


def rows(ledger: Ledger) -> list[tuple[float, bool]]:
    """(amount, settled) of what the ledger's storage holds, read past the ledger's own reader."""
    if isinstance(ledger, PgLedger):
        with psycopg.connect(ledger._dsn) as conn:
            return conn.execute(f'SELECT amount, settled FROM "{ledger.schema}".budget_holds').fetchall()
    assert isinstance(ledger, FileLedger)
    from hermes_sup.agents.ledger import fold
    state = fold(ledger.path.read_text().splitlines())
    return [(entry.amount, False) for entry, _record in state.open.values()] + \
        [(entry.amount, True) for entry in state.settled]


def test_a_released_reservation_is_gone_while_its_process_lives(ledger: Ledger) -> None:
    caps = Caps(team_total=1.0)
    hold = reserve(ledger, 0.7, caps)
    assert isinstance(hold, Hold)
    assert [e.amount for e in ledger.entries()] == [0.7], "a live process's hold counts"
    assert not isinstance(reserve(ledger, 0.7, caps), Hold), "and keeps the next one out"
    ledger.release(hold)
    assert ledger.entries() == [], "given back: nothing held"
    assert rows(ledger) == [], "in the ledger's storage too, not only in what its reader counts"
    again = reserve(ledger, 1.0, caps)
    assert isinstance(again, Hold), "the whole cap is free again"
    ledger.release(again)
    ledger.release(again)  # twice is once
    assert ledger.entries() == []


class Failing:
    """A provider whose call fails with an exception of its own, not a ProviderError (a bug in it, a
    library raising what nobody expected): the call's reservation must be given back all the same."""

    def __init__(self, error: BaseException) -> None:
        self.config = ProviderConfig(name="p", kind="openai", model="m", base_url="http://127.0.0.1:9",
                                     api_key="k", max_tokens=100, timeout=10)
        self.error = error
        self.held: list[float] = []  # what the ledger held while the call was made

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, *,
                 max_tokens: int | None = None, stop: threading.Event | None = None) -> Completion:
        self.held.append(sum(e.amount for e in self.ledger.entries()))
        raise self.error

    ledger: Ledger


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyError("choices"), KeyboardInterrupt()],
                         ids=["RuntimeError", "KeyError", "KeyboardInterrupt"])
def test_a_provider_failing_with_any_exception_gives_its_reservation_back(ledger: Ledger,
                                                                         error: BaseException) -> None:
    gate = BudgetGate(ledger, Caps(team_total=1.0), agent="w", task="t", task_limit=None, prices=PRICES)
    failing = Failing(error)
    failing.ledger = ledger
    if isinstance(error, Exception):
        with pytest.raises(ProviderError) as info:  # an Exception is classified, never the agent's crash
            complete_with_fallback([failing], MESSAGES, None, budget=gate,  # type: ignore[list-item]
                                   sleep=lambda seconds: None)
        assert info.value.kind == "exhausted" and type(error).__name__ in str(info.value)
    else:
        with pytest.raises(type(error)):  # an interrupt goes on up, after the hold is given back
            complete_with_fallback([failing], MESSAGES, None, budget=gate,  # type: ignore[list-item]
                                   sleep=lambda seconds: None)
    # Each attempt (a bad_response is retried) was made under its own reservation alone: the one
    # before it had been given back.
    assert failing.held and failing.held == [pytest.approx(0.10)] * len(failing.held), failing.held
    assert ledger.entries() == [] and rows(ledger) == [], "and the reservation was given back"
