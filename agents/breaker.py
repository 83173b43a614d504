"""A circuit breaker per provider: a pure state machine over plain data, kept and saved by ProviderHealth.

closed: calls go through; failures in a row are counted. A refused connection, a rate limit past the
chain's retries, a rejected key, an exhausted quota or a misconfigured endpoint open it at once (the
server told us it cannot serve); `threshold` failures in a row of other kinds (timeouts, server
errors, answers cut or unreadable) open it too. open: no call goes out until `until`, a cooldown that
doubles with each opening in a row, spread by jitter so a team's agents do not knock again in step,
and never shorter than a retry-after. half_open: once the cooldown is over one call, the probe, goes
out; its answer closes the breaker, its failure opens it again for longer. A probe that never reports
back (its caller was stopped) is given up on after `probe_timeout` and another may go.

Everything here is a function of the breaker, the clock and a random number: tested without a server.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)
MAX_WHY = 300  # characters of a reason kept in the saved state (it comes from a server's error)


@dataclass(frozen=True)
class BreakerPolicy:
    base: float = 5.0      # seconds of the first opening, doubling with each opening in a row
    cap: float = 300.0
    jitter: float = 0.2    # +/- this fraction of the cooldown
    threshold: int = 3     # failures in a row (timeouts, server errors) that open the breaker
    probe_timeout: float = 300.0  # a half-open probe not heard from after this: another may go


@dataclass(frozen=True)
class Breaker:
    state: str = CLOSED
    failures: int = 0      # failures in a row since the last answer
    opened: int = 0        # openings in a row since the last answer: the cooldown doubles with it
    until: float = 0.0     # open: when the probe may go
    why: str = ""          # the last failure, in words ("unreachable", "rate limited", ...)
    probe_at: float = 0.0  # half-open: when the probe went out


def outage_event(before: Breaker, after: Breaker) -> str | None:
    """The event a change of breaker says for alerts and the events stream: `provider_down` when a
    closed breaker opens, `provider_up` when an open or half-open one closes, else None (a failed
    probe re-opening it is the same outage, not a new one)."""
    if before.state == CLOSED and after.state == OPEN:
        return "provider_down"
    if before.state != CLOSED and after.state == CLOSED:
        return "provider_up"
    return None


def cooldown_delay(openings: int, policy: BreakerPolicy, rand: float) -> float:
    """Seconds a breaker opened `openings` times in a row stays open: `base` doubling up to `cap`,
    spread by +/- `jitter` with `rand` in [0, 1)."""
    if openings <= 0:
        return 0.0
    delay = min(policy.cap, policy.base * 2 ** min(openings - 1, 32))
    return delay * (1 - policy.jitter + 2 * policy.jitter * rand)


def admit(breaker: Breaker, now: float, policy: BreakerPolicy) -> tuple[Breaker, bool]:
    """Whether a call may go out now, and the breaker after deciding so: an open breaker whose
    cooldown is over turns half-open and lets this one call through as its probe."""
    if breaker.state == CLOSED:
        return breaker, True
    if breaker.state == OPEN:
        if now < breaker.until:
            return breaker, False
        return dataclasses.replace(breaker, state=HALF_OPEN, probe_at=now), True
    if now - breaker.probe_at >= policy.probe_timeout:  # the probe's caller never came back
        return dataclasses.replace(breaker, probe_at=now), True
    return breaker, False


def failed(breaker: Breaker, now: float, policy: BreakerPolicy, rand: float, *, why: str, at_once: bool,
           at_least: float = 0.0) -> Breaker:
    """The breaker after a call failed for the provider's sake (`why`). It opens when the failure
    says the provider cannot serve (`at_once`), when a half-open probe fails, or at `threshold`
    failures in a row; open, it stays so for its cooldown, and at least `at_least` seconds."""
    failures = breaker.failures + 1
    if not (at_once or breaker.state == HALF_OPEN or failures >= policy.threshold):
        return dataclasses.replace(breaker, failures=failures, why=why[:MAX_WHY])
    opened = breaker.opened + 1
    delay = max(at_least, cooldown_delay(opened, policy, rand))
    return Breaker(state=OPEN, failures=failures, opened=opened, until=now + delay, why=why[:MAX_WHY])


def answered(_breaker: Breaker) -> Breaker:
    """The breaker after the provider answered (a probe or any call): closed, its counts reset."""
    return Breaker()


def released(breaker: Breaker, now: float) -> Breaker:
    """The breaker after a probe ended without a verdict (its caller was stopped): open, with the
    probe due at once, so the next call probes rather than waiting out `probe_timeout`."""
    if breaker.state != HALF_OPEN:
        return breaker
    return dataclasses.replace(breaker, state=OPEN, until=now)


def blocked(breaker: Breaker, now: float, policy: BreakerPolicy) -> tuple[float, str] | None:
    """Until when no call may go out, and why, or None when one may now (without changing it)."""
    if breaker.state == OPEN and now < breaker.until:
        return breaker.until, breaker.why
    if breaker.state == HALF_OPEN and now - breaker.probe_at < policy.probe_timeout:
        return breaker.probe_at + policy.probe_timeout, f"{breaker.why}; a probe is in flight"
    return None


def as_dict(breaker: Breaker) -> dict[str, Any]:
    return dataclasses.asdict(breaker)


def from_dict(data: Any) -> Breaker | None:
    """A breaker read back from its saved state (a file anyone with access to runs/ could have
    written), or None when it is not one: wrong types, a state we do not know, numbers not finite."""
    if not isinstance(data, Mapping) or data.get("state") not in STATES:
        return None
    counts = [data.get(key, 0) for key in ("failures", "opened")]
    moments = [data.get(key, 0.0) for key in ("until", "probe_at")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 31 for n in counts):
        return None
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in moments):
        return None
    why = data.get("why", "")
    return Breaker(state=str(data["state"]), failures=counts[0], opened=counts[1], until=float(moments[0]),
                   why=why[:MAX_WHY] if isinstance(why, str) else "", probe_at=float(moments[1]))


def label(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def describe(breaker: Breaker, now: float) -> tuple[str, str]:
    """A breaker's state for `doctor`: (level, words)."""
    if breaker.state == CLOSED:
        return ("ok", "closed") if not breaker.failures else (
            "info", f"closed, {breaker.failures} failure(s) in a row (last: {breaker.why})")
    if breaker.state == OPEN and now < breaker.until:
        return "warn", f"open: down until {label(breaker.until)} ({breaker.why})"
    if breaker.state == OPEN:
        return "info", f"open, cooldown over: the next call probes it (last: {breaker.why})"
    return "info", f"half-open: a probe went out at {label(breaker.probe_at)} (last: {breaker.why})"


def saved_states(saved: Mapping[str, Any], now: float) -> list[tuple[str, str, str, str]]:
    """(agent, provider, level, words) for `doctor` (pure), from each agent's saved breakers (`saved`:
    agent name -> the document ProviderHealth writes); what cannot be read is said, not raised."""
    rows = []
    for agent, document in sorted(saved.items()):
        breakers = document.get("breakers") if isinstance(document, Mapping) else None
        if not isinstance(breakers, Mapping):
            rows.append((agent, "-", "warn", "its breakers' file cannot be read"))
            continue
        saved_at = document.get("saved_at")
        as_of = f" (as of {saved_at[:40]})" if isinstance(saved_at, str) else ""
        for provider, data in sorted(breakers.items(), key=lambda item: str(item[0])):
            breaker = from_dict(data)
            if breaker is None:
                rows.append((agent, str(provider)[:80], "warn", "a breaker that cannot be read"))
                continue
            level, words = describe(breaker, now)
            rows.append((agent, str(provider)[:80], level, words + (as_of if breaker.state != CLOSED else "")))
    return rows
