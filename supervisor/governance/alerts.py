"""Alerts (contract section 11): events of the stream that a person must hear of, POSTed to webhooks.

`alerts:` in hermes.yaml names, per webhook, the environment variables holding its URL and its
signing secret and the alerts it wants. Which event is which alert is a pure function of the event
(alert_for); a thread of the supervisor tails events.jsonl from where it stood when the supervisor
started, and POSTs each alert as JSON signed with HMAC-SHA256 over the body
(`X-Hermes-Sup-Signature: sha256=<hex>`), retrying with backoff; each attempt and its outcome is
appended to the same log (`kind: "alert"`). The URL and the secret live only in this process's
memory: they are registered with kanban/redact.py so that no line written anywhere carries them,
and the events name the variable, never the value. A dead or slow webhook costs this thread time
only (bounded attempts, a bounded queue): the supervisor's loop never waits for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import random
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...kanban import BoardStore
from ...kanban.events import AGENT_EVENTS
from ...kanban.redact import remember
from ...kanban.task import now_iso
from ..readers import track_reader

ALERTS = ("agent_fatal", "agent_orphaned", "task_failed", "task_blocked", "budget_reached", "provider_down",
          "provider_up")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
SIGNATURE_HEADER = "X-Hermes-Sup-Signature"
MAX_ATTEMPTS = 5
FIRST_DELAY = 1.0  # seconds before the first retry; doubled for each next one (with jitter)
MAX_DELAY = 30.0
ATTEMPT_TIMEOUT = 5.0  # seconds one POST may take, connecting included
QUEUE_LIMIT = 200  # alerts waiting to be sent; beyond, the oldest is dropped (and that is recorded)
POLL = 0.25  # seconds between looks at the log's size


# -- configuration (checked by workspace.load_config) ------------------------------------------------

@dataclass(frozen=True)
class AlertRule:
    webhook_env: str
    secret_env: str
    on: frozenset[str]


def bare_on(raw: Mapping[str, Any]) -> None:
    """YAML 1.1 (PyYAML) reads a bare `on` as the boolean true: each webhook's key, as written, is
    given back its name, before anything checks the keys."""
    alerts = raw.get("alerts")
    for entry in alerts if isinstance(alerts, list) else ():
        if isinstance(entry, dict) and True in entry and "on" not in entry:
            entry["on"] = entry.pop(True)


def check_alerts(raw: Mapping[str, Any], fail: Callable[[Any, str], Exception]) -> None:
    """Raise fail(node, message) (file:line) for the first problem of `alerts:` that its schema
    (config/schema.py, checked first: a list of mappings with known keys) cannot say."""
    alerts = raw.get("alerts")
    if alerts is None:
        return
    bare_on(raw)
    for entry in alerts:
        for key in ("webhook_env", "secret_env"):
            value = entry.get(key)
            if not isinstance(value, str) or not ENV_NAME.fullmatch(value):
                # Never echoed: a URL or a secret written here by mistake must not reach a log either.
                raise fail(entry, f"alerts: '{key}' must name an environment variable (letters, digits, '_'); "
                                  f"the {'URL' if key == 'webhook_env' else 'secret'} itself goes in that variable, "
                                  f"never in hermes.yaml")
        on = entry.get("on")
        if not isinstance(on, list) or not on or not all(isinstance(item, str) for item in on):
            raise fail(entry, f"alerts: 'on' must list the alerts to send, of {', '.join(ALERTS)}")
        for item in on:
            if item not in ALERTS:
                raise fail(entry, f"alerts: unknown alert {item[:60]!r} in 'on'; alerts are {', '.join(ALERTS)}")


def rules_of(config: Mapping[str, Any]) -> list[AlertRule]:
    """The webhooks of a checked configuration (pure)."""
    return [AlertRule(entry["webhook_env"], entry["secret_env"], frozenset(entry["on"]))
            for entry in config.get("alerts") or ()]


# -- decisions (pure) -------------------------------------------------------------------------------

def alert_for(record: Mapping[str, Any]) -> str | None:
    """The alert an event of the stream raises, or None (pure). The alerts' own events raise none,
    so a failing webhook can never feed itself."""
    kind = record.get("kind", "board")
    if kind == "alert":
        return None
    if kind == "board":
        return {"failed": "task_failed", "blocked": "task_blocked"}.get(str(record.get("to")))
    event = record.get("event")
    if kind == "supervisor" and event in ("fatal", "orphaned"):
        return f"agent_{event}"
    if kind == "agent" and event in AGENT_EVENTS:
        return str(event)
    return None


def alert_body(alert: str, cursor: int, record: Mapping[str, Any], workspace: str) -> bytes:
    """The JSON posted (pure): the alert, the event that raised it, and its cursor (an id a receiver
    can deduplicate retries by, and resume `events --since` from)."""
    doc = {"alert": alert, "cursor": cursor, "workspace": workspace, "event": dict(record)}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, body: bytes) -> str:
    """The value of X-Hermes-Sup-Signature for `body` (pure)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def retry_delay(attempt: int, rng: random.Random) -> float:
    """Seconds before attempt `attempt + 1`, after `attempt` failed: doubling, with equal jitter."""
    base = min(MAX_DELAY, FIRST_DELAY * 2 ** (attempt - 1))
    return base / 2 + rng.uniform(0, base / 2)


def exposed(started_with: Mapping[str, Collection[str] | None], withheld: Collection[str]) -> list[str]:
    """The agents whose environment holds a variable no agent may be given (pure): started before a
    reload (or by a previous supervisor) named it a webhook's. `started_with` maps an agent to the names
    of its environment, None when they are not known (then it may hold them)."""
    names = set(withheld)
    if not names:
        return []
    return sorted(agent for agent, env in started_with.items() if env is None or names & set(env))


def worth_retrying(status: int | None) -> bool:
    """A refused connection, a timeout, a 5xx, 408 or 429 may pass; another 4xx will not (pure)."""
    return status is None or status >= 500 or status in (408, 429)


# -- delivery ---------------------------------------------------------------------------------------

@dataclass
class Pending:
    alert: str
    cursor: int
    body: bytes
    rule: AlertRule
    attempt: int = 0
    due: float = 0.0


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """POST `body`; the HTTP status (None: no answer) and a short outcome free of the URL. The whole
    attempt takes at most about `timeout`: a socket's timeout bounds each read only, and a webhook
    that answers a byte at a time would hold the alerts thread (every webhook's alerts) for ever."""
    # Imported here: every command checks hermes.yaml (and so imports this module), only `up` posts.
    import http.client
    import ssl
    import urllib.error
    import urllib.request

    opened: list[socket.socket] = []
    cut = threading.Event()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # a redirect is an answer of its own (a failure), never a second POST elsewhere

    class Plain(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            opened.append(self.sock)

    class PlainHandler(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(Plain, req)

    class Recorded(ssl.SSLSocket):
        def do_handshake(self, block: bool = False) -> None:
            opened.append(self)  # before the handshake, which a webhook can drip too
            super().do_handshake(block)

    def stop() -> None:
        cut.set()
        for sock in list(opened):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the reading thread sees the end

    context = ssl.create_default_context()
    context.sslsocket_class = Recorded
    opener = urllib.request.build_opener(NoRedirect, PlainHandler, urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    timer = threading.Timer(timeout, stop)
    timer.daemon = True
    timer.start()
    try:
        with opener.open(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except urllib.error.URLError as exc:
        if cut.is_set():
            return None, f"no answer within {timeout:g} s"
        reason = exc.reason
        text = getattr(reason, "strerror", None) or type(reason).__name__
        return None, f"no answer ({text})"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        if cut.is_set():
            return None, f"no answer within {timeout:g} s"
        return None, f"no answer ({type(exc).__name__})"
    finally:
        timer.cancel()
    if cut.is_set():  # headers ended by our cut read as complete: not an answer
        return None, f"no answer within {timeout:g} s"
    return status, f"HTTP {status}"


@dataclass
class AlertSender:
    """The alerts thread: tails the log, queues the alerts its rules want, sends them with retries."""

    board: BoardStore  # its event stream is what alerts are made of, and where their outcomes go
    rules: list[AlertRule]
    workspace: str
    say: Callable[[str], None]  # called on the loop's thread only (at start and on reload)
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    rng: random.Random = field(default_factory=random.Random)
    queue: list[Pending] = field(default_factory=list)
    dropped: int = 0

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alerts", daemon=True)
        self._missing: set[str] = set()
        self._named: set[str] = set()  # every variable a rule has named since the start
        self._secrets()
        self.cursor = self._end()  # what happened before this supervisor was alerted on then
        self._inode: int | None = None
        self._untrack = track_reader("alerts",  # /metrics
                                     lambda: (self.cursor, self._inode) if self._thread.is_alive() else None)

    def _end(self) -> int:
        try:
            return self.board.events_end()
        except OSError:
            return 0

    def start(self) -> None:
        if self.rules:
            self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop sending (alerts still queued are recorded as not sent); waits at most `timeout`."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._untrack()

    def reconfigure(self, rules: list[AlertRule]) -> None:
        self.rules = rules  # one assignment: the thread reads it whole
        self._secrets()
        if rules and not self._thread.is_alive() and not self._stopping.is_set():
            # The first webhook, added by a reload: alerts from now on, not for what happened before.
            self.cursor, self._inode = self._end(), None
            self._thread.start()

    def env_names(self) -> set[str]:
        """The variables holding the webhooks' URLs and secrets: no agent is given them (an agent's
        shell could print its environment into a transcript on disk). A rule a reload removed still
        counts: its variables are still in this process's environment."""
        return self._named | {name for rule in self.rules for name in (rule.webhook_env, rule.secret_env)}

    def _secrets(self) -> None:
        """Register the values with redact, so no file or log line carries them; say once which
        variable is unset (by name only)."""
        for rule in self.rules:
            self._named |= {rule.webhook_env, rule.secret_env}
            remember([self.env.get(rule.webhook_env, ""), self.env.get(rule.secret_env, "")])
            for name in (rule.webhook_env, rule.secret_env):
                if not self.env.get(name) and name not in self._missing:
                    self._missing.add(name)
                    self.say(f"alerts: ${name} is not set; the alerts of that webhook are recorded as not sent")

    def _record(self, record: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.board.append_event({"at": now_iso(), "kind": "alert", **record})

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._turn()
            except Exception as exc:  # a bug or a hostile log must not end the alerts for good
                self._record({"event": "alert_error", "note": f"{type(exc).__name__}: {str(exc)[:200]}"})
                self._stopping.wait(POLL)
            now = time.monotonic()
            soonest = min((item.due for item in self.queue), default=now + POLL)
            self._stopping.wait(max(0.0, min(POLL, soonest - now)))
        for item in self.queue:
            self._record({"event": "alert_not_sent", "alert": item.alert, "for": str(item.cursor),
                          "attempt": item.attempt, "note": "the supervisor stopped before it was delivered"})
        self.queue.clear()

    def _turn(self) -> None:
        self._read()
        now = time.monotonic()
        for item in [item for item in self.queue if item.due <= now]:
            if self._stopping.is_set():
                return
            self._attempt(item)

    def _read(self) -> None:
        batch = self.board.events_since(self.cursor, max_events=1000, inode=self._inode)
        self.cursor, self._inode = batch.cursor, batch.inode
        for cursor, record in batch.events:
            alert = alert_for(record)
            if alert is None:
                continue
            for rule in self.rules:
                if alert in rule.on:
                    self._enqueue(Pending(alert, cursor, alert_body(alert, cursor, record, self.workspace), rule))

    def _enqueue(self, item: Pending) -> None:
        if len(self.queue) >= QUEUE_LIMIT:
            old = self.queue.pop(0)
            self._record({"event": "alert_dropped", "alert": old.alert, "for": str(old.cursor),
                          "note": f"more than {QUEUE_LIMIT} alerts waiting; the oldest was dropped"})
        self.queue.append(item)

    def _attempt(self, item: Pending) -> None:
        rule = item.rule
        url, secret = self.env.get(rule.webhook_env, ""), self.env.get(rule.secret_env, "")
        base = {"alert": item.alert, "for": str(item.cursor)}
        if not url or not secret:
            self.queue.remove(item)
            unset = rule.webhook_env if not url else rule.secret_env
            self._record({"event": "alert_not_sent", **base, "note": f"${unset} is not set"})
            return
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            self.queue.remove(item)
            self._record({"event": "alert_not_sent", **base, "note": f"${rule.webhook_env} is not an http(s) URL"})
            return
        item.attempt += 1
        headers = {SIGNATURE_HEADER: signature(secret, item.body), "X-Hermes-Sup-Alert": item.alert,
                   "X-Hermes-Sup-Attempt": str(item.attempt)}
        started = time.monotonic()
        status, outcome = post(url, item.body, headers, ATTEMPT_TIMEOUT)
        took = f"{time.monotonic() - started:.2f} s"
        where = f"to ${rule.webhook_env}"
        if status is not None and 200 <= status < 300:
            self.queue.remove(item)
            self._record({"event": "alert_sent", **base, "attempt": item.attempt, "status": status,
                          "note": f"{item.alert} {where}: {outcome} in {took}"})
            return
        if item.attempt >= MAX_ATTEMPTS or not worth_retrying(status):
            self.queue.remove(item)
            self._record({"event": "alert_gave_up", **base, "attempt": item.attempt, "status": status,
                          "note": f"{item.alert} {where}: {outcome}; not retried"
                                  + (f" after {item.attempt} attempts" if item.attempt >= MAX_ATTEMPTS else "")})
            return
        delay = retry_delay(item.attempt, self.rng)
        item.due = time.monotonic() + delay
        self._record({"event": "alert_failed", **base, "attempt": item.attempt, "status": status,
                      "delay": round(delay, 2), "note": f"{item.alert} {where}: {outcome}; retry in {delay:.1f} s"})
