"""The budget ledger: every model call's reservation and settlement, shared by all agents of a
workspace, and the gate each call passes through (reserve the worst case, call, settle the real cost).

`Ledger` is the storage-agnostic interface. FileLedger keeps it as an append-only JSONL file in
runs/ under one cross-process lock (filelock on runs/budget.lock): the check against the caps and
the reservation are made under that lock, so two agents can never both take the last dollar. The
PostgreSQL ledger (agents/ledger_pg.py) has the same methods over a table in the board's database.
`open_ledger` picks the one that follows the board: a ledger shared by fewer agents than the board
would let each host spend the whole cap.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from filelock import FileLock

from ..kanban import liveness
from ..kanban.backends import DEFAULT_BACKEND, check_board_config
from ..kanban.errors import BoardError
from ..kanban.liveness import holder_alive, start_time
from ..kanban.pg import dsn_not_set
from .budget import Caps, Entry, Refusal, decide, is_amount, price, utc_day, worst_cost

if TYPE_CHECKING:
    from .ledger_pg import PgLedger

LEDGER_FILE = "budget.jsonl"
LOCK_FILE = "budget.lock"
LOCK_TIMEOUT = 30.0
MAX_LINE = 4096  # a ledger line is ours and short: a longer one is damage, skipped


@dataclass(frozen=True)
class Hold:
    id: str
    agent: str
    task: str
    amount: float  # the worst case reserved


class LedgerError(Exception):
    """The budget ledger cannot be opened or answered (a database gone, its DSN variable unset); the
    message names no secret."""


# What a reservation is checked against: the spend so far and the time by the ledger's clock (the
# database's on PostgreSQL), the same time that dates the hold, so every host splits days alike.
Check = Callable[[list[Entry], float], Refusal | None]


class Ledger(Protocol):
    def reserve(self, *, agent: str, task: str, amount: float, check: Check) -> Hold | Refusal: ...

    def settle(self, hold: Hold, amount: float) -> None: ...

    def release(self, hold: Hold) -> None: ...

    def entries(self) -> list[Entry]: ...

    def first_time(self, key: str) -> bool: ...

    def now(self) -> float:
        """The time by the ledger's clock (the database's on PostgreSQL): what its days are counted by."""
        ...

    def close(self) -> None: ...


@dataclass
class Folded:
    settled: list[Entry]
    open: dict[str, tuple[Entry, dict[str, Any]]]  # hold id -> its entry and record (pid, started)
    said: set[str]


def fold(lines: list[str]) -> Folded:
    """The ledger's state from its lines (pure): a damaged or foreign line is skipped, never fatal."""
    settled: list[Entry] = []
    open_: dict[str, tuple[Entry, dict[str, Any]]] = {}
    said: set[str] = set()
    for line in lines:
        if len(line) > MAX_LINE:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        op, hold = record.get("op"), str(record.get("id") or "")
        amount = record.get("amount")
        number = is_amount(amount)
        if op == "hold" and number and hold:
            open_[hold] = (Entry(str(record.get("agent")), str(record.get("task")), str(record.get("day")),
                                 float(amount)), record)
        elif op == "settle" and hold in open_ and number:
            entry = open_.pop(hold)[0]
            settled.append(Entry(entry.agent, entry.task, entry.day, float(amount)))
        elif op == "drop":
            open_.pop(hold, None)
        elif op == "said" and isinstance(record.get("key"), str):
            said.add(record["key"])
    return Folded(settled, open_, said)


def read_entries(runs: Path, alive: Callable[[int, float | None, str | None], bool | None] = holder_alive
                 ) -> list[Entry]:
    """Settled and still reserved spend in a workspace's ledger, for readers (`usage`, a paused
    agent): no lock, no writes; a torn last line is skipped, and so is a reservation whose process
    is gone (the next reservation writes its release)."""
    try:
        data = (runs / LEDGER_FILE).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return []
    state = fold(data.decode("utf-8", "replace").splitlines())
    return [*state.settled, *(entry for entry, record in state.open.values() if not _dead(record, alive))]


def _dead(record: dict[str, Any], alive: Callable[[int, float | None, str | None], bool | None]) -> bool:
    return isinstance(record.get("pid"), int) and alive(record["pid"], record.get("started"), None) is False


class FileLedger:
    def __init__(self, runs: Path, *, clock: Callable[[], float] = time.time,
                 alive: Callable[[int, float | None, str | None], bool | None] = holder_alive) -> None:
        runs.mkdir(parents=True, exist_ok=True)
        self.path = runs / LEDGER_FILE
        self.lock = FileLock(str(runs / LOCK_FILE), timeout=LOCK_TIMEOUT)
        self.clock = clock
        self.alive = alive
        self.pid = os.getpid()
        self.started = start_time(self.pid)

    def _lines(self) -> list[str]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return data.decode("utf-8", "replace").splitlines()

    def _append(self, *records: dict[str, Any]) -> None:
        text = "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _state(self) -> Folded:
        """The state, with the holds of processes that died released (called under the lock)."""
        state = fold(self._lines())
        dead = [hold for hold, (_entry, record) in state.open.items() if _dead(record, self.alive)]
        if dead:
            self._append(*({"op": "drop", "id": hold, "why": "its process is gone"} for hold in dead))
            for hold in dead:
                del state.open[hold]
        return state

    def reserve(self, *, agent: str, task: str, amount: float, check: Check) -> Hold | Refusal:
        with self.lock:
            state = self._state()
            now = self.clock()
            refusal = check([*state.settled, *(entry for entry, _record in state.open.values())], now)
            if refusal is not None:
                return refusal
            hold = Hold(uuid.uuid4().hex, agent, task, amount)
            self._append({"op": "hold", "id": hold.id, "agent": agent, "task": task, "day": utc_day(now),
                          "amount": round(amount, 10), "pid": self.pid, "started": self.started})
            return hold

    def settle(self, hold: Hold, amount: float) -> None:
        with self.lock:
            self._append({"op": "settle", "id": hold.id, "amount": round(max(0.0, amount), 10)})

    def release(self, hold: Hold) -> None:
        with self.lock:
            self._append({"op": "drop", "id": hold.id})

    def entries(self) -> list[Entry]:
        return read_entries(self.path.parent, self.alive)

    def now(self) -> float:
        return self.clock()

    def first_time(self, key: str) -> bool:
        """True once per key (a cap in its period): whether budget_reached is to be said now."""
        with self.lock:
            if key in fold(self._lines()).said:
                return False
            self._append({"op": "said", "key": key})
            return True

    def close(self) -> None:
        """Nothing held open: each write opens and closes the file."""


def _open_files(workspace: Path, section: Mapping[str, Any], host: str | None,
                environ: Mapping[str, str]) -> Ledger:
    return FileLedger(workspace / "runs")


def _open_postgres(workspace: Path, section: Mapping[str, Any], host: str | None,
                   environ: Mapping[str, str], create: bool = True) -> PgLedger:
    dsn_env = str(section["dsn_env"])
    dsn = environ.get(dsn_env)
    if not dsn:
        raise LedgerError(dsn_not_set(dsn_env, "the budget ledger is in the board's database"))
    try:
        from .ledger_pg import PgLedger
    except ImportError:
        raise LedgerError("the budget ledger on a PostgreSQL board needs psycopg 3: "
                          "pip install 'psycopg[binary]>=3.1' (the postgres extra)") from None
    from ..kanban.pg import check_dsn
    try:
        check_dsn(dsn, dsn_env)
    except BoardError as exc:
        raise LedgerError(str(exc)) from None
    # The same schema and host name as the board's (kanban/pg open_store): a host judges the
    # liveness of its own holds only.
    return PgLedger(dsn, schema=str(section.get("schema") or "hermes_sup"), host=host or liveness.HOST,
                    dsn_env=f"${dsn_env}", host_timeout=float(section["host_timeout"]), create=create)


# The ledger of each board backend, by the backend's name (kanban/backends.py): the ledger lives
# where the board does, so every agent that can claim a task reserves against the same spend.
LEDGERS: dict[str, Callable[[Path, Mapping[str, Any], str | None, Mapping[str, str]], Ledger]] = {
    DEFAULT_BACKEND: _open_files, "postgres": _open_postgres}


def _section(board: Mapping[str, Any] | None) -> dict[str, Any]:
    try:
        return check_board_config(board)
    except Exception as exc:  # BoardConfigError: the board's own words
        raise LedgerError(str(exc)) from None


def open_reader(workspace: Path, board: Mapping[str, Any] | None = None, *, host: str | None = None,
                environ: Mapping[str, str] | None = None) -> PgLedger | None:
    """The board database's ledger opened to be read (its version, its spend) and never to create
    its tables; None on the file board, whose runs/budget.jsonl readers look at themselves."""
    section = _section(board)
    if section["backend"] != "postgres":
        return None
    return _open_postgres(workspace, section, host, os.environ if environ is None else environ, create=False)


def open_ledger(workspace: Path, board: Mapping[str, Any] | None = None, *, host: str | None = None,
                environ: Mapping[str, str] | None = None) -> Ledger:
    """The budget ledger of the workspace's board (hermes.yaml `board:`, `host:`): runs/budget.jsonl
    for the file board, the board's database for PostgreSQL (DSN from `dsn_env`, never printed).
    Raises LedgerError for a backend with no ledger or one that cannot be reached."""
    section = _section(board)
    opener = LEDGERS.get(section["backend"])
    if opener is None:
        raise LedgerError(f"board backend '{section['backend']}' keeps no budget ledger: budgets cannot be "
                          "enforced across the hosts sharing it")
    return opener(workspace, section, host, os.environ if environ is None else environ)


def read_spend(workspace: Path, board: Mapping[str, Any] | None = None, *, host: str | None = None,
               environ: Mapping[str, str] | None = None) -> list[Entry]:
    """Settled and still reserved spend in the board's ledger, for readers (`usage`, the dashboard);
    see `read_spend_noted`. Raises LedgerError."""
    return read_spend_noted(workspace, board, host=host, environ=environ).entries


@dataclass(frozen=True)
class Spend:
    entries: list[Entry]
    notes: list[str]  # for the reader: a database with no ledger yet
    now: float | None  # the time by the ledger's clock (the database's), to count its days by; None: this host's


def read_spend_noted(workspace: Path, board: Mapping[str, Any] | None = None, *, host: str | None = None,
                     environ: Mapping[str, str] | None = None) -> Spend:
    """Settled and still reserved spend in the board's ledger, with notes and the ledger's time. A
    read never writes: the file ledger is read without its lock, and the database's ledger tables
    are not created when missing (nobody reserved yet: no spend, and a note says so). Raises LedgerError."""
    section = _section(board)
    if section["backend"] == DEFAULT_BACKEND:
        return Spend(read_entries(workspace / "runs"), [], None)
    if section["backend"] != "postgres":
        other = open_ledger(workspace, board, host=host, environ=environ)
        try:
            return Spend(other.entries(), [], other.now())
        finally:
            other.close()
    ledger = _open_postgres(workspace, section, host, os.environ if environ is None else environ, create=False)
    try:
        entries, now = ledger.entries(), ledger.now()
        missing = ledger.missing
    finally:
        ledger.close()
    notes = ["the board's database has no budget ledger yet (no agent has reserved a call): spend is 0"] \
        if missing else []
    return Spend(entries, notes, now)


class BudgetReached(Exception):
    """A call that would cross a cap: nothing was sent. Not a ProviderError, so no fallback, retry or
    cascade escalation takes it for a provider's failure and spends on the next provider."""

    def __init__(self, refusal: Refusal, worst: float) -> None:
        super().__init__(refusal.text())
        self.refusal = refusal
        self.worst = worst


class BudgetGate:
    """One task's gate in front of every model call (complete_with_fallback's `budget`)."""

    def __init__(self, ledger: Ledger, caps: Caps, *, agent: str, task: str, task_limit: float | None,
                 prices: dict[str, Any]) -> None:
        self.ledger, self.caps, self.agent, self.task = ledger, caps, agent, task
        self.task_limit, self.prices = task_limit, prices

    def reserve(self, model: str, prompt_tokens: int, max_tokens: int) -> Hold | None:
        """Reserve a call's worst case, or raise BudgetReached. An unpriced model reserves nothing
        (its cost is unknown, as `usage` shows it)."""
        worst = worst_cost(self.prices, model, prompt_tokens, max_tokens)
        if worst is None:
            return None
        try:
            # The day is the ledger's (the database's on PostgreSQL), never this host's clock.
            found = self.ledger.reserve(agent=self.agent, task=self.task, amount=worst,
                                        check=lambda entries, now: decide(
                                            entries, self.caps, agent=self.agent, task=self.task,
                                            task_limit=self.task_limit, worst=worst, now=now))
        except Exception as exc:  # a full disk, a lock held too long, a database gone: no call without a hold
            from .providers import ProviderError  # here: `usage` reads the ledger without the provider layer

            raise ProviderError("budget_ledger", f"the budget ledger could not take the reservation "
                                f"({type(exc).__name__}: {str(exc)[:200]}); no call was made") from None
        if isinstance(found, Refusal):
            raise BudgetReached(found, worst)
        return found

    def open_run(self) -> Hold:
        """A hold for a run whose cost is known only once it has ended (an agent CLI's, runtime:
        hermes): nothing reserved, refused (BudgetReached) once a cap is already reached; settled
        with settle_amount. A cap is then never overshot by more than the runs in flight."""
        found = self.ledger.reserve(agent=self.agent, task=self.task, amount=0.0,
                                    check=lambda entries, now: decide(entries, self.caps, agent=self.agent,
                                                                      task=self.task, task_limit=self.task_limit,
                                                                      worst=0.0, now=now))
        if isinstance(found, Refusal):
            raise BudgetReached(found, 0.0)
        return found

    def settle_amount(self, hold: Hold, amount: float) -> None:
        with contextlib.suppress(Exception):  # as settle: counted as reserved, never lost
            self.ledger.settle(hold, amount)

    def settle(self, hold: Hold | None, model: str, usage: Any) -> None:
        """Settle with the call's real cost as `usage` prices it; a model the price table does not
        know (a server naming another model than asked) keeps its reserved worst case."""
        if hold is not None:
            cost = price(self.prices, model, usage)
            # A settlement that cannot be written leaves the hold at its worst case: counted high,
            # never lost, and the answer already paid for is not thrown away.
            with contextlib.suppress(Exception):
                self.ledger.settle(hold, hold.amount if cost is None else cost)

    def release(self, hold: Hold | None) -> None:
        if hold is not None:
            with contextlib.suppress(Exception):
                self.ledger.release(hold)

    def announce(self, refusal: Refusal) -> bool:
        """True the first time this cap at this limit is reached in its period (one budget_reached)."""
        return self.ledger.first_time(f"{refusal.key} {refusal.limit:g}")

    def blocked(self, worst: float) -> Refusal | None:
        """Would a call of `worst` be refused now, by the ledger's day? (An agent paused on a cap
        looks again with this.)"""
        return decide(self.ledger.entries(), self.caps, agent=self.agent, task=self.task,
                      task_limit=self.task_limit, worst=worst, now=self.ledger.now())
