"""Hard budgets: the pure decision, hermes.yaml's `budgets:` check, the ledger across real processes,
the gate in front of every model call (through the real openai SDK to the scripted server), and a
real team that stops at a cap, says why, and finishes once `reload` raises it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hermes_sup.agents.budget import (
    Caps,
    Entry,
    Refusal,
    caps_from,
    decide,
    next_midnight,
    price,
    standing,
    task_cap,
    worst_cost,
)
from hermes_sup.agents.fallback import complete_with_fallback
from hermes_sup.agents.ledger import BudgetGate, BudgetReached, FileLedger, fold, read_entries
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.translate import Usage
from hermes_sup.kanban import Board
from hermes_sup.kanban.why import BUDGET_REACHED
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import CLI, ROOT, init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply

NOON = dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC).timestamp()
TODAY = "2026-03-04"


# What a $0.35 cap says after three calls of $0.10, to the fourth.
LEFT = " ($0.30 spent; a call's worst case, $0.10, does not fit in the $0.05 left: the provider's max_tokens lowers it)"


def refused(entries, caps, worst, *, agent="worker-1", task="t1", task_limit=None, now=NOON):
    return decide(entries, caps, agent=agent, task=task, task_limit=task_limit, worst=worst, now=now)


# -- the pure core ------------------------------------------------------------------------------------

def test_a_call_fits_up_to_the_cap_exactly_and_the_next_one_is_refused_until_midnight():
    caps = Caps(team_day=1.0)
    spent = [Entry("worker-1", "t1", TODAY, 0.6)]
    assert refused(spent, caps, 0.4) is None, "spent + worst == cap is within the cap"
    refusal = refused(spent, caps, 0.41)
    assert refusal is not None and (refusal.scope, refusal.cap, refusal.limit) == ("team", "per_day", 1.0)
    assert refusal.until == next_midnight(NOON) == dt.datetime(2026, 3, 5, tzinfo=dt.UTC).timestamp()
    assert refusal.text().startswith("budget reached: team per_day $1.00 until 2026-03-05T00:00Z ($0.60 spent")
    assert refusal.text().startswith(BUDGET_REACHED), "kanban/why.py knows the agents' words"
    # Yesterday's spend does not count against today's cap; the next day the call fits.
    assert refused([Entry("worker-1", "t1", "2026-03-03", 0.9)], caps, 0.5) is None
    assert refused(spent, caps, 0.41, now=NOON + 86400) is None


def test_a_call_whose_worst_case_does_not_fit_in_what_is_left_says_so_and_what_lowers_it():
    # $0.00 spent of $0.05, and one call's worst case is $0.08: the cap is not spent, the call is too big.
    refusal = refused([], Caps(team_total=0.05), 0.08)
    assert refusal.text() == (
        "budget reached: team total $0.05 until the cap is raised ($0.00 spent; a call's worst case, $0.08, does "
        "not fit in the $0.05 left: the provider's max_tokens lowers it)")
    small = refused([Entry("worker-1", "t1", TODAY, 0.999)], Caps(team_day=1.0), 0.0042)
    assert "($1.00 spent; a call's worst case, $0.0042, does not fit in the $0.0010 left" in small.text()
    spent = refused([Entry("worker-1", "t1", TODAY, 1.0)], Caps(team_day=1.0), 0.0042)
    assert spent.text() == "budget reached: team per_day $1.00 until 2026-03-05T00:00Z", "all spent: nothing more"


def test_a_total_cap_waits_until_raised_and_comes_before_a_daily_one():
    caps = Caps(team_day=1.0, team_total=2.0)
    spent = [Entry("a", "t", "2026-03-01", 1.5), Entry("a", "t", TODAY, 0.9)]
    refusal = refused(spent, caps, 0.2)
    assert (refusal.cap, refusal.until, refusal.period) == ("total", None, "total")
    assert refusal.text() == "budget reached: team total $2.00 until the cap is raised"


def test_agent_caps_apply_to_each_agent_of_an_entry_on_its_own():
    caps = caps_from({"agents": {"worker": {"per_day": 0.5}}})
    spent = [Entry("worker-1", "t1", TODAY, 0.45), Entry("worker-2", "t2", TODAY, 0.1)]
    refusal = refused(spent, caps, 0.1, agent="worker-1")
    assert refusal is not None and refusal.scope == "agent worker-1" and refusal.cap == "per_day"
    assert refused(spent, caps, 0.1, agent="worker-2") is None
    assert refused(spent, caps, 10.0, agent="other") is None, "no cap for an agent hermes.yaml does not name"


def test_a_task_ceiling_is_the_default_lowered_never_raised_by_its_meta():
    caps = caps_from({"tasks": {"max_cost": 1.0}})
    assert task_cap(caps, {"max_cost": 0.25}) == 0.25
    assert task_cap(caps, {"max_cost": 5}) == 1.0
    assert task_cap(caps, {"max_cost": "lots"}) == 1.0 and task_cap(caps, None) == 1.0
    assert task_cap(caps_from(None), {"max_cost": 0.3}) == 0.3
    spent = [Entry("w", "t1", "2026-01-01", 0.2), Entry("w", "t2", TODAY, 0.5)]
    refusal = refused(spent, caps, 0.1, task="t1", task_limit=0.25)
    assert refusal is not None and (refusal.scope, refusal.cap, refusal.until) == ("task t1", "max_cost", None)


def test_the_worst_case_prices_every_prompt_token_fresh_and_max_tokens_of_output():
    prices = {"m": {"input": 3.0, "output": 15.0, "cached": 0.3}}
    assert worst_cost(prices, "m", 1000, 500) == pytest.approx((1000 * 3 + 500 * 15) / 1e6)
    assert worst_cost(prices, "other", 1000, 500) is None
    real = price(prices, "m", Usage(input=1000, output=500, cached=400))
    assert real is not None and real <= worst_cost(prices, "m", 1000, 500)


def test_usage_standing_shows_each_cap_with_what_was_spent_and_reserved():
    caps = caps_from({"team": {"per_day": 2, "total": 10}, "agents": {"worker": {"total": 1}}})
    rows = standing([Entry("worker-1", "t", TODAY, 0.5), Entry("worker-1", "t", "2026-03-01", 0.25)], caps, NOON)
    assert rows == [{"scope": "team", "cap": "per_day", "limit": 2, "spent": 0.5},
                    {"scope": "team", "cap": "total", "limit": 10, "spent": 0.75},
                    {"scope": "agent worker-1", "cap": "total", "limit": 1, "spent": 0.75}]


# -- hermes.yaml ------------------------------------------------------------------------------------

BASE = "agents:\n  - name: worker\n"


@pytest.mark.parametrize(("text", "line", "said"), [
    ("budgets: 5\n", 1, "'budgets' must be a mapping"),  # a scalar has no line of its own: the file's top
    ("budgets:\n  team: {per_day: -1}\n", 4, "'budgets.team.per_day' must be a number of dollars"),
    ("budgets:\n  team:\n    weekly: 3\n", 5, "unknown key 'budgets.team.weekly'"),
    ("budgets:\n  agents:\n    worker: {per_day: lots}\n", 5, "'budgets.agents.worker.per_day' must be a number"),
    ("budgets:\n  tasks: {max_cost: true}\n", 4, "'budgets.tasks.max_cost' must be a number"),
    ("budgets:\n  teams: {}\n", 4, "unknown key 'budgets.teams' (did you mean 'team'?)"),
])
def test_a_bad_budget_is_refused_at_load_with_its_file_and_line(tmp_path, text, line, said):
    path = tmp_path / "hermes.yaml"
    path.write_text(BASE + text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:{line}: ") and said in str(info.value), str(info.value)


def test_the_contracts_budgets_load_and_reach_the_agents(tmp_path):
    from hermes_sup.supervisor.spec import build_specs

    path = tmp_path / "hermes.yaml"
    path.write_text(BASE + "budgets:\n  team: {per_day: 20}\n  agents: {worker: {per_day: 2}}\n"
                           "  tasks: {max_cost: 1.0}\n")
    config = load_config(path)
    assert config["budgets"] == {"team": {"per_day": 20}, "agents": {"worker": {"per_day": 2}},
                                 "tasks": {"max_cost": 1.0}}
    agent = build_specs(config, tmp_path)[0].agent_config()
    assert caps_from(agent["llm"]["budgets"]) == Caps(team_day=20, agents={"worker": (2, None)}, task_max=1.0)


# -- the ledger ---------------------------------------------------------------------------------------

def test_damaged_lines_are_skipped_and_settlements_replace_reservations():
    lines = ['{"op":"hold","id":"a","agent":"w","task":"t","day":"d","amount":0.5}', "{torn", "[1]",
             '{"op":"hold","id":"b","agent":"w","task":"t","day":"d","amount":0.4}',
             '{"op":"settle","id":"a","amount":0.1}', '{"op":"drop","id":"b"}',
             '{"op":"hold","id":"c","agent":"w","task":"t","day":"d","amount":-3}', '{"op":"said","key":"k"}']
    state = fold(lines)
    assert state.settled == [Entry("w", "t", "d", 0.1)] and state.open == {} and state.said == {"k"}


RACER = """
import sys, time
from pathlib import Path
from hermes_sup.agents.budget import Caps, decide
from hermes_sup.agents.ledger import FileLedger
runs, start, name, seconds = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
if len(sys.argv) > 5:
    from hermes_sup.agents.ledger_pg import PgLedger
    ledger = PgLedger(sys.argv[5], schema=sys.argv[6])
else:
    ledger = FileLedger(runs)
caps = Caps(team_total=1.0)
(start.parent / ("ready-" + name)).touch()
while not start.exists():
    time.sleep(0.001)
granted = over = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    found = ledger.reserve(agent=name, task="t", amount=1.0, check=lambda entries, now: decide(
        entries, caps, agent=name, task="t", task_limit=None, worst=1.0, now=time.time()))
    if hasattr(found, "id"):
        granted += 1
        over += sum(entry.amount for entry in ledger.entries()) > 1.0  # another holds the dollar too
        ledger.release(found)
print(granted, over)
"""


def race(tmp_path: Path, *extra: str) -> list[tuple[int, int]]:
    """Four real processes contend for one dollar, each reserving it whole and giving it back, for a
    second and a half together: (granted, times another held it too) per process."""
    runs, start = tmp_path / "runs", tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(runs), str(start), f"agent-{n}", "1.5", *extra],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT) for n in range(4)]
    wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 4, timeout=60)  # all at the line together
    start.touch()
    return [tuple(map(int, proc.communicate(timeout=300)[0].split())) for proc in racers]


def test_agents_racing_for_the_last_dollar_never_hold_it_together(tmp_path):
    """Under the lock the check and the reservation are one step, so no two ever hold the dollar at
    once (without the lock they do within a few rounds)."""
    results = race(tmp_path)
    assert sum(granted for granted, _over in results) > 0
    assert [over for _granted, over in results] == [0, 0, 0, 0], results
    assert read_entries(tmp_path / "runs") == [], "every reservation was given back"


def test_the_postgresql_ledger_holds_the_same_line_across_connections(tmp_path, pg_server):
    from hermes_sup.agents.ledger_pg import PgLedger

    results = race(tmp_path, pg_server.dsn, "budget_race")
    assert sum(granted for granted, _over in results) > 0
    assert [over for _granted, over in results] == [0, 0, 0, 0], results
    ledger = PgLedger(pg_server.dsn, schema="budget_race")
    try:
        assert ledger.entries() == [], "every reservation was given back"
        caps = Caps(team_total=1.0)
        hold = ledger.reserve(agent="w", task="t", amount=0.6, check=lambda entries, now: decide(
            entries, caps, agent="w", task="t", task_limit=None, worst=0.6, now=NOON))
        assert hasattr(hold, "id")
        ledger.settle(hold, 0.5)
        refusal = ledger.reserve(agent="w", task="t", amount=0.6, check=lambda entries, now: decide(
            entries, caps, agent="w", task="t", task_limit=None, worst=0.6, now=NOON))
        assert isinstance(refusal, Refusal) and refusal.spent == 0.5
        assert [e.amount for e in ledger.entries()] == [0.5]
        assert ledger.first_time("k") is True and ledger.first_time("k") is False
    finally:
        ledger.close()


def test_a_reservation_of_a_process_that_died_is_released_by_the_next_reader(tmp_path):
    runs = tmp_path / "runs"
    script = ("import sys, os; from pathlib import Path; from hermes_sup.agents.ledger import FileLedger; "
              "FileLedger(Path(sys.argv[1])).reserve(agent='w', task='t', amount=0.9, check=lambda e, now: None); "
              "os._exit(0)")
    subprocess.run([sys.executable, "-c", script, str(runs)], check=True, cwd=ROOT, timeout=60)
    assert read_entries(runs) == [], "a reader does not count it"
    assert fold((runs / "budget.jsonl").read_text().splitlines()).open, "and writes nothing"
    ledger = FileLedger(runs)
    caps = Caps(team_total=1.0)
    hold = ledger.reserve(agent="w2", task="t2", amount=0.8, check=lambda entries, now: decide(
        entries, caps, agent="w2", task="t2", task_limit=None, worst=0.8, now=NOON))
    assert not isinstance(hold, type(None)) and hasattr(hold, "id"), hold
    assert [e.amount for e in read_entries(runs)] == [0.8]
    # Our own (live) reservation stands for the next one.
    again = ledger.reserve(agent="w3", task="t3", amount=0.3, check=lambda entries, now: decide(
        entries, caps, agent="w3", task="t3", task_limit=None, worst=0.3, now=NOON))
    assert not hasattr(again, "id") and again.scope == "team"


def test_budget_reached_is_announced_once_per_cap_and_limit(tmp_path):
    ledger = FileLedger(tmp_path / "runs")
    assert ledger.first_time("team total total 1") is True
    assert ledger.first_time("team total total 1") is False
    assert FileLedger(tmp_path / "runs").first_time("team total total 1") is False, "across processes too"
    assert ledger.first_time("team total total 2") is True, "a raised cap reached again is news"


# -- the gate in front of every call ------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "hello"}]
PRICES = {"m": {"input": 0.0, "output": 1000.0}}  # $0.001 a token of output: max_tokens 100 is $0.10


def provider(llm: ScriptedLLM) -> OpenAIProvider:
    return OpenAIProvider(ProviderConfig(name="p", kind="openai", model="m", base_url=llm.url, api_key="k",
                                         max_tokens=100, timeout=10))


def test_each_call_reserves_its_worst_case_settles_its_real_cost_and_a_refused_one_sends_nothing(tmp_path):
    ledger = FileLedger(tmp_path / "runs")
    gate = BudgetGate(ledger, Caps(team_total=0.15), agent="w", task="t", task_limit=None, prices=PRICES)
    with ScriptedLLM() as llm:
        llm.script("openai", openai_reply("first", completion=40, model="m"))
        answer = complete_with_fallback([provider(llm)], MESSAGES, None, budget=gate)
        assert answer.message["content"] == "first"
        assert llm.requests[0]["body"]["max_tokens"] == 100, "the call asks for no more than it reserved"
        assert [e.amount for e in read_entries(tmp_path / "runs")] == [pytest.approx(0.04)]
        # 0.04 settled + 0.10 worst = 0.14 fits; then 0.14 + 0.10 does not.
        llm.script("openai", openai_reply("second", completion=100, model="m"))
        complete_with_fallback([provider(llm)], MESSAGES, None, budget=gate)
        with pytest.raises(BudgetReached) as info:
            complete_with_fallback([provider(llm)], MESSAGES, None, budget=gate)
        assert len(llm.requests) == 2, "a call that would cross the cap is never sent"
        assert str(info.value) == ("budget reached: team total $0.15 until the cap is raised ($0.14 spent; a call's "
                                   "worst case, $0.10, does not fit in the $0.0100 left: the provider's max_tokens "
                                   "lowers it)")
        # A failed call gives its reservation back.
        gate2 = BudgetGate(ledger, Caps(team_total=1.0), agent="w", task="t", task_limit=None, prices=PRICES)
        llm.script("openai", {"status": 400, "json": {"error": {"message": "bad", "type": "invalid_request_error"}}})
        with pytest.raises(Exception):  # noqa: B017 - a ProviderError of the request's own
            complete_with_fallback([provider(llm)], MESSAGES, None, budget=gate2)
    assert sum(e.amount for e in read_entries(tmp_path / "runs")) == pytest.approx(0.14)


def test_a_ledger_that_cannot_be_read_stops_the_call_with_a_clear_error(tmp_path):
    from hermes_sup.agents.providers import ProviderError

    runs = tmp_path / "runs"
    gate = BudgetGate(FileLedger(runs), Caps(team_total=1.0), agent="w", task="t", task_limit=None, prices=PRICES)
    (runs / "budget.jsonl").mkdir()  # a damaged workspace: the ledger is no file
    with ScriptedLLM() as llm:
        llm.script("openai", openai_reply("never", model="m"))
        with pytest.raises(ProviderError) as info:
            complete_with_fallback([provider(llm)], MESSAGES, None, budget=gate)
        assert info.value.kind == "budget_ledger" and "no call was made" in str(info.value)
        assert llm.requests == [], "without a reservation nothing is spent"


def test_the_gate_counts_days_by_the_ledgers_clock_not_the_hosts(tmp_path):
    """The ledger's clock (the database's on PostgreSQL) says which day it is, for the reservation and
    for an agent paused on a per-day cap looking again: a host whose clock is a day off neither
    resumes early nor counts a call on the wrong day."""
    day = FileLedger(tmp_path / "runs", clock=lambda: NOON)  # the ledger's day: 2026-03-04
    gate = BudgetGate(day, Caps(team_day=0.15), agent="w", task="t", task_limit=None, prices=PRICES)
    hold = gate.reserve("m", 0, 100)
    assert hold is not None
    gate.settle(hold, "m", Usage(output=100))
    assert [e.day for e in read_entries(tmp_path / "runs")] == ["2026-03-04"]
    refusal = gate.blocked(0.10)  # this host's clock says another day, long after: no matter
    assert refusal is not None and refusal.cap == "per_day" and refusal.period == "2026-03-04"
    with pytest.raises(BudgetReached):
        gate.reserve("m", 0, 100)
    day.clock = lambda: NOON + 86400  # the ledger's next day: room again
    assert gate.blocked(0.10) is None and gate.reserve("m", 0, 100) is not None


# -- a real team --------------------------------------------------------------------------------------

def team_yaml(url: str, total: float, *, count: int = 4, tasks: str = "") -> str:
    return ("defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n"
            f"providers:\n  local: {{kind: openai, base_url: '{url}', model: m, max_tokens: 100, timeout: 30}}\n"
            "tiers: {cheap: [local], standard: [local], premium: [local]}\n"
            "prices:\n  m: {input: 0, output: 1000}\n"
            f"budgets:\n  team: {{total: {total}}}\n{tasks}"
            f"agents:\n  - name: worker\n    count: {count}\n")


def settled_replay(runs: Path) -> tuple[float, float]:
    """The ledger replayed: (the most ever committed, settled plus reserved, at any moment; what was
    settled in the end)."""
    committed, peak, holds = 0.0, 0.0, {}
    for line in (runs / "budget.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["op"] == "hold":
            holds[record["id"]] = record["amount"]
            committed += record["amount"]
        elif record["op"] == "settle":
            committed += record["amount"] - holds.pop(record["id"])
        elif record["op"] == "drop" and record["id"] in holds:
            committed -= holds.pop(record["id"])
        peak = max(peak, committed)
    return peak, committed


def test_a_team_stops_at_its_cap_says_why_and_finishes_when_reload_raises_it(tmp_path, up):
    gate = threading.Event()  # answers wait for it: the four agents' calls are in flight together

    def answer(api: str, body: dict) -> dict:
        gate.wait(30)
        return openai_reply("done it", completion=100, model="m")  # exactly the worst case: $0.10

    with ScriptedLLM(responder=answer) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(team_yaml(llm.url, 0.35))  # room for three calls, not four
        board = Board(ws / "kanban")
        tasks = [board.add({"title": f"task {n}"}) for n in range(6)]
        up(ws)
        wait_until(lambda: len(llm.requests) >= 3, timeout=60, interval=0.05)
        gate.set()

        def statuses() -> list[str]:
            return sorted(board.get(t["id"])["status"] for t in tasks)

        wait_until(lambda: statuses() == ["done"] * 3 + ["todo"] * 3, timeout=90, interval=0.1)
        assert len(llm.requests) == 3, "no call past the cap was sent"
        peak, settled = settled_replay(ws / "runs")
        # Every call's worst case is its real cost here, so the bound is exact: never more committed
        # than the cap, and what was settled is the three calls that fit.
        assert peak <= 0.35 + 1e-9 and settled == pytest.approx(0.30), (peak, settled)
        waiting = [board.get(t["id"]) for t in tasks if board.get(t["id"])["status"] == "todo"]
        assert all(doc["attempts"] == 0 for doc in waiting), "a cap reached spends no attempt"

        def shown() -> dict:
            out = subprocess.run([*CLI, "-w", str(ws), "task", "show", waiting[0]["id"], "--json"],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT)
            doc = json.loads(out.stdout)
            return doc if doc.get("waiting_kind") == "budget" else {}

        doc = wait_until(shown, timeout=60, interval=0.2)
        assert doc["waiting"] == "budget reached: team total $0.35 until the cap is raised" + LEFT
        usage = json.loads(subprocess.run([*CLI, "-w", str(ws), "usage", "--json"], capture_output=True, text=True,
                                          timeout=60, cwd=ROOT).stdout)
        assert usage["budgets"] == [{"scope": "team", "cap": "total", "limit": 0.35, "spent": 0.3,
                                     "left": pytest.approx(0.05)}]

        (ws / "hermes.yaml").write_text(team_yaml(llm.url, 1.0))
        subprocess.run([*CLI, "-w", str(ws), "reload"], check=True, capture_output=True, timeout=60, cwd=ROOT)
        wait_until(lambda: statuses() == ["done"] * 6, timeout=120, interval=0.2)
        assert settled_replay(ws / "runs")[1] == pytest.approx(0.60)
    events = subprocess.run([*CLI, "-w", str(ws), "events", "--json"], capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    reached = [e for e in map(json.loads, events.stdout.splitlines()) if e.get("event") == "budget_reached"]
    assert len(reached) == 1, reached
    assert reached[0]["note"] == "budget reached: team total $0.35 until the cap is raised" + LEFT


def test_a_task_over_its_own_ceiling_is_blocked_for_a_person_and_nothing_is_sent(tmp_path, up):
    with ScriptedLLM(responder=lambda api, body: openai_reply("done it", completion=100, model="m")) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(team_yaml(llm.url, 5.0, count=1, tasks="  tasks: {max_cost: 1.0}\n"))
        board = Board(ws / "kanban")
        cheap = board.add({"title": "small", "meta": {"max_cost": 0.05}})  # below one call's worst case ($0.10)
        fine = board.add({"title": "fine"})
        up(ws)
        wait_until(lambda: board.get(cheap["id"])["status"] == "blocked" and board.get(fine["id"])["status"] == "done",
                   timeout=90, interval=0.1)
        assert board.get(cheap["id"])["error"].startswith(
            f"budget reached: task {cheap['id']} max_cost $0.05 until the cap is raised")
        assert not [r for r in llm.requests if "small" in json.dumps(r["body"])], "its call was never sent"
        assert board.get(cheap["id"])["attempts"] == 1


def test_the_file_ledger_counts_no_hold_or_settlement_of_no_finite_amount() -> None:
    # One line of Infinity in runs/budget.jsonl would make every cap reached for good: such a line
    # is skipped like any damaged one, as the PostgreSQL ledger clamps it.
    lines = [json.dumps({"op": "hold", "id": "h1", "agent": "a", "task": "t", "day": "2026-01-01", "amount": 0.5}),
             '{"op": "hold", "id": "h2", "agent": "a", "task": "t", "day": "2026-01-01", "amount": Infinity}',
             '{"op": "settle", "id": "h1", "amount": Infinity}']
    state = fold(lines)
    assert [entry.amount for entry, _record in state.open.values()] == [0.5]
    assert state.settled == []
