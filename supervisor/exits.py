"""What an agent's exit means, decided as OTP's supervisor decides it (pure): the state it goes to,
its restart history, and the events, as data; the log line is rendered from the same data, and
nothing reads it back.

`why` is the reason the supervisor had stopped it (none: it exited on its own); a hang or memory
kill is a crash whatever the agent's exit status, a stop by the operator, `down`, a removal, a
restart or a reload never is.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..agents.notify import ORPHANED
from .policy import RestartHistory, RestartSpec, decide, decide_failed_start, describe_exit


class Why(StrEnum):
    """Why the supervisor was stopping the agent when it exited."""
    NONE = ""            # it was not: it exited on its own
    STOP = "stop"        # a person stopped it (hermes-sup stop)
    DOWN = "down"        # the team is stopping
    REMOVE = "remove"    # a reload removed it from hermes.yaml
    RESTART = "restart"  # a person restarted it
    RELOAD = "reload"    # a reload changed its spec
    HANG = "hang"        # it stopped heart-beating (or never reported ready)
    MEMORY = "memory"    # it used more than max_rss_mb


class State(StrEnum):
    """An agent's state, as `status` and the dashboard show it."""
    QUEUED = "queued"    # waiting for its turn to start (at most START_AT_ONCE start together)
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FATAL = "fatal"


@dataclass(frozen=True)
class Exit:
    """The decision on one exit. `state` STARTING: start it again now (`restarted`: one more of its
    restarts); BACKOFF: at `restart_at`. `events` are records of the board's stream (without `at`),
    each holding the log line `line` as its note."""
    state: State
    history: RestartHistory
    last_exit: str
    line: str
    events: tuple[dict[str, Any], ...]
    restart_at: float | None = None
    restarted: bool = False


def exit_fields(returncode: int | None) -> dict[str, Any]:
    """How it ended, as event fields: the exit status (`code`, as text) or the signal's name."""
    if returncode is None:
        return {}
    if returncode >= 0:
        return {"code": str(returncode)}
    try:
        return {"signal": signal.Signals(-returncode).name}
    except ValueError:
        return {"signal": f"signal {-returncode}"}


def event(name: str, agent: str | None, line: str, **fields: Any) -> dict[str, Any]:
    """One supervisor event record (the board adds `at` when it is appended)."""
    return {"kind": "supervisor", "event": name, "agent": agent, **{k: v for k, v in fields.items() if v is not None},
            "note": line}


def on_exit(name: str, spec: RestartSpec, history: RestartHistory, why: Why, returncode: int | None, *,
            now: float, uptime: float, held: bool, rng: random.Random) -> Exit:
    """What to do now that agent `name` has exited (`held`: a person stopped it and it stays so)."""
    ended = exit_fields(returncode)
    last = describe_exit(returncode) + (f" ({why})" if why else "")
    if why is Why.STOP and not held:  # started again by hand while it was stopping
        line = f"{name}: {last}; starting again"
        return Exit(State.STARTING, history, last, line, (event("exited", name, line, **ended, why=why.value),
                                                          event("restarting", name, line, delay=0.0)))
    if why in (Why.STOP, Why.DOWN, Why.REMOVE):
        line = f"{name}: stopped, {last}"
        return Exit(State.STOPPED, history, last, line, (event("exited", name, line, **ended, why=why.value),))
    if why in (Why.RESTART, Why.RELOAD):
        line = f"{name}: {last}; restarting"
        return Exit(State.STARTING, history, last, line, (event("exited", name, line, **ended, why=why.value),
                                                          event("restarting", name, line, delay=0.0)),
                    restarted=True)
    decision = decide(spec, history, now=now, returncode=returncode, uptime=uptime, rng=rng,
                      crashed=True if why else None, how=last)
    # It stopped itself, having heard from no supervisor while this one lived: said, and alerted.
    orphaned = (event("orphaned", name, f"{name}: stopped itself, having heard from no supervisor (its heartbeats "
                                        "did not reach this one); it counts as a crash",
                      reason="no supervisor"),) if not why and returncode == ORPHANED else ()
    if decision.action == "fatal":
        line = fatal_line(name, decision.reason)
        return Exit(State.FATAL, decision.history, last, line,
                    (*orphaned, event("fatal", name, line, **ended, why=why.value or None, reason=decision.reason)))
    line = f"{name}: {decision.reason}"
    exited = event("exited", name, line, **ended, why=why.value or None)
    if decision.action == "stop":
        return Exit(State.STOPPED, decision.history, last, line, (*orphaned, exited))
    delay = round(decision.delay, 2)  # as the line says it
    restarting = event("restarting", name, line, delay=delay)
    if decision.delay <= 0:
        return Exit(State.STARTING, decision.history, last, line, (*orphaned, exited, restarting), restarted=True)
    return Exit(State.BACKOFF, decision.history, last, line, (*orphaned, exited, restarting),
                restart_at=now + decision.delay)


def fatal_line(name: str, reason: str) -> str:
    """The log line of an agent given up on: what people and their log filters look for."""
    return f"{name}: FATAL: {reason}"


def on_failed_start(name: str, spec: RestartSpec, history: RestartHistory, error: str, err: int | None, *,
                    now: float, rng: random.Random) -> Exit:
    """What to do when agent `name` could not even be started (`error`, with its errno `err`): a
    failed start of that agent, retried with backoff or fatal, never an error of the supervisor."""
    decision = decide_failed_start(spec, history, now=now, error=error, err=err, rng=rng)
    last = f"could not start: {error}"
    if decision.action == "fatal":
        line = fatal_line(name, decision.reason)
        return Exit(State.FATAL, decision.history, last, line, (event("fatal", name, line, reason=decision.reason),))
    line = f"{name}: {decision.reason}"
    return Exit(State.BACKOFF, decision.history, last, line,
                (event("start_failed", name, line, delay=round(decision.delay, 2), reason=last),),
                restart_at=now + decision.delay)
