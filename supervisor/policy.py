"""Restart decisions, as pure functions of what happened (no processes, no clock of their own).

Modelled on Erlang/OTP's supervisor: a child that crashes more than `max_restarts` times within
`window` seconds is given up on (`fatal`), since restarting it again only burns money. Within that
limit, the first crash of a child that had been healthy is restarted at once and repeated crashes
back off exponentially with jitter, from `initial` up to `max`; a run that lasts `reset_after`
seconds clears the backoff (PM2 resets after 30 s).
"""

from __future__ import annotations

import errno
import random
from dataclasses import dataclass, field, replace
from typing import Literal

POLICIES = ("always", "on-failure", "never")


@dataclass(frozen=True)
class RestartSpec:
    policy: str = "on-failure"
    initial: float = 0.5
    max: float = 30.0
    max_restarts: int = 5
    window: float = 60.0
    reset_after: float = 30.0


@dataclass(frozen=True)
class RestartHistory:
    """What the decision needs to remember about a child between its exits."""

    crashes: tuple[float, ...] = ()  # times of the crashes inside the current window
    streak: int = 0                  # crashes since the child last ran healthily


@dataclass(frozen=True)
class Decision:
    action: Literal["restart", "fatal", "stop"]
    delay: float = 0.0
    reason: str = ""
    history: RestartHistory = field(default_factory=RestartHistory)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "vanished"
    if returncode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def backoff_delay(spec: RestartSpec, streak: int, rng: random.Random) -> float:
    """Delay before restart number `streak` of a crash streak: 0 for the first, then
    initial * 2^(n-2) capped at max, with equal jitter (half fixed, half random)."""
    if streak <= 1:
        return 0.0
    base = min(spec.max, spec.initial * 2 ** (streak - 2))
    return base / 2 + rng.uniform(0, base / 2)


def decide(
    spec: RestartSpec,
    history: RestartHistory,
    *,
    now: float,
    returncode: int | None,
    uptime: float,
    rng: random.Random,
    crashed: bool | None = None,
    how: str | None = None,
) -> Decision:
    """What to do when a child exits on its own, or was killed as hung or over its memory (`crashed`
    True, whatever its status; `how`: its exit as the reason says it). A child stopped by the
    operator, `down` or a reload is never decided here."""
    how = how or describe_exit(returncode)
    crashed = returncode != 0 if crashed is None else crashed
    if spec.policy == "never" or (spec.policy == "on-failure" and not crashed):
        return Decision("stop", reason=f"{how}; restart policy {spec.policy}", history=history)
    streak = 0 if uptime >= spec.reset_after else history.streak
    crashes = (*(t for t in history.crashes if now - t <= spec.window), now)
    streak += 1
    updated = RestartHistory(crashes=crashes, streak=streak)
    if len(crashes) > spec.max_restarts:
        return Decision(
            "fatal",
            reason=f"{how}; {len(crashes)} crashes within {spec.window:g} s (limit {spec.max_restarts}): giving up "
                   f"until `hermes-sup restart`",
            history=updated,
        )
    delay = backoff_delay(spec, streak, rng)
    return Decision("restart", delay=delay, reason=f"{how}; restart in {delay:.2f} s", history=updated)


def cleared(history: RestartHistory) -> RestartHistory:
    """A manual restart: forgets the crash count and the backoff (it is not a crash)."""
    return replace(history, crashes=(), streak=0)


# Errors of spawning that say the machine is short of something for now (descriptors, processes,
# memory, disk): the start is retried with backoff for as long as it takes, never given up on.
TRANSIENT_START_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ENOSPC,
                                    errno.EDQUOT, errno.ENOBUFS})


def decide_failed_start(spec: RestartSpec, history: RestartHistory, *, now: float, error: str,
                        err: int | None, rng: random.Random) -> Decision:
    """What to do when an agent could not even be spawned. Never at once (the cause is likely still
    there); a shortage backs off without limit, any other error (a missing command, say) counts as
    a crash, so a start that can never work ends `fatal` like a crash loop does."""
    streak = history.streak + 1
    delay = max(spec.initial, backoff_delay(spec, streak, rng))
    if err in TRANSIENT_START_ERRNOS:
        return Decision("restart", delay=delay, reason=f"could not start: {error}; retry in {delay:.2f} s",
                        history=replace(history, streak=streak))
    crashes = (*(t for t in history.crashes if now - t <= spec.window), now)
    updated = RestartHistory(crashes=crashes, streak=streak)
    if len(crashes) > spec.max_restarts:
        return Decision("fatal", reason=f"could not start: {error}; {len(crashes)} failures within {spec.window:g} s "
                                        f"(limit {spec.max_restarts}): giving up until `hermes-sup restart`",
                        history=updated)
    return Decision("restart", delay=delay, reason=f"could not start: {error}; retry in {delay:.2f} s", history=updated)


def judge_every(heartbeat_timeout: float, *, least: float = 1.0) -> float:
    """How long the loop may sleep while an agent with this heartbeat_timeout is judged on its
    heartbeats (pure). The loop-gap check credits a stopped supervisor's time to within one sleep,
    so a sleep of at most a quarter of the timeout (agents beat at least that often too) leaves an
    agent whose beats were not read meanwhile judged on at most half its timeout (and the check's
    tolerance); never under `least`. With the default 60 s, the idle loop turns every 15 s, not
    every second."""
    return max(least, heartbeat_timeout / 4)


def loop_gap(*, elapsed: float, expected: float, tolerance: float) -> float:
    """Seconds the supervisor itself did not run (SIGSTOPped, starved, suspended) between two turns of
    its loop: how much longer than its wait a turn took, if clearly longer. That time is nobody's
    silence: an agent whose heartbeats were not read meanwhile is judged on the rest."""
    over = elapsed - expected
    return over if over > tolerance else 0.0


def beats_only(ready: list[int], notify: int, *, dirty: bool, now: float, soonest: float) -> bool:
    """Whether a turn of the loop woke for heartbeats alone, before any deadline and with nothing to
    write: a beat only moves its agent's deadline later, so the turn has nothing to judge (pure).
    20 idle agents beat 4 times a second, and judging every agent at each beat was most of an idle
    supervisor's CPU."""
    return bool(ready) and all(fd == notify for fd in ready) and not dirty and now < soonest
