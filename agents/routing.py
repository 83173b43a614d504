"""Which provider serves a call: the `auto` strategy, and tiers as ordered fallback chains.

`auto` looks for an API key in the environment first (Anthropic, OpenAI, OpenRouter), then for a
local OpenAI-compatible server on its usual port (Ollama 11434, LM Studio 1234, vLLM 8000,
llama.cpp 8080 and 9931, probed at /v1/models), and otherwise answers None: offline, where only
tasks with `steps` can run. A server that accepts the connection but is slow to list its models
is there, busy (llama-server answers nothing while it evaluates a prompt): it is taken, its model
unknown. The decision is a pure function of the environment and the probe's answers.

A port is probed only if the server listening there runs as our own user (its owner read from
/proc/net/tcp): on a shared machine anyone can start a "model server" on 11434 and read every
prompt sent to it. A server of another user is used only if hermes.yaml names it (a provider
whose base_url is that port). `HERMES_SUP_AUTO_PORTS` (comma-separated; empty: none) replaces
the list of ports.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..kanban.parse import load_json
from .providers import ProviderConfig

KEYED = (
    ("ANTHROPIC_API_KEY", "anthropic", None, "claude-sonnet-4-5"),
    ("OPENAI_API_KEY", "openai", None, "gpt-4o-mini"),
    ("OPENROUTER_API_KEY", "openai", "https://openrouter.ai/api/v1", "openrouter/auto"),
)
LOCAL_PORTS = ((11434, "ollama"), (1234, "lm-studio"), (8000, "vllm"), (8080, "llama.cpp"), (9931, "llama.cpp"))
PROBE_TIMEOUT = 0.3                # to connect: a local port refuses at once when nothing listens
REACH_TIMEOUT = 2.0
PROBE_DEADLINE = 2.0               # a whole probe, however the server answers
# How long auto keeps its answer: a server found is asked again a minute later; a miss, or a busy
# server whose model is not known yet, sooner (a server started or freed meanwhile is found soon).
AUTO_KEEP_FOUND = 60.0
AUTO_KEEP_MISS = 10.0
BUSY_MODEL = "default"             # llama-server and llama-cpp-python serve one model, whatever is asked
MAX_PROBE_BYTES = 4 << 20          # a list of models; real ones are a few KiB
# A call's timeout unless hermes.yaml sets one. A local CPU server answers one request at a time: a
# call waits behind every other agent's in its queue (a minute each on 2 cores), which 120 s does
# not cover; a cloud API answers at once or not at all.
CLOUD_TIMEOUT = 120.0
LOCAL_TIMEOUT = 600.0


def probe_models(base_url: str, timeout: float = PROBE_TIMEOUT) -> list[str] | None:
    """The model ids an OpenAI-compatible server lists, or None if nothing (usable) answers there.

    Bounded whatever the server does: its answer is read up to MAX_PROBE_BYTES and parsed with the
    board's bounded JSON loader, the whole probe ends within PROBE_DEADLINE (a server that trickles
    its body a byte at a time is given up on; its thread ends with the connection), and no proxy is
    asked: a deeply nested, endless or trickling list of models must not crash or hang the agent
    that looks for a provider at its start. `timeout` bounds the connection; a server that accepts
    it but sends no answer within PROBE_DEADLINE is busy, not absent: [BUSY_MODEL]."""
    found: list[list[str] | None] = []
    worker = threading.Thread(target=lambda: found.append(_probe(base_url, timeout, time.monotonic() + PROBE_DEADLINE)),
                              name="probe", daemon=True)
    worker.start()
    worker.join(PROBE_DEADLINE + timeout + 1.0)
    return found[0] if found else None


def _probe(base_url: str, timeout: float, deadline: float) -> list[str] | None:
    try:
        url = urllib.parse.urlsplit(base_url)
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=timeout):
            pass  # someone listens: from here on, silence means busy
    except (OSError, ValueError):
        return None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{base_url.rstrip('/')}/models", timeout=max(0.05, deadline - time.monotonic())) as response:
            body = bytearray()
            while chunk := response.read1(64 * 1024):  # one receive at a time: the deadline is checked
                body += chunk
                if len(body) > MAX_PROBE_BYTES or time.monotonic() > deadline:
                    return None
        data = load_json(body.decode("utf-8")) if body.strip() else {}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return [BUSY_MODEL] if _timed_out(exc) else None
    models = data.get("data") if isinstance(data, dict) else None
    return [str(m.get("id")) for m in models if isinstance(m, dict) and m.get("id")] if isinstance(models, list) else []


def _timed_out(exc: BaseException) -> bool:
    """Whether a failed request waited for an answer that did not come (rather than was refused)."""
    reason = getattr(exc, "reason", exc) if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, TimeoutError)


def keep_auto(found: ProviderConfig | None) -> float:
    """Seconds auto's answer is kept before the ports are probed again (pure): a miss, or a busy
    server whose model is not known, is looked at again sooner than a server found."""
    return AUTO_KEEP_FOUND if found is not None and found.model != BUSY_MODEL else AUTO_KEEP_MISS


def not_found_hint(kind: str) -> str:
    """What a 404 from a provider's model list says about its base_url (pure)."""
    if kind == "anthropic":
        return "not found (does base_url stop at the server's root? the anthropic SDK adds /v1 itself)"
    return "not found (does base_url end in /v1?)"


def reach(config: ProviderConfig, timeout: float = REACH_TIMEOUT) -> tuple[str, str | None]:
    """How a provider's server answers one short GET of its model list, without a key and around any
    proxy: ("reachable", None), ("unreachable", why), ("busy", why) for a server that accepts the
    connection but sends no answer within `timeout` (llama-server says nothing while it evaluates a
    prompt: it is there, and its calls will be answered), or ("misconfigured", why) for a 404, which a
    server gives when the base_url misses its API's path (usually /v1): every call would fail so.
    Any other HTTP answer (401 included) means the API is there. A provider without a base_url (the
    SDK's cloud endpoint) is not probed: reachable."""
    if not config.base_url:
        return "reachable", None
    path = "/v1/models" if config.kind == "anthropic" else "/models"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{config.base_url.rstrip('/')}{path}", timeout=timeout):
            return "reachable", None
    except urllib.error.HTTPError as exc:
        return ("misconfigured", not_found_hint(config.kind)) if exc.code == 404 else ("reachable", None)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if _timed_out(exc) and _listens(config.base_url, timeout):
            return "busy", busy_hint(timeout)
        reason = getattr(exc, "reason", None) or exc
        return "unreachable", str(reason) or type(reason).__name__


def busy_hint(waited: float) -> str:
    """What a server that accepts connections but does not list its models in time is (pure)."""
    return (f"it accepts connections but did not list its models within {waited:g} s (llama-server answers "
            "nothing while it evaluates a prompt); its calls wait for it")


def _listens(base_url: str, timeout: float) -> bool:
    """Whether something accepts a connection at base_url's host and port: a timed-out request to a
    server that does is a busy server, not a dead one (whose address drops or refuses the connection)."""
    try:
        url = urllib.parse.urlsplit(base_url)
        port = url.port or (443 if url.scheme == "https" else 80)
        with socket.create_connection((url.hostname or "127.0.0.1", port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def unreachable(config: ProviderConfig, timeout: float = REACH_TIMEOUT) -> str | None:
    """Why a provider's server cannot be reached, or None when a server answers (see reach)."""
    state, why = reach(config, timeout)
    return why if state == "unreachable" else None


def resolve_auto(env: Mapping[str, str], probe: Callable[[str], list[str] | None] = probe_models,
                 host: str = "127.0.0.1", ports: tuple[tuple[int, str], ...] | None = None, *,
                 owners: Callable[[int], set[int] | None] | None = None, uid: int | None = None,
                 configured: Iterable[int] = (), config: Mapping[str, Any] | None = None,
                 notes: list[str] | None = None) -> ProviderConfig | None:
    """The provider `auto` stands for. A local server is taken only if it runs as `uid` (ours) or
    its port is `configured` (or named by a provider of `config`, hermes.yaml). `notes`, when given,
    receives a line per server passed over and, last, what auto settled on (see describe): what the
    agent logs and doctor shows."""
    ports = auto_ports(env) if ports is None else ports
    passed_over: list[str] = []
    found = _resolve(env, probe, host, ports, owners or listening_owners, os.getuid() if uid is None else uid,
                     frozenset(configured) | configured_ports(config or {}), passed_over)
    if notes is not None:
        notes += [*passed_over, describe(found, ports)]
    return found


def _resolve(env: Mapping[str, str], probe: Callable[[str], list[str] | None], host: str,
             ports: tuple[tuple[int, str], ...], owners: Callable[[int], set[int] | None], our_uid: int,
             configured: frozenset[int], notes: list[str]) -> ProviderConfig | None:
    for variable, kind, base_url, model in KEYED:
        if env.get(variable):
            return ProviderConfig(name=f"auto:{kind if not base_url else 'openrouter'}", kind=kind, model=model,
                                  base_url=base_url, api_key_env=variable)
    for port, server in ports:
        running = owners(port)
        if running is not None and not running:
            continue  # nothing listens there: no need to ask
        why = refusal(port, running, our_uid, configured)
        if why is not None:
            notes.append(why)
            continue
        base_url = f"http://{host}:{port}/v1"
        models = probe(base_url)
        if models is not None:
            return ProviderConfig(name=f"auto:{server}", kind="openai", model=models[0] if models else "default",
                                  base_url=base_url, sized=True, window_probed=True, timeout=LOCAL_TIMEOUT)
    return None


# -- which local servers auto may use ------------------------------------------------------------

AUTO_PORTS_ENV = "HERMES_SUP_AUTO_PORTS"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
# /proc/net/tcp{,6} addresses a connection to 127.0.0.1 reaches: 127.0.0.1 and 0.0.0.0; ::, ::1
# and ::ffff:127.0.0.1 (in the kernel's byte order, as the files spell them).
_REACHABLE = frozenset({"0100007F", "00000000", "00000000000000000000000000000000",
                        "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"})
_LISTEN = "0A"


def auto_ports(env: Mapping[str, str]) -> tuple[tuple[int, str], ...]:
    """The ports `auto` probes: LOCAL_PORTS, or those $HERMES_SUP_AUTO_PORTS lists (pure)."""
    raw = env.get(AUTO_PORTS_ENV)
    if raw is None:
        return LOCAL_PORTS
    names = dict(LOCAL_PORTS)
    ports = [int(part) for part in raw.replace(" ", "").split(",") if part.isdigit() and 0 < int(part) < 65536]
    return tuple((port, names.get(port, "local")) for port in ports)


def listeners(table: str, port: int) -> set[int]:
    """The uids owning the listening sockets of a /proc/net/tcp or tcp6 table that a connection to
    127.0.0.1:`port` may reach (pure)."""
    uids = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[3] != _LISTEN:
            continue
        address, _, hex_port = fields[1].rpartition(":")
        try:
            if int(hex_port, 16) == port and address.upper() in _REACHABLE:
                uids.add(int(fields[7]))
        except ValueError:
            continue
    return uids


def listening_owners(port: int) -> set[int] | None:
    """Who runs the server listening on 127.0.0.1:`port` (an empty set: nobody), or None where
    the kernel's socket tables cannot be read (not Linux)."""
    tables = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii", errors="replace") as handle:
                tables.append(handle.read())
        except OSError:
            continue
    if not tables:
        return None
    return set().union(*(listeners(table, port) for table in tables))


def refusal(port: int, owners: set[int] | None, our_uid: int, configured: Iterable[int]) -> str | None:
    """Why `auto` must not use the server listening on `port`, or None if it may: it runs as our
    own user, or hermes.yaml names it (pure)."""
    if port in set(configured) or owners == {our_uid}:
        return None
    if owners is None:
        who = "its owner cannot be looked up here (no /proc/net/tcp)"
    else:
        who = f"it runs as uid {', '.join(str(uid) for uid in sorted(owners))}, not as this user (uid {our_uid})"
    return (f"the server on port {port} was not used: {who}; name it in hermes.yaml (a provider with "
            f"base_url http://127.0.0.1:{port}/v1) to use it anyway")


def configured_ports(config: Mapping[str, Any]) -> frozenset[int]:
    """The local ports the providers of hermes.yaml name in their base_url (pure)."""
    ports = set()
    for provider in provider_configs(config).values():
        try:
            url = urllib.parse.urlsplit(provider.base_url or "")
            if url.hostname in LOOPBACK_HOSTS and url.port:
                ports.add(url.port)
        except ValueError:
            continue
    return frozenset(ports)


def describe(found: ProviderConfig | None, ports: tuple[tuple[int, str], ...] = LOCAL_PORTS) -> str:
    """What `auto` settled on, for the agent's log and doctor, without the key itself (pure)."""
    if found is None:
        probed = ", ".join(str(port) for port, _ in ports) or "none"
        return f"auto is offline: no API key, and no local server of this user on ports {probed}"
    where = f"key in ${found.api_key_env}" if found.api_key_env else f"server at {found.base_url}"
    if found.model == BUSY_MODEL and not found.api_key_env:
        # The probe's sign of a busy server (see probe_models): its model is learnt on a later look.
        return f"auto uses {found.name}, server at {found.base_url}: busy, {busy_hint(PROBE_DEADLINE)}"
    return f"auto uses {found.name}, model {found.model} ({where})"


def provider_configs(config: Mapping[str, Any]) -> dict[str, ProviderConfig]:
    """The named providers of hermes.yaml (`auto` is resolved separately, when needed; `offline` is
    no model at all: a tier of it serves only tasks with steps)."""
    out = {}
    for name, spec in (config.get("providers") or {}).items():
        if not isinstance(spec, Mapping) or spec.get("kind") in ("auto", "offline"):
            continue
        out[name] = ProviderConfig(
            name=name, kind=str(spec.get("kind", "openai")), model=str(spec.get("model", "")),
            base_url=spec.get("base_url"), api_key_env=spec.get("api_key_env"),
            timeout=float(spec.get("timeout", LOCAL_TIMEOUT if _local_openai(spec) else CLOUD_TIMEOUT)),
            max_tokens=int(spec.get("max_tokens", 4096)),
            sized=_sized(spec),
            context_window=int(spec.get("context_window", 200_000 if spec.get("kind") == "anthropic" else 128_000)),
            window_probed=spec.get("context_window") is None and _local_openai(spec),
            stream=bool(spec.get("stream", False)),
        )
    return out


def _sized(spec: Mapping[str, Any]) -> bool:
    """Whether a provider's max_tokens is sized from its server's context: a local OpenAI-compatible
    server (a base_url on this machine) whose max_tokens hermes.yaml leaves unset (pure)."""
    return spec.get("max_tokens") is None and _local_openai(spec)


def _local_openai(spec: Mapping[str, Any]) -> bool:
    """Whether a provider is an OpenAI-compatible server on this machine (pure): one that can be
    asked its context window (llama.cpp, llama-cpp-python, Ollama, vLLM)."""
    if spec.get("kind", "openai") != "openai":
        return False
    try:
        return urllib.parse.urlsplit(str(spec.get("base_url") or "")).hostname in LOOPBACK_HOSTS
    except ValueError:
        return False


def chain_for(tier: str, config: Mapping[str, Any], auto: Callable[[], ProviderConfig | None],
              env: Mapping[str, str]) -> list[ProviderConfig]:
    """The ordered providers of a tier, or of the agent's own chain (hermes.yaml's `providers:` of
    the agent, `chain` here) whatever the tier. Providers whose key is missing from the environment
    are left out (a local server needs none); `auto` stands for whatever `resolve_auto` finds."""
    tiers = config.get("tiers") or {}
    names = list(config.get("chain") or ()) or tiers.get(tier) or tiers.get("standard") or ["auto"]
    named = provider_configs(config)
    chain: list[ProviderConfig] = []
    for name in names:
        if name == "auto":
            found = auto()
            if found is not None:
                chain.append(found)
            continue
        provider = named.get(name)
        if provider is None:
            continue
        if provider.api_key_env and not env.get(provider.api_key_env):
            continue
        chain.append(provider)
    return chain


ESCALATION = ("cheap", "standard", "premium")
SHORT_TASK = 500  # characters of title and body


def task_tier(task: Mapping[str, Any], agent_tier: str) -> str:
    """A task's own tier, else its agent's. `auto` on both picks by the attempt: a short task starts
    on the cheap tier, a long one on standard, and each failed attempt escalates one tier."""
    for tier in (task.get("tier"), agent_tier):
        if tier and tier != "auto":
            return str(tier)
    size = len(str(task.get("title") or "")) + len(str(task.get("body") or ""))
    start = 0 if size <= SHORT_TASK else 1
    attempt = max(1, int(task.get("attempts") or 1))
    return ESCALATION[min(len(ESCALATION) - 1, start + attempt - 1)]
