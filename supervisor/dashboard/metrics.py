"""Prometheus metrics of a team (agents, restarts, tasks, model calls, spend, breakers), read from the
workspace at scrape time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ..readers import BEHIND_MAX, readers_behind

CLAIM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
FINISHED = ("done", "failed", "blocked", "cancelled")
LABEL_CHARS = 200  # of a label value read from a file a model's answer wrote (an LLM-call record's model)

# -- what is measured: plain data, read at scrape time -------------------------------------------

def _moment(value: Any) -> float | None:
    """An ISO-8601 time as epoch seconds, or None (pure)."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def label(value: Any) -> str:
    """A value as a label carries it (pure): text, cut. A provider answers with the model's name it
    likes, which the LLM-call log keeps as it came: a megabyte of it is no label for every scrape."""
    text = str(value)
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"


def task_times(task: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """A task's claim latency (from its creation to its first claim) and duration (from its last
    claim to the close that followed it), in seconds, each None when it has none yet (pure)."""
    created = _moment(task.get("created_at"))
    history = task.get("history") if isinstance(task.get("history"), list) else []
    claims = [(entry, _moment(entry.get("at"))) for entry in history
              if isinstance(entry, dict) and entry.get("to") == "doing"]
    first = claims[0][1] if claims else None
    latency = first - created if first is not None and created is not None else None
    duration = None
    if claims and task.get("status") in FINISHED:
        last = claims[-1][1]
        ends = [_moment(entry.get("at")) for entry in history
                if isinstance(entry, dict) and entry.get("to") == task.get("status")]
        if last is not None and ends and ends[-1] is not None and ends[-1] >= last:
            duration = ends[-1] - last
    return (max(0.0, latency) if latency is not None else None), duration


def buckets(values: Iterable[float], bounds: tuple[float, ...]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative histogram buckets of `values` (Prometheus' le labels, +Inf last) and their sum (pure)."""
    values = list(values)
    rows = [(repr(float(bound)), float(sum(1 for value in values if value <= bound))) for bound in bounds]
    return [*rows, ("+Inf", float(len(values)))], float(sum(values))


def gather(ws: Any, board: Any, host: str) -> dict[str, Any]:
    """What the metrics say, read now from the workspace and its board (plain data)."""
    from ..config import doctor
    from ..governance import usage
    from ..views import agentrows
    from . import views

    state, alive = agentrows.supervisor_state(ws.runs_path)
    agents = agentrows.agent_rows(state, alive, ws.runs_path, host)
    listing = board.list()  # the histories (list_fields counts them only); the file board's doccache keeps it cheap
    times = [task_times(task) for task in listing.tasks]
    records, _notes = usage.team_calls(ws.runs_path, lambda: usage.open_board_model_calls(board))
    budgets, _note = views.budget_rows(ws, time.time())
    return {"agents": agents, "counts": board.counts(),
            "claim_latency": [latency for latency, _ in times if latency is not None],
            "duration": [duration for _, duration in times if duration is not None],
            "calls": usage.settle_calls(records), "budgets": budgets,
            "breakers": doctor.breaker_states(ws.runs_path, time.time()), "supervisor": alive,
            "behind": readers_behind(board)}


def families(data: Mapping[str, Any]) -> list[Any]:
    """The metric families of `data` (what gather read), prometheus_client's own types."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    up = GaugeMetricFamily("hermes_sup_supervisor_up", "1 while the team's supervisor runs")
    up.add_metric([], 1.0 if data["supervisor"] else 0.0)
    states = GaugeMetricFamily("hermes_sup_agents", "Agents of this host by state", labels=["state"])
    by_state: dict[str, int] = {}
    for row in data["agents"]:
        by_state[str(row.get("state"))] = by_state.get(str(row.get("state")), 0) + 1
    for name, count in sorted(by_state.items()):
        states.add_metric([name], float(count))
    agent = GaugeMetricFamily("hermes_sup_agent_state", "1 for each agent's current state", labels=["agent", "state"])
    restarts = CounterMetricFamily("hermes_sup_agent_restarts", "Restarts of each agent by its supervisor",
                                   labels=["agent"])
    for row in data["agents"]:
        agent.add_metric([str(row["name"]), str(row.get("state"))], 1.0)
        restarts.add_metric([str(row["name"])], float(row.get("restarts") or 0))
    tasks = GaugeMetricFamily("hermes_sup_tasks", "Tasks on the board by status", labels=["status"])
    for status, count in sorted(data["counts"].items()):
        tasks.add_metric([str(status)], float(count))
    latency = HistogramMetricFamily("hermes_sup_task_claim_latency_seconds",
                                    "From a task's creation to its first claim, tasks on the board")
    latency.add_metric([], *buckets(data["claim_latency"], CLAIM_BUCKETS))
    duration = HistogramMetricFamily("hermes_sup_task_duration_seconds",
                                     "From a finished task's last claim to its close, tasks on the board")
    duration.add_metric([], *buckets(data["duration"], DURATION_BUCKETS))
    calls = CounterMetricFamily("hermes_sup_model_calls", "Model calls", labels=["provider", "model", "outcome"])
    tokens = CounterMetricFamily("hermes_sup_model_tokens", "Tokens of model calls",
                                 labels=["provider", "model", "kind"])
    cost = CounterMetricFamily("hermes_sup_model_cost_usd", "Cost of model calls (US dollars)",
                               labels=["provider", "model"])
    counted: dict[tuple[str, str, str], float] = {}
    used: dict[tuple[str, str, str], float] = {}
    spent: dict[tuple[str, str], float] = {}
    for _agent, record in data["calls"]:
        key = (label(record.get("provider")), label(record.get("model")))
        outcome = label(record.get("outcome"))
        counted[(*key, outcome)] = counted.get((*key, outcome), 0.0) + 1
        for kind, field in (("input", "tokens_in"), ("output", "tokens_out"), ("cached", "tokens_cached")):
            value = record.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                used[(*key, kind)] = used.get((*key, kind), 0.0) + value
        value = record.get("cost_usd")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value > 0:
            spent[key] = spent.get(key, 0.0) + float(value)
    for labels, value in sorted(counted.items()):
        calls.add_metric(list(labels), value)
    for labels, value in sorted(used.items()):
        tokens.add_metric(list(labels), value)
    for pair, value in sorted(spent.items()):
        cost.add_metric(list(pair), value)
    budget_spent = GaugeMetricFamily("hermes_sup_budget_spent_usd", "Spent against each budget cap",
                                     labels=["scope", "cap"])
    budget_limit = GaugeMetricFamily("hermes_sup_budget_limit_usd", "Each budget cap", labels=["scope", "cap"])
    for row in data["budgets"]:
        budget_spent.add_metric([str(row["scope"]), str(row["cap"])], float(row["spent"]))
        budget_limit.add_metric([str(row["scope"]), str(row["cap"])], float(row["limit"]))
    breakers = GaugeMetricFamily("hermes_sup_breaker", "1 for each provider breaker of each agent, by level",
                                 labels=["agent", "provider", "level"])
    for name, provider, level, _words in data["breakers"]:
        breakers.add_metric([label(name), label(provider), label(level)], 1.0)
    behind = GaugeMetricFamily("hermes_sup_events_behind", "Events of the board's log a reader of this process "
                               f"has yet to read (at most {BEHIND_MAX}; of a kind's readers, the one furthest behind)",
                               labels=["reader"])
    for name, count in sorted(data.get("behind", {}).items()):
        behind.add_metric([name], float(count))
    return [up, states, agent, restarts, tasks, latency, duration, calls, tokens, cost, budget_spent, budget_limit,
            breakers, behind]


def exposition(data: Mapping[str, Any]) -> tuple[bytes, str]:
    """`data` in Prometheus' text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    class Snapshot:
        def collect(self) -> Iterable[Any]:
            return families(data)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot())  # type: ignore[arg-type]
    return generate_latest(registry), CONTENT_TYPE_LATEST


def route(dash: Any) -> Any:
    """GET /metrics of the dashboard, behind its access rules (its Guard sees every request)."""
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def metrics(request: Request) -> Response:
        def read() -> tuple[bytes, str]:
            with dash.lock:  # one board call at a time from the dashboard's threads
                data = gather(dash.ws, dash.board, dash.host)
            return exposition(data)

        body, kind = await asyncio.to_thread(read)
        return Response(body, media_type=kind, headers={"Cache-Control": "no-store"})

    return Route("/metrics", metrics)


class MetricsServer:
    """/metrics alone, for a team without the dashboard (`metrics: {port}`): the dashboard's Guard in
    front of it, so the same access rules hold (loopback and the same user, no token)."""

    def __init__(self, ws: Any, host: str, port: int) -> None:
        import socket
        import threading

        import uvicorn
        from starlette.applications import Starlette

        from ..config.workspace import board_settings, open_workspace_board
        from .app import Guard, Settings, bind
        from .security import check_bind

        check_bind(host, None, None)  # BindError: beyond loopback it would need a token, which metrics: has not
        self.ws, self.lock = ws, threading.Lock()
        self.sock = bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.board = open_workspace_board(ws)
        self.host = board_settings(ws)[1] or socket.gethostname()  # this host's name on the board
        app = Guard(Starlette(routes=[route(self)]), Settings(host=host, port=self.port))  # type: ignore[arg-type]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                    server_header=False, timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.sock.close()
            self.board.close()

    def start_thread(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=5)


def serve_metrics(ws: Any, config: Mapping[str, Any], say: Callable[[str], None]) -> MetricsServer | None:
    """The metrics server hermes.yaml's `metrics: {port}` asks for, started, or None when it asks for none."""
    section = config.get("metrics") or {}
    if section.get("port") is None:
        return None
    from ..cli.common import Failure
    from .security import BindError

    host = str(section.get("host") or "127.0.0.1")
    try:
        server = MetricsServer(ws, host, int(section["port"]))
    except BindError as exc:
        raise Failure(f"metrics: {exc}", 2) from None
    except OSError as exc:
        raise Failure(f"metrics: cannot listen on {host}:{section['port']}: {exc.strerror or exc}") from None
    server.start_thread()
    say(f"metrics: http://{f'[{host}]' if ':' in host else host}:{server.port}/metrics")
    return server
