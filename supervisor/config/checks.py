"""The checks of hermes.yaml's sections: each names the key and its line, through the `fail` it is given."""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from ...agents.memory import limits_problem
from ...agents.offer import MODES as OFFER_MODES
from ...agents.sandbox import MODES as SANDBOX_MODES
from ...agents.spans import check_settings as telemetry_problem
from ...agents.taskdir import TASKS_DIR
from ...agents.tools import CAPABILITIES
from ...kanban.task import TIERS
from .runtimes import RUNTIME_KEYS, check_chain, check_runtime

MAX_COUNT = 64  # each agent is a Python process of its own: more than this is a typo, not a team
MAX_LOG_KEEP = 100  # the agent renames each kept file on every rotation
MAX_WHOLE = 10**9  # other whole numbers: far above any sane setting, and exact in JSON and floats
MAX_SECONDS = 86_400  # every duration in hermes.yaml
UP_TO_A_DAY = f" and at most {MAX_SECONDS:,}"
# One path component under runs/ that cannot be one of the supervisor's own files there
# (supervisor.json, supervisor.lock, notify.sock, skills.json, ...: they all hold a dot).
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


TOP_KEYS = ("providers", "tiers", "defaults", "agents", "prices", "board", "host", "schedules", "routing", "alerts",
            "budgets", "folders", "mcp_servers", "telemetry", "metrics")
DEFAULT_KEYS = ("restart", "stop_timeout", "heartbeat_timeout", "orphan_grace", "max_rss_mb", "log_max_mb",
                "log_keep", "max_iterations", "max_tokens", "max_cost", "terminal", "delegation", "memory",
                "offer_tools", "folders", "sandbox", "mcp_servers")
RESTART_KEYS = ("policy", "backoff", "max_restarts", "window", "reset_after")

PROVIDER_KINDS = ("openai", "anthropic", "auto", "offline")
PROVIDER_KEYS = ("kind", "model", "base_url", "api_key_env", "timeout", "max_tokens", "context_window", "stream")
AGENT_KEYS = ("name", "roles", "tier", "skills", "capabilities", "count", "provider", "env", "restart",
              "stop_timeout", "heartbeat_timeout", "orphan_grace", "max_rss_mb", "log_max_mb", "log_keep",
              "max_iterations", "max_tokens", "max_cost", "identity", "toolsets", "command", "terminal",
              "delegation", "memory", "offer_tools", "folders", "sandbox", "mcp_servers", *RUNTIME_KEYS)


def runnable(program: str, workdir: Path, env: dict[str, Any]) -> bool:
    """Whether the supervisor can start `program` for an agent whose working directory is
    `workdir` (the way Popen looks it up: a path from there, else a name on the agent's PATH).
    Found now, not when a reload is half done."""
    if "/" in program:
        # Lexically: the working directory is only made when the agent starts.
        candidate = Path(os.path.normpath(program if os.path.isabs(program) else workdir / program))
        return candidate.is_file() and os.access(candidate, os.X_OK)
    return shutil.which(program, path=str(env.get("PATH") or os.environ.get("PATH", os.defpath))) is not None


def skill_names(root: Path) -> set[str]:
    """The skills present in the workspace's skills/ and the bundled ones, found by name only:
    nothing is imported or run."""
    from ...agents.skills import Skills  # only configs that name skills pay for the import

    return Skills(root).names()


# The toolsets the built-in tools belong to (agents/: each Tool's `toolset`); a skill's name is one too.
BUILTIN_TOOLSETS = ("files", "terminal", "memory", "board", "skills", "delegation", "kanban", "mcp")


def check_skills(agents: list[Any], fail: Any, present: Callable[[], Collection[str]]) -> None:
    """Every skill an agent's `skills` or `toolsets` names exists: a typo is found at `up`, not
    when a task fails for want of a tool."""
    wanted = [(agent, key, item) for agent in agents for key in ("skills", "toolsets")
              for item in agent.get(key) or ()]
    if not wanted:
        return
    try:
        known = set(present())
    except OSError as exc:
        raise fail(wanted[0][0], f"the skills cannot be listed: {exc}") from None
    for agent, key, item in wanted:
        if item in known or (key == "toolsets" and item in BUILTIN_TOOLSETS):
            continue
        choices = sorted(known) if key == "skills" else [*BUILTIN_TOOLSETS, *sorted(known)]
        what = "no skill" if key == "skills" else "no toolset or skill"
        raise fail(agent, f"agent {agent['name']}: {key}: {what} named {item!r} "
                          f"({key} known here: {', '.join(choices) or 'none'})")


def check_agent(agent: dict[str, Any], raw_providers: Any, fail: Any) -> None:
    """The keys, types and ranges of one entry of `agents` (its `providers` among hermes.yaml's)."""
    for key in agent:
        if key != "__line__" and key not in AGENT_KEYS:
            raise fail(agent, f"unknown agent key '{key}'; expected one of {', '.join(AGENT_KEYS)}")
    name = agent.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail(agent, "an agent needs a 'name'")
    if not AGENT_NAME.fullmatch(name):
        raise fail(agent, f"agent name {name!r} must be 1 to 64 letters, digits, '-' or '_', starting with a "
                          "letter or digit (it names the agent's folder under runs/)")
    if name == TASKS_DIR:
        raise fail(agent, f"agent name {name!r} is taken: runs/{TASKS_DIR}/ holds the tasks' working folders")
    count = agent.get("count", 1)
    if not _whole(count, 1, MAX_COUNT):
        raise fail(agent, f"agent {name}: 'count' must be a whole number from 1 to {MAX_COUNT}, got {count!r}")
    for key in ("roles", "skills", "toolsets"):
        value = agent.get(key, [])
        if value is None and key == "toolsets":
            continue
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise fail(agent, f"agent {name}: '{key}' must be a list of names")
    check_settings(agent, f"agent {name}", fail)
    if agent.get("tier", "auto") not in TIERS:
        raise fail(agent, f"agent {name}: unknown tier {agent.get('tier')!r}; tiers are {', '.join(TIERS)}")
    capabilities = agent.get("capabilities", [])
    if not isinstance(capabilities, list) or any(c not in CAPABILITIES for c in capabilities):
        raise fail(agent, f"agent {name}: 'capabilities' must be a list drawn from {', '.join(CAPABILITIES)}")
    env = agent.get("env", {})
    if not isinstance(env, dict) or any(
            not isinstance(k, str) or not ENV_NAME.fullmatch(k) or isinstance(v, (dict, list))
            or "\0" in str(v) for k, v in env.items() if k != "__line__"):
        raise fail(agent, f"agent {name}: 'env' must be a mapping of variable names (letters, digits, '_') "
                          "to values without NUL")
    check_runtime(agent, f"agent {name}", fail)
    check_chain(agent, raw_providers, f"agent {name}", fail)
    command = agent.get("command")
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(part, str) and part and "\0" not in part
                                           for part in command)):
        raise fail(agent, f"agent {name}: 'command' must be a non-empty list of non-empty strings")
    identity = agent.get("identity")
    if identity is not None and not isinstance(identity, str):
        raise fail(agent, f"agent {name}: 'identity' must be text")


def _number(value: Any) -> bool:
    """A finite int or float: NaN compares false with everything, so no range check would catch it,
    and an int too large for a float would raise where the specs are built."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _seconds(value: Any, *, zero: bool = False) -> bool:
    """A duration: finite, > 0 (>= 0 with `zero`), and at most a day, since `down` and the
    supervisor's deadlines wait that long: a year-long stop_timeout is a hang, not a setting."""
    return _number(value) and (value >= 0 if zero else value > 0) and value <= MAX_SECONDS


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_prices(raw: dict[str, Any], fail: Any) -> None:
    """Dollars per million tokens: a NaN price would make every cost NaN, and a NaN cost never
    reaches a task's max_cost."""
    prices = raw.get("prices") or {}
    if not isinstance(prices, dict):
        raise fail(raw, "'prices' must be a mapping of model names to {input, output, cached}")
    for model, entry in prices.items():
        if model == "__line__":
            continue
        if not isinstance(entry, dict) or any(k not in ("input", "output", "cached", "__line__") for k in entry):
            raise fail(prices, f"price of {model}: must be a mapping with input, output and cached")
        for key, value in entry.items():
            if key != "__line__" and (not _number(value) or value < 0):
                raise fail(entry, f"price of {model}: '{key}' must be a number of dollars >= 0, got {value!r}")


def check_providers(raw: dict[str, Any], fail: Any) -> None:
    """The named providers, and tiers that name only providers that exist."""
    providers = raw.get("providers") or {}
    if not isinstance(providers, dict):
        raise fail(raw, "'providers' must be a mapping of names to providers")
    for name, spec in providers.items():
        if name == "__line__":
            continue
        if isinstance(name, bool):
            raise fail(providers, f"a provider's name is {str(name).lower()}{BOOLEAN_WORD}")
        if not isinstance(spec, dict):
            raise fail(providers, f"provider {name}: must be a mapping with a 'kind'")
        if "api_key" in spec:
            raise fail(spec, f"provider {name}: keys are not written in hermes.yaml; name the environment "
                             "variable that holds it with 'api_key_env'")
        for key in spec:
            if key != "__line__" and key not in PROVIDER_KEYS:
                raise fail(spec, f"provider {name}: unknown key '{key}'; expected one of {', '.join(PROVIDER_KEYS)}")
        kind = spec.get("kind", "openai")
        if kind not in PROVIDER_KINDS:
            raise fail(spec, f"provider {name}: unknown kind {kind!r}; kinds are {', '.join(PROVIDER_KINDS)}")
        if kind in ("openai", "anthropic") and (not isinstance(spec.get("model"), str) or not spec["model"]):
            raise fail(spec, f"provider {name}: kind {kind} needs a 'model'")
        if "timeout" in spec and not _seconds(spec["timeout"]):
            raise fail(spec, f"provider {name}: 'timeout' must be a number of seconds > 0{UP_TO_A_DAY}, "
                             f"got {spec['timeout']!r}")
        for key in ("max_tokens", "context_window"):
            if key in spec and not _whole(spec[key], 1, MAX_WHOLE):
                raise fail(spec, f"provider {name}: '{key}' must be a whole number from 1 to {MAX_WHOLE:,}, "
                                 f"got {spec[key]!r}")
        for key in ("model", "base_url", "api_key_env"):
            if spec.get(key) is not None and not isinstance(spec[key], str):
                raise fail(spec, f"provider {name}: '{key}' must be text, got {spec[key]!r}")
        if "stream" in spec and not isinstance(spec["stream"], bool):
            raise fail(spec, f"provider {name}: 'stream' must be true or false, got {spec['stream']!r}")
    tiers = raw.get("tiers") or {}
    if not isinstance(tiers, dict):
        raise fail(raw, "'tiers' must be a mapping of tier names to lists of providers")
    known = {*providers, "auto", "offline"} - {"__line__"}
    for tier, chain in tiers.items():
        if tier == "__line__":
            continue
        if tier not in TIERS[1:]:
            raise fail(tiers, f"unknown tier {tier!r}; tiers are {', '.join(TIERS[1:])}")
        if not isinstance(chain, list) or not all(isinstance(item, str) for item in chain):
            said = BOOLEAN_WORD if isinstance(chain, list) and any(isinstance(i, bool) for i in chain) else ""
            raise fail(tiers, f"tier {tier}: must be a list of provider names{said}")
        for item in chain:
            if item not in known:
                raise fail(tiers, f"tier {tier}: no provider named {item!r} (providers: {', '.join(sorted(known))})")


# What a name YAML took for a boolean gets said: `tiers: {cheap: [off]}` is [false] to YAML.
BOOLEAN_WORD = (" (YAML reads an unquoted off, no, false, on, yes or true as true or false, not as a name: "
                "put such a name in quotes, 'off')")


def _check_tools(node: dict[str, Any], where: str, fail: Any) -> None:
    """`terminal` and `delegation` of `defaults` or one agent: the agent converts these with int()
    and float() when it starts, so a wrong type here would be a crash loop there."""
    for key, fields in (("terminal", ("timeout", "approve")),
                        ("delegation", ("tier", "max_depth", "max_concurrent", "timeout"))):
        value = node.get(key)
        if value is not None and (not isinstance(value, dict)
                                  or any(k not in (*fields, "__line__") for k in value)):
            raise fail(node, f"{where}: '{key}' must be a mapping with {', '.join(fields)}")
        value = value or {}
        if "timeout" in value and not _seconds(value["timeout"]):
            raise fail(value, f"{where}: '{key}.timeout' must be a number of seconds > 0{UP_TO_A_DAY}, "
                              f"got {value['timeout']!r}")
    if node.get("offer_tools", "task") not in OFFER_MODES:
        raise fail(node, f"{where}: 'offer_tools' must be one of {', '.join(OFFER_MODES)} (task: the tools the "
                         f"task calls for; all: every tool), got {node['offer_tools']!r}")
    if node.get("sandbox", "auto") not in SANDBOX_MODES:
        raise fail(node, f"{where}: 'sandbox' must be one of {', '.join(SANDBOX_MODES)} (auto: bubblewrap, else "
                         f"Landlock; none: commands run with the agent's full rights), got {node['sandbox']!r}")
    terminal = node.get("terminal") or {}
    approve = terminal.get("approve", [])
    if not isinstance(approve, list) or not all(isinstance(rule, str) for rule in approve):
        raise fail(terminal, f"{where}: 'terminal.approve' must be a list of rule names")
    delegation = node.get("delegation") or {}
    if delegation.get("tier", "cheap") not in TIERS:
        raise fail(delegation, f"{where}: unknown delegation tier {delegation['tier']!r}; tiers are {', '.join(TIERS)}")
    for key, low, high in (("max_depth", 0, 10), ("max_concurrent", 1, MAX_COUNT)):
        if key in delegation and not _whole(delegation[key], low, high):
            raise fail(delegation, f"{where}: 'delegation.{key}' must be a whole number from {low} to {high}, "
                                   f"got {delegation[key]!r}")


def check_settings(node: dict[str, Any], where: str, fail: Any) -> None:
    """Types and ranges of the supervision settings, in `defaults` or one agent."""
    for key in ("stop_timeout", "heartbeat_timeout"):
        if key in node and not _seconds(node[key]):
            raise fail(node, f"{where}: '{key}' must be a number of seconds > 0{UP_TO_A_DAY}, got {node[key]!r}")
    if "orphan_grace" in node and not _seconds(node["orphan_grace"], zero=True):
        raise fail(node, f"{where}: 'orphan_grace' must be a number of seconds >= 0{UP_TO_A_DAY}, "
                         f"got {node['orphan_grace']!r}")
    if "max_rss_mb" in node and node["max_rss_mb"] is not None and (
            not _number(node["max_rss_mb"]) or node["max_rss_mb"] <= 0):
        raise fail(node, f"{where}: 'max_rss_mb' must be a number > 0 or null, got {node['max_rss_mb']!r}")
    if "log_max_mb" in node and (not _number(node["log_max_mb"]) or node["log_max_mb"] <= 0):
        raise fail(node, f"{where}: 'log_max_mb' must be a number > 0, got {node['log_max_mb']!r}")
    if "log_keep" in node and not _whole(node["log_keep"], 0, MAX_LOG_KEEP):
        raise fail(node, f"{where}: 'log_keep' must be a whole number from 0 to {MAX_LOG_KEEP}, "
                         f"got {node['log_keep']!r}")
    for key, kind in (("max_iterations", "whole number"), ("max_tokens", "whole number"), ("max_cost", "number")):
        value = node.get(key)
        if value is None:
            continue
        if (kind == "whole number" and not _whole(value, 1, MAX_WHOLE)) or not _number(value) or value <= 0:
            limit = f" up to {MAX_WHOLE:,}" if kind == "whole number" else ""
            raise fail(node, f"{where}: '{key}' must be a {kind} > 0{limit} (or absent), got {value!r}")
    _check_tools(node, where, fail)
    memory = limits_problem(node.get("memory"))
    if memory:
        raise fail(node, f"{where}: {memory}")
    restart = node.get("restart")
    if restart is None:
        return
    if not isinstance(restart, dict):
        raise fail(node, f"{where}: 'restart' must be a mapping ({', '.join(RESTART_KEYS)})")
    for key in restart:
        if key != "__line__" and key not in RESTART_KEYS:
            raise fail(restart, f"{where}: unknown key 'restart.{key}'; expected one of {', '.join(RESTART_KEYS)}")
    if "policy" in restart and restart["policy"] not in ("always", "on-failure", "never"):
        raise fail(restart, f"{where}: restart policy must be always, on-failure or never, got {restart['policy']!r}")
    if "max_restarts" in restart and not _whole(restart["max_restarts"], 0, MAX_WHOLE):
        raise fail(restart, f"{where}: 'max_restarts' must be a whole number from 0 to {MAX_WHOLE:,}")
    for key in ("window", "reset_after"):
        if key in restart and not _seconds(restart[key]):
            raise fail(restart, f"{where}: 'restart.{key}' must be a number of seconds > 0{UP_TO_A_DAY}")
    backoff = restart.get("backoff")
    if backoff is not None:
        if not isinstance(backoff, dict) or any(k not in ("initial", "max", "__line__") for k in backoff):
            raise fail(restart, f"{where}: 'restart.backoff' must be a mapping with 'initial' and 'max'")
        for key in ("initial", "max"):
            if key in backoff and not _seconds(backoff[key], zero=True):
                raise fail(backoff, f"{where}: 'backoff.{key}' must be a number of seconds >= 0{UP_TO_A_DAY}")
        if _number(backoff.get("initial")) and _number(backoff.get("max")) and backoff["initial"] > backoff["max"]:
            raise fail(backoff, f"{where}: 'backoff.initial' is larger than 'backoff.max'")


METRICS_KEYS = ("port", "host")


def check_observability(raw: Mapping[str, Any], fail: Callable[[Any, str], Exception]) -> None:
    """hermes.yaml's `telemetry:` (agents/telemetry.py) and `metrics:` (dashboard/metrics.py) sections."""
    section = raw.get("telemetry")
    wrong = telemetry_problem(section)
    if wrong is not None:
        raise fail(section if isinstance(section, dict) else raw, wrong)
    metrics = raw.get("metrics")
    if metrics is None:
        return
    if not isinstance(metrics, dict):
        raise fail(raw, "'metrics' must be a mapping (port, host)")
    for key in metrics:
        if key != "__line__" and key not in METRICS_KEYS:
            raise fail(metrics, f"unknown key 'metrics.{key}'; expected one of {', '.join(METRICS_KEYS)}")
    port = metrics.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise fail(metrics, "'metrics.port' must be a port number (0 to 65535)")
    if "host" in metrics and not isinstance(metrics["host"], str):
        raise fail(metrics, "'metrics.host' must be an address to listen on")
