"""The workspace: a directory holding hermes.yaml, found like git finds a repository, and its config.

Config errors name the file and line, because a person has to go and fix them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CONFIG_NAME = "hermes.yaml"
WORKSPACE_ENV = "HERMES_SUP_WORKSPACE"
BOARD_FOLDERS = ("inbox", "todo", "doing", "blocked", "done", "failed", "cancelled", "rejected")

EXAMPLE_CONFIG = """\
# A hermes-sup team. `hermes-sup up` in this folder runs it.
# With no API key and no local model server, the `auto` provider falls back to `offline`:
# tasks that carry `steps` still run, the others wait in todo until a provider is available.
providers:
  cloud: {kind: anthropic, model: claude-sonnet-4-5, api_key_env: ANTHROPIC_API_KEY}
  local: {kind: openai, base_url: "http://127.0.0.1:11434/v1", model: llama3.1}
tiers:
  cheap: [auto]
  standard: [auto]
  premium: [auto]
defaults:
  restart: {policy: on-failure, backoff: {initial: 0.5, max: 30}, max_restarts: 5, window: 60}
  stop_timeout: 10
  heartbeat_timeout: 60
  orphan_grace: 30
  max_rss_mb: 1024
agents:
  - name: worker
    roles: [work]
    tier: cheap
    count: 2
"""


class ConfigError(Exception):
    """hermes.yaml cannot be used; the message starts with file:line."""


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def board_path(self) -> Path:
        return self.root / "kanban"

    @property
    def runs_path(self) -> Path:
        return self.root / "runs"

    @property
    def skills_path(self) -> Path:
        return self.root / "skills"


def find_workspace(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Workspace:
    """-w/--workspace, else $HERMES_SUP_WORKSPACE, else the current directory upward."""
    chosen = explicit or os.environ.get(WORKSPACE_ENV)
    if chosen:
        root = Path(chosen).expanduser().absolute()
        if not (root / CONFIG_NAME).is_file():
            raise ConfigError(f"{root}: not a workspace (no {CONFIG_NAME}); create one with `hermes-sup init {root}`")
        return Workspace(root)
    start = (cwd or Path.cwd()).absolute()
    for folder in (start, *start.parents):
        if (folder / CONFIG_NAME).is_file():
            return Workspace(folder)
    raise ConfigError(
        f"{start}: no {CONFIG_NAME} here or in any parent folder; run `hermes-sup init` to create a workspace, "
        f"or name one with -w DIR or ${WORKSPACE_ENV}"
    )


class _LineLoader(yaml.SafeLoader):
    """A SafeLoader that remembers the line of every mapping, for error messages."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _strip_lines(item) for key, item in value.items() if key != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(item) for item in value]
    return value


TOP_KEYS = ("providers", "tiers", "defaults", "agents", "prices", "board")
DEFAULT_KEYS = ("restart", "stop_timeout", "heartbeat_timeout", "orphan_grace", "max_rss_mb", "log_max_mb",
                "log_keep", "max_iterations", "max_tokens", "max_cost", "terminal", "delegation")
RESTART_KEYS = ("policy", "backoff", "max_restarts", "window", "reset_after")
CAPABILITIES = ("fs.read", "fs.write", "shell", "network", "memory", "delegate", "skills", "kanban")
TIERS = ("auto", "cheap", "standard", "premium")
PROVIDER_KINDS = ("openai", "anthropic", "auto", "offline")
PROVIDER_KEYS = ("kind", "model", "base_url", "api_key_env", "timeout", "max_tokens", "context_window", "stream")
AGENT_KEYS = ("name", "roles", "tier", "skills", "capabilities", "count", "provider", "env", "restart",
              "stop_timeout", "heartbeat_timeout", "orphan_grace", "max_rss_mb", "log_max_mb", "log_keep",
              "max_iterations", "max_tokens", "max_cost", "identity", "toolsets", "command", "terminal",
              "delegation")


def load_config(path: Path) -> dict[str, Any]:
    """Read and check hermes.yaml; ConfigError names file:line of the first problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    try:
        raw = yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    if raw is None:
        raw = {"__line__": 1}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1: the top level must be a mapping (providers, tiers, defaults, agents)")

    def fail(node: Any, message: str) -> ConfigError:
        line = node.get("__line__", 1) if isinstance(node, dict) else 1
        return ConfigError(f"{path}:{line}: {message}")

    for key in raw:
        if key != "__line__" and key not in TOP_KEYS:
            raise fail(raw, f"unknown key '{key}'; expected one of {', '.join(TOP_KEYS)}")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise fail(raw, "'defaults' must be a mapping")
    for key in defaults:
        if key != "__line__" and key not in DEFAULT_KEYS:
            raise fail(defaults, f"unknown key 'defaults.{key}'; expected one of {', '.join(DEFAULT_KEYS)}")
    _check_settings(defaults, "defaults", fail)
    _check_providers(raw, fail)
    agents = raw.get("agents") or []
    if not isinstance(agents, list):
        raise fail(raw, "'agents' must be a list")
    names: set[str] = set()
    for agent in agents:
        if not isinstance(agent, dict):
            raise fail(raw, "each entry of 'agents' must be a mapping with at least a name")
        for key in agent:
            if key != "__line__" and key not in AGENT_KEYS:
                raise fail(agent, f"unknown agent key '{key}'; expected one of {', '.join(AGENT_KEYS)}")
        name = agent.get("name")
        if not isinstance(name, str) or not name.strip():
            raise fail(agent, "an agent needs a 'name'")
        count = agent.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise fail(agent, f"agent {name}: 'count' must be a whole number >= 1")
        roles = agent.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(role, str) for role in roles):
            raise fail(agent, f"agent {name}: 'roles' must be a list of names")
        _check_settings(agent, f"agent {name}", fail)
        if agent.get("tier", "auto") not in TIERS:
            raise fail(agent, f"agent {name}: unknown tier {agent.get('tier')!r}; tiers are {', '.join(TIERS)}")
        capabilities = agent.get("capabilities", [])
        if not isinstance(capabilities, list) or any(c not in CAPABILITIES for c in capabilities):
            raise fail(agent, f"agent {name}: 'capabilities' must be a list drawn from {', '.join(CAPABILITIES)}")
        env = agent.get("env", {})
        if not isinstance(env, dict) or any(isinstance(v, (dict, list)) for k, v in env.items() if k != "__line__"):
            raise fail(agent, f"agent {name}: 'env' must be a mapping of names to values")
        command = agent.get("command")
        if command is not None and (not isinstance(command, list) or not command
                                    or not all(isinstance(part, str) for part in command)):
            raise fail(agent, f"agent {name}: 'command' must be a non-empty list of strings")
        expanded = [name] if count == 1 else [f"{name}-{index}" for index in range(1, count + 1)]
        for item in expanded:
            if item in names:
                raise fail(agent, f"agent name '{item}' is used twice")
            names.add(item)
    return _strip_lines(raw)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_providers(raw: dict[str, Any], fail: Any) -> None:
    """The named providers, and tiers that name only providers that exist."""
    providers = raw.get("providers") or {}
    if not isinstance(providers, dict):
        raise fail(raw, "'providers' must be a mapping of names to providers")
    for name, spec in providers.items():
        if name == "__line__":
            continue
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
        if "timeout" in spec and (not _number(spec["timeout"]) or spec["timeout"] <= 0):
            raise fail(spec, f"provider {name}: 'timeout' must be a number of seconds > 0, got {spec['timeout']!r}")
        for key in ("max_tokens", "context_window"):
            if key in spec and (not isinstance(spec[key], int) or isinstance(spec[key], bool) or spec[key] <= 0):
                raise fail(spec, f"provider {name}: '{key}' must be a whole number > 0, got {spec[key]!r}")
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
            raise fail(tiers, f"tier {tier}: must be a list of provider names")
        for item in chain:
            if item not in known:
                raise fail(tiers, f"tier {tier}: no provider named {item!r} (providers: {', '.join(sorted(known))})")


def _check_settings(node: dict[str, Any], where: str, fail: Any) -> None:
    """Types and ranges of the supervision settings, in `defaults` or one agent."""
    for key in ("stop_timeout", "heartbeat_timeout"):
        if key in node and (not _number(node[key]) or node[key] <= 0):
            raise fail(node, f"{where}: '{key}' must be a number of seconds > 0, got {node[key]!r}")
    if "orphan_grace" in node and (not _number(node["orphan_grace"]) or node["orphan_grace"] < 0):
        raise fail(node, f"{where}: 'orphan_grace' must be a number of seconds >= 0, got {node['orphan_grace']!r}")
    if "max_rss_mb" in node and node["max_rss_mb"] is not None and (
            not _number(node["max_rss_mb"]) or node["max_rss_mb"] <= 0):
        raise fail(node, f"{where}: 'max_rss_mb' must be a number > 0 or null, got {node['max_rss_mb']!r}")
    if "log_max_mb" in node and (not _number(node["log_max_mb"]) or node["log_max_mb"] <= 0):
        raise fail(node, f"{where}: 'log_max_mb' must be a number > 0, got {node['log_max_mb']!r}")
    if "log_keep" in node and (not isinstance(node["log_keep"], int) or isinstance(node["log_keep"], bool)
                               or node["log_keep"] < 0):
        raise fail(node, f"{where}: 'log_keep' must be a whole number >= 0, got {node['log_keep']!r}")
    for key, kind in (("max_iterations", "whole number"), ("max_tokens", "whole number"), ("max_cost", "number")):
        value = node.get(key)
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if (kind == "whole number" and not whole) or not _number(value) or value <= 0:
            raise fail(node, f"{where}: '{key}' must be a {kind} > 0 (or absent), got {value!r}")
    for key, fields in (("terminal", ("timeout", "approve")),
                        ("delegation", ("tier", "max_depth", "max_concurrent", "timeout"))):
        value = node.get(key)
        if value is not None and (not isinstance(value, dict)
                                  or any(k not in (*fields, "__line__") for k in value)):
            raise fail(node, f"{where}: '{key}' must be a mapping with {', '.join(fields)}")
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
    if "max_restarts" in restart and (not isinstance(restart["max_restarts"], int)
                                      or isinstance(restart["max_restarts"], bool) or restart["max_restarts"] < 0):
        raise fail(restart, f"{where}: 'max_restarts' must be a whole number >= 0")
    for key in ("window", "reset_after"):
        if key in restart and (not _number(restart[key]) or restart[key] <= 0):
            raise fail(restart, f"{where}: 'restart.{key}' must be a number of seconds > 0")
    backoff = restart.get("backoff")
    if backoff is not None:
        if not isinstance(backoff, dict) or any(k not in ("initial", "max", "__line__") for k in backoff):
            raise fail(restart, f"{where}: 'restart.backoff' must be a mapping with 'initial' and 'max'")
        for key in ("initial", "max"):
            if key in backoff and (not _number(backoff[key]) or backoff[key] < 0):
                raise fail(backoff, f"{where}: 'backoff.{key}' must be a number of seconds >= 0")
        if _number(backoff.get("initial")) and _number(backoff.get("max")) and backoff["initial"] > backoff["max"]:
            raise fail(backoff, f"{where}: 'backoff.initial' is larger than 'backoff.max'")


def scaffold(root: Path) -> list[str]:
    """Create a workspace in `root`; keeps whatever is already there. Returns what it created."""
    created = []
    root.mkdir(parents=True, exist_ok=True)
    config = root / CONFIG_NAME
    if not config.exists():
        config.write_text(EXAMPLE_CONFIG)
        created.append(CONFIG_NAME)
    for folder in [*(f"kanban/{name}" for name in BOARD_FOLDERS), "skills", "runs"]:
        path = root / folder
        if not path.is_dir():
            path.mkdir(parents=True)
            created.append(folder + "/")
    return created


# -- who may read what ------------------------------------------------------------------------------
# The supervisor's and the agents' state (runs/): transcripts, tool and LLM-call logs, memory, agent
# logs and the control socket are the user's alone. Everything else (hermes.yaml, the board, skills)
# is readable by others as far as the umask allows, and never writable by them: under umask 000,
# anyone could otherwise rewrite hermes.yaml, whose agents' `command` runs as this user.
PRIVATE_UMASK = 0o077
SHARED_UMASK = 0o022  # the bits the command line always masks
GITIGNORE = "# API keys, and what the agents saw and did: never committed\n.env\nruns/\n"


def private_dir(path: Path) -> None:
    """Create `path` as 0700, or narrow an existing one to its owner (a workspace made before
    runs/ was private, or under a loose umask)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o7777
    if mode & 0o077:
        path.chmod(mode & 0o7700)


def keep_out_of_git(root: Path) -> list[str]:
    """Write a .gitignore that keeps .env and runs/ out of git, unless the workspace has one: a
    workspace kept in git must not publish its keys or transcripts. Returns what it created."""
    try:
        fd = os.open(root / ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return []
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(GITIGNORE)
    return [".gitignore"]
