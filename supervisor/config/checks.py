"""The checks of hermes.yaml's sections: each names the key and its line, through the `fail` it is given."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from ...agents.memory import limits_problem
from ...agents.spans import check_settings as telemetry_problem
from ...agents.taskdir import TASKS_DIR
from ...agents.tools import CAPABILITIES
from ...kanban.task import TIERS
from .runtimes import check_chain, check_runtime
from .schema import (
    AGENT,
    PRICE,
    PROVIDER,
    PROVIDER_KINDS,
    RESTART,
    SETTINGS,
    TOP,
    Field,
    check_keys,
    check_values,
    finite,
    near,
)

# One path component under runs/ that cannot be one of the supervisor's own files there
# (supervisor.json, supervisor.lock, notify.sock, skills.json, ...: they all hold a dot).
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# The key lists, from the schema (schema.py), for code that names them.
TOP_KEYS = TOP.names()
DEFAULT_KEYS = TOP.field("defaults").names()
RESTART_KEYS = RESTART.names()
PROVIDER_KEYS = PROVIDER.names()
AGENT_KEYS = AGENT.names()
METRICS_KEYS = TOP.field("metrics").names()

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
    check_keys(agent, AGENT, fail, unknown="unknown agent key")
    name = agent.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail(agent, "an agent needs a 'name'")
    if not AGENT_NAME.fullmatch(name):
        raise fail(agent, f"agent name {name!r} must be 1 to 64 letters, digits, '-' or '_', starting with a "
                          "letter or digit (it names the agent's folder under runs/)")
    if name == TASKS_DIR:
        raise fail(agent, f"agent name {name!r} is taken: runs/{TASKS_DIR}/ holds the tasks' working folders")
    check_settings(agent, f"agent {name}", fail, AGENT.fields)
    if agent.get("tier", "auto") not in TIERS:
        raise fail(agent, f"agent {name}: unknown tier {agent.get('tier')!r}{near(agent.get('tier'), TIERS)}; "
                          f"tiers are {', '.join(TIERS)}")
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


def check_prices(raw: dict[str, Any], fail: Any) -> None:
    """Dollars per million tokens: a NaN price would make every cost NaN, and a NaN cost never
    reaches a task's max_cost."""
    prices = raw.get("prices") or {}
    if not isinstance(prices, dict):
        raise fail(raw, "'prices' must be a mapping of model names to {input, output, cached}")
    for model, entry in prices.items():
        if model == "__line__":
            continue
        other = [key for key in entry if key not in (*PRICE.names(), "__line__")] if isinstance(entry, dict) else []
        if not isinstance(entry, dict) or other:
            said = f" (unknown key '{other[0]}'{near(other[0], PRICE.names())})" if other else ""
            raise fail(prices, f"price of {model}: must be a mapping with input, output and cached{said}")
        for key, value in entry.items():
            if key != "__line__" and (not finite(value) or value < 0):
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
        check_keys(spec, PROVIDER, fail, where=f"provider {name}")
        kind = spec.get("kind", "openai")
        if kind not in PROVIDER_KINDS:
            raise fail(spec, f"provider {name}: unknown kind {kind!r}{near(kind, PROVIDER_KINDS)}; kinds are "
                             f"{', '.join(PROVIDER_KINDS)}")
        if kind in ("openai", "anthropic") and (not isinstance(spec.get("model"), str) or not spec["model"]):
            raise fail(spec, f"provider {name}: kind {kind} needs a 'model'")
        check_values(spec, PROVIDER.fields, fail, where=f"provider {name}")
    check_tiers(raw, providers, fail)


def check_tiers(raw: dict[str, Any], providers: dict[str, Any], fail: Any) -> None:
    """`tiers`: each a chain of the names of providers that exist (`auto` and `offline` always do)."""
    tiers = raw.get("tiers") or {}
    if not isinstance(tiers, dict):
        raise fail(raw, "'tiers' must be a mapping of tier names to lists of providers")
    known = {*providers, "auto", "offline"} - {"__line__"}
    for tier, chain in tiers.items():
        if tier == "__line__":
            continue
        if tier not in TIERS[1:]:
            raise fail(tiers, f"unknown tier {tier!r}{near(tier, TIERS[1:])}; tiers are {', '.join(TIERS[1:])}")
        if not isinstance(chain, list) or not all(isinstance(item, str) for item in chain):
            said = BOOLEAN_WORD if isinstance(chain, list) and any(isinstance(i, bool) for i in chain) else ""
            raise fail(tiers, f"tier {tier}: must be a list of provider names{said}")
        for item in chain:
            if item not in known:
                raise fail(tiers, f"tier {tier}: no provider named {item!r}{near(item, tuple(sorted(known)))} "
                                  f"(providers: {', '.join(sorted(known))})")


# What a name YAML took for a boolean gets said: `tiers: {cheap: [off]}` is [false] to YAML.
BOOLEAN_WORD = (" (YAML reads an unquoted off, no, false, on, yes or true as true or false, not as a name: "
                "put such a name in quotes, 'off')")


def check_settings(node: dict[str, Any], where: str, fail: Any, fields: tuple[Field, ...] = SETTINGS) -> None:
    """The supervision settings of `defaults` or one agent (`fields`: the keys of one or the other): the
    schema checks the types and bounds, this what it cannot say (cross-checks, and messages of their own)."""
    check_values(node, fields, fail, where=where)
    terminal = node.get("terminal") or {}
    approve = terminal.get("approve", [])
    if not isinstance(approve, list) or not all(isinstance(rule, str) for rule in approve):
        raise fail(terminal, f"{where}: 'terminal.approve' must be a list of rule names")
    delegation = node.get("delegation") or {}
    if delegation.get("tier", "cheap") not in TIERS:
        raise fail(delegation, f"{where}: unknown delegation tier {delegation['tier']!r}; tiers are {', '.join(TIERS)}")
    memory = limits_problem(node.get("memory"))
    if memory:
        raise fail(node, f"{where}: {memory}")
    restart = node.get("restart") or {}
    if restart.get("policy", "always") not in RESTART.field("policy").choices:
        raise fail(restart, f"{where}: restart policy must be always, on-failure or never, got {restart['policy']!r}")
    backoff = restart.get("backoff") or {}
    if finite(backoff.get("initial")) and finite(backoff.get("max")) and backoff["initial"] > backoff["max"]:
        raise fail(backoff, f"{where}: 'backoff.initial' is larger than 'backoff.max'")


def check_observability(raw: Mapping[str, Any], fail: Callable[[Any, str], Exception]) -> None:
    """hermes.yaml's `telemetry:` collector address (agents/telemetry.py), after check_sections took
    its keys and types from the schema: that it is an http(s) URL."""
    section = raw.get("telemetry")
    wrong = telemetry_problem(section)
    if wrong is not None:
        raise fail(section if isinstance(section, dict) else raw, wrong)
