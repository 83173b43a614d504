"""The workspace: a directory holding hermes.yaml, found like git finds a repository, and its config.

Config errors name the file and line, because a person has to go and fix them.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hermes_sup.agents.budget import check_budgets
from hermes_sup.agents.memory import limits_problem
from hermes_sup.agents.offer import MODES as OFFER_MODES
from hermes_sup.agents.routespec import routing_error
from hermes_sup.agents.taskdir import TASKS_DIR
from hermes_sup.kanban import BoardError, BoardStore
from hermes_sup.kanban.backends import BoardConfigError, check_board_config, check_host, open_board
from hermes_sup.kanban.parse import PlainLoader

from ..agents.sandbox import MODES as SANDBOX_MODES
from .alerts import check_alerts
from .folders import check_folders
from .mcpconfig import check_mcp_servers
from .metrics import check_observability
from .runtimes import RUNTIME_KEYS, check_budgeted, check_chain, check_profiles, check_runtime
from .schedules import check_schedules

CONFIG_NAME = "hermes.yaml"
WORKSPACE_ENV = "HERMES_SUP_WORKSPACE"
# The example team and its tasks, shipped beside the code (the repository's examples/ folder).
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
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


MAX_CONFIG_BYTES = 1 << 20
MAX_NESTING = 32  # hermes.yaml needs about 6 levels; PyYAML's composer recurses once per level
MAX_COUNT = 64  # each agent is a Python process of its own: more than this is a typo, not a team
MAX_LOG_KEEP = 100  # the agent renames each kept file on every rotation
MAX_WHOLE = 10**9  # other whole numbers: far above any sane setting, and exact in JSON and floats
MAX_SECONDS = 86_400  # every duration in hermes.yaml
UP_TO_A_DAY = f" and at most {MAX_SECONDS:,}"
# One path component under runs/ that cannot be one of the supervisor's own files there
# (supervisor.json, supervisor.lock, notify.sock, skills.json, ...: they all hold a dot).
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _LineLoader(PlainLoader):
    """The board's plain-data YAML loader (no aliases, duplicate keys, dates, deep nesting), which also
    remembers the line of every mapping, for error messages."""

    source = "hermes.yaml"
    max_depth = MAX_NESTING

    def construct_plain_mapping(self, node: yaml.MappingNode) -> dict[Any, Any]:
        mapping = super().construct_plain_mapping(node)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _strip_lines(item) for key, item in value.items() if key != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(item) for item in value]
    return value


TOP_KEYS = ("providers", "tiers", "defaults", "agents", "prices", "board", "host", "schedules", "routing", "alerts",
            "budgets", "folders", "mcp_servers", "telemetry", "metrics")
DEFAULT_KEYS = ("restart", "stop_timeout", "heartbeat_timeout", "orphan_grace", "max_rss_mb", "log_max_mb",
                "log_keep", "max_iterations", "max_tokens", "max_cost", "terminal", "delegation", "memory",
                "offer_tools", "folders", "sandbox", "mcp_servers")
RESTART_KEYS = ("policy", "backoff", "max_restarts", "window", "reset_after")
CAPABILITIES = ("fs.read", "fs.write", "shell", "network", "memory", "delegate", "skills", "kanban")
TIERS = ("auto", "cheap", "standard", "premium")
PROVIDER_KINDS = ("openai", "anthropic", "auto", "offline")
PROVIDER_KEYS = ("kind", "model", "base_url", "api_key_env", "timeout", "max_tokens", "context_window", "stream")
AGENT_KEYS = ("name", "roles", "tier", "skills", "capabilities", "count", "provider", "env", "restart",
              "stop_timeout", "heartbeat_timeout", "orphan_grace", "max_rss_mb", "log_max_mb", "log_keep",
              "max_iterations", "max_tokens", "max_cost", "identity", "toolsets", "command", "terminal",
              "delegation", "memory", "offer_tools", "folders", "sandbox", "mcp_servers", *RUNTIME_KEYS)


def _parse_config(path: Path) -> dict[str, Any]:
    """hermes.yaml as plain data, each mapping with its `__line__`; ConfigError if it is no YAML mapping."""
    data = _read_regular(path, MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}:1: larger than {MAX_CONFIG_BYTES:,} bytes, the most hermes.yaml may hold")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x})") from None
    try:
        raw = yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except yaml.reader.ReaderError as exc:  # a control character: it carries a position, not a mark
        line = text[:exc.position].count("\n") + 1
        raise ConfigError(f"{path}:{line}: invalid YAML: character {exc.character:#06x} is not allowed "
                          "(write it as an escape in a double-quoted string)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    except (ValueError, RecursionError, OverflowError) as exc:  # an integer of 5,000 digits, say
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if raw is None:
        raw = {"__line__": 1}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1: the top level must be a mapping (providers, tiers, defaults, agents)")
    return raw


def _board_settings(raw: dict[str, Any], path: Path) -> tuple[dict[str, Any], str | None]:
    """The checked `board:` section and `host:` of a parsed hermes.yaml; ConfigError at their line."""
    section = raw.get("board")
    line = section.get("__line__", raw.get("__line__", 1)) if isinstance(section, dict) else raw.get("__line__", 1)
    try:
        return check_board_config(section), check_host(raw.get("host"))
    except BoardConfigError as exc:
        raise ConfigError(f"{path}:{line}: {exc}") from None


def board_settings(ws: Workspace) -> tuple[dict[str, Any], str | None]:
    """The board section and host of the workspace's hermes.yaml, for commands that need the board
    but not the team: a hermes.yaml whose team does not check out still names its board. One that
    is no YAML at all names none: the default file board, as before there was a `board:` section."""
    try:
        raw = _parse_config(ws.config_path)
    except ConfigError:
        return check_board_config(None), None
    return _board_settings(raw, ws.config_path)


def open_workspace_board(ws: Workspace, *, lock_timeout: float = 60.0) -> BoardStore:
    """The workspace's board through the one factory; a board section this installation cannot
    open, or a board on a network filesystem, is a ConfigError (exit 2), never a traceback."""
    section, host = board_settings(ws)
    try:
        return open_board(ws.root, section, lock_timeout=lock_timeout, host=host)
    except BoardConfigError as exc:
        raise ConfigError(f"{ws.config_path}: {exc}") from None
    except BoardError as exc:
        if "network filesystem" in str(exc):
            raise ConfigError(str(exc)) from None
        raise


def load_config(path: Path, *, skills: Callable[[], Collection[str]] | None = None) -> dict[str, Any]:
    """Read and check hermes.yaml; ConfigError names file:line of the first problem. `skills` gives
    the names of the skills present (default: discovered beside the file, never run)."""
    raw = _parse_config(path)

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
    _board_settings(raw, path)
    _check_providers(raw, fail)
    _check_prices(raw, fail)
    check_schedules(raw, fail)
    wrong = routing_error(raw.get("routing"))
    if wrong is not None:
        raise fail(raw.get("routing") if isinstance(raw.get("routing"), dict) else raw, wrong)
    check_alerts(raw, fail)
    check_budgets(raw, fail)
    check_observability(raw, fail)
    agents = raw.get("agents") or []
    if not isinstance(agents, list):
        raise fail(raw, "'agents' must be a list")
    if not agents:
        raise fail(raw, "no agents: 'agents' must list at least one (a name and its roles)")
    names: set[str] = set()
    for agent in agents:
        if not isinstance(agent, dict):
            raise fail(raw, "each entry of 'agents' must be a mapping with at least a name")
        _check_agent(agent, raw.get("providers"), fail)
        name, count = agent["name"], agent.get("count", 1)
        expanded = [name] if count == 1 else [f"{name}-{index}" for index in range(1, count + 1)]
        command = agent.get("command")
        if command and not _runnable(command[0], path.parent / "runs" / expanded[0], agent.get("env") or {}):
            raise fail(agent, f"agent {name}: command {command[0]!r} is not an executable file"
                              + ("" if "/" in command[0] else " on PATH"))
        for item in expanded:
            if item in names:
                raise fail(agent, f"agent name '{item}' is used twice")
            names.add(item)
    check_budgeted(raw, fail)
    _check_skills(agents, fail, skills or (lambda: skill_names(path.parent)))
    check_folders(raw, path.parent, fail)
    check_profiles(raw, path.parent, fail)
    check_mcp_servers(raw, fail)
    return _strip_lines(raw)


def _read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file. A FIFO in its place would block a reload forever
    and /dev/zero would never end, so the file is opened without blocking and checked first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: cannot be read: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(limit)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _runnable(program: str, workdir: Path, env: dict[str, Any]) -> bool:
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
    from hermes_sup.agents.skills import Skills  # only configs that name skills pay for the import

    return Skills(root).names()


# The toolsets the built-in tools belong to (agents/: each Tool's `toolset`); a skill's name is one too.
BUILTIN_TOOLSETS = ("files", "terminal", "memory", "board", "skills", "delegation", "kanban", "mcp")


def _check_skills(agents: list[Any], fail: Any, present: Callable[[], Collection[str]]) -> None:
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


def _check_agent(agent: dict[str, Any], raw_providers: Any, fail: Any) -> None:
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
    _check_settings(agent, f"agent {name}", fail)
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


def _check_prices(raw: dict[str, Any], fail: Any) -> None:
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


def _check_providers(raw: dict[str, Any], fail: Any) -> None:
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


def _check_settings(node: dict[str, Any], where: str, fail: Any) -> None:
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


EXAMPLE_NAMES = ("team", "research")


def scaffold(root: Path, example: bool | str = False) -> list[str]:
    """Create a workspace in `root`; keeps whatever is already there. Returns what it created.

    With `example` (True or "team"), hermes.yaml is the bundled planner/worker/reviewer team and its
    example tasks are dropped into kanban/inbox/, so the first `up` has work to show; with "research",
    the research team, its papers (two of them made into PDFs here) and report/ folder.
    """
    created = []
    root.mkdir(parents=True, exist_ok=True)
    source = EXAMPLES / "research" if example == "research" else EXAMPLES
    config = root / CONFIG_NAME
    if not config.exists():
        config.write_text((source / CONFIG_NAME).read_text() if example else EXAMPLE_CONFIG)
        created.append(CONFIG_NAME)
    if example == "research":
        created += _papers(root, source / "papers")
    for folder in [*(f"kanban/{name}" for name in BOARD_FOLDERS), "skills", "runs"]:
        path = root / folder
        if not path.is_dir():
            path.mkdir(parents=True)
            created.append(folder + "/")
    if example:
        for task in sorted(source.glob("*.json")):
            target = root / "kanban" / "inbox" / task.name
            if not target.exists():
                target.write_bytes(task.read_bytes())
                created.append(f"kanban/inbox/{task.name}")
    return created


def _papers(root: Path, source: Path) -> list[str]:
    """The research example's papers/ (a NAME.pdf.txt becomes the PDF NAME.pdf) and its report/."""
    from .pdfmake import pdf

    created = []
    for folder in ("papers", "report"):
        if not (root / folder).is_dir():
            (root / folder).mkdir()
            created.append(folder + "/")
    for paper in sorted(source.iterdir()):
        if paper.name.endswith(".pdf.txt"):
            target, data = root / "papers" / paper.name.removesuffix(".txt"), pdf(paper.read_text(), paper.stem)
        else:
            target, data = root / "papers" / paper.name, paper.read_bytes()
        if not target.exists():
            target.write_bytes(data)
            created.append(f"papers/{target.name}")
    return created


# -- who may read what ------------------------------------------------------------------------------
# The supervisor's and the agents' state (runs/): transcripts, tool and LLM-call logs, memory, agent
# logs and the control socket are the user's alone. Everything else (hermes.yaml, the board, skills)
# is readable by others as far as the umask allows, and never writable by them: under umask 000,
# anyone could otherwise rewrite hermes.yaml, whose agents' `command` runs as this user.
PRIVATE_UMASK = 0o077
SHARED_UMASK = 0o022  # the bits the command line always masks
GITIGNORE = "# API keys, and what the agents saw and did: never committed\n.env\nruns/\n"


def private_dir(path: Path) -> Path:
    """`path` as a directory of ours with mode 0700, whatever the umask or a previous occupant left
    (runs/ of a workspace made before it was private, or under a loose umask).

    Anything else at that name (a file, a symlink, another user's folder planted in a writable
    runs/) is moved aside rather than trusted."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()):
        os.rename(path, path.with_name(f"{path.name}.suspect-{time.time_ns()}"))
        info = None
    if info is None:
        os.mkdir(path, 0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path


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
