"""The circuit breakers of an agent's providers, shared by its threads and saved for `doctor`."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..kanban.fsio import write_json_atomic
from .breaker import Breaker, BreakerPolicy, admit, answered, as_dict, blocked, failed, label, outage_event, released

# The cooldown's policy was the breaker's before the breaker had a state machine of its own.
CooldownPolicy = BreakerPolicy
DEFAULT_BREAKER = BreakerPolicy()
# Failures that open a breaker only at `threshold` in a row: the provider answered badly or late,
# which one call cannot tell from a bad moment.
COUNTED = {"timeout": "timing out", "server": "failing (server errors)", "truncated": "cutting its answers",
           "bad_response": "answering what cannot be read"}
BREAKERS_FILE = "providers.json"  # in the agent's working directory, for doctor


def retry_label(moment: float) -> str:
    return label(moment)


class ProviderHealth:
    """The circuit breakers of an agent's providers (see breaker.py), shared by its threads, and
    saved to `path` (atomically, on every change of state) for `doctor` to show. A task never spends
    an attempt on an open breaker: the chain skips that provider, and a chain with nothing else to
    try ends in an "unreachable" error that gives the task back."""

    def __init__(self, policy: BreakerPolicy = DEFAULT_BREAKER, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, path: Path | None = None,
                 on_outage: Callable[[str, str, Breaker], None] | None = None) -> None:
        self.policy = policy
        # Told (provider, "provider_down" | "provider_up", breaker) when an outage starts or ends.
        self.on_outage = on_outage
        self.clock = clock
        self.rng = rng or random.Random()
        self.path = path
        self.breakers: dict[str, Breaker] = {}
        self._lock = threading.Lock()
        if path is not None:
            self._save()  # a fresh start (or a new key): no stale open breaker left for doctor

    def _set(self, name: str, breaker: Breaker) -> Breaker:
        before = self.breakers.get(name, Breaker())
        if before != breaker:
            self.breakers[name] = breaker
            self._save()
            event = outage_event(before, breaker)
            if event and self.on_outage is not None:
                with contextlib.suppress(Exception):  # telling of an outage must never stop a call
                    self.on_outage(name, event, breaker)
        return breaker

    def _save(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(OSError):  # doctor's view must never stop a call
            write_json_atomic(self.path, {"saved_at": label(self.clock()), "breakers": {
                name: as_dict(breaker) for name, breaker in sorted(self.breakers.items())}}, fsync=False)

    def admit(self, name: str) -> tuple[float, str] | None:
        """None when a call to `name` may go out now (a half-open breaker's one probe included),
        else until when it may not and why."""
        with self._lock:
            now = self.clock()
            breaker, allowed = admit(self.breakers.get(name, Breaker()), now, self.policy)
            self._set(name, breaker)
            return None if allowed else blocked(breaker, now, self.policy) or (now, breaker.why)

    def failed(self, name: str, why: str, *, at_once: bool, at_least: float = 0.0) -> Breaker:
        with self._lock:
            return self._set(name, failed(self.breakers.get(name, Breaker()), self.clock(), self.policy,
                                          self.rng.random(), why=why, at_once=at_once, at_least=at_least))

    def refused(self, name: str, why: str = "unreachable", at_least: float = 0.0) -> float:
        """Note a refusal that opens the breaker at once; returns when the provider may be tried
        again: after its cooldown, and never before `at_least` seconds (a retry-after)."""
        return self.failed(name, why, at_once=True, at_least=at_least).until

    def answered(self, name: str) -> None:
        with self._lock:
            self._set(name, answered(self.breakers.get(name, Breaker())))

    def release(self, name: str) -> None:
        """A call (maybe the probe) ended without a verdict: stopped by us."""
        with self._lock:
            self._set(name, released(self.breakers.get(name, Breaker()), self.clock()))

    def cooling(self, name: str) -> tuple[float, str] | None:
        """When a provider may be tried again and why not now, or None when it may be tried now."""
        with self._lock:
            return blocked(self.breakers.get(name, Breaker()), self.clock(), self.policy)

